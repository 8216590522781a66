#!/usr/bin/env python3
"""A model server for the run-cycle tests, run by the environment's own interpreter: it
imports `toypkg` from that environment and "initialises the model" at start — so what the
environment holds decides whether it comes up. /health and /v1/models like `vllm serve`;
/v1/models reports the toypkg version it runs, so tests can tell old from new.

    toy_model_server.py --port N [--model NAME]

HTTP/1.0 on `socketserver` (one answer per connection, as http.server's default): the suite
starts this server a few hundred times, and http.server's and argparse's imports were half of
each start's CPU."""

from __future__ import annotations

import json
import os
import signal
import socketserver
import sys

USAGE = "usage: toy_model_server.py --port N [--model NAME]"
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def parse(argv: list[str]) -> tuple[int, str]:
    opts = {"--port": "", "--model": "toy/model"}
    it = iter(argv)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name not in opts:
            sys.exit(f"{USAGE}\nunknown argument: {arg}")
        opts[name] = value if eq else next(it, "")
    if not opts["--port"].isdigit():
        sys.exit(f"{USAGE}\n--port needs a number")
    return int(opts["--port"]), opts["--model"]


def main() -> int:
    port, model = parse(sys.argv[1:])
    import toypkg
    import toypkg.core

    print(f"(APIServer pid={os.getpid()}) INFO loading model {model} with toypkg {toypkg.__version__}",
          flush=True)
    toypkg.core.load_model()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request = self.rfile.readline(65537).decode("latin-1").split()
            while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass  # the headers: nothing here needs them
            path = request[1] if len(request) >= 2 else ""
            if not request or request[0] != "GET":
                code, body = 405, {"error": "only GET"}
            elif path == "/health":
                ok = getattr(toypkg.core, "healthy", lambda: True)()
                code, body = (200, {}) if ok else (503, {"error": "engine dead"})
            elif path == "/v1/models":
                code, body = 200, {"object": "list", "data": [
                    {"id": model, "object": "model", "toypkg": toypkg.__version__}]}
            else:
                code, body = 404, {"error": "not found"}
            data = json.dumps(body).encode()
            self.wfile.write(f"HTTP/1.0 {code} {REASONS[code]}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True  # a restart binds the port its predecessor just closed
        daemon_threads = True

    server = Server(("127.0.0.1", port), Handler)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
    print(f"(APIServer pid={os.getpid()}) INFO ready on http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except SystemExit:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
