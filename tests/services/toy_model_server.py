#!/usr/bin/env python3
"""A model server for the run-cycle tests, run by the environment's own interpreter: it
imports `toypkg` from that environment and "initialises the model" at start — so what the
environment holds decides whether it comes up. /health and /v1/models like `vllm serve`;
/v1/models reports the toypkg version it runs, so tests can tell old from new."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="toy/model")
    args = ap.parse_args()
    import toypkg
    import toypkg.core

    print(f"(APIServer pid={os.getpid()}) INFO loading model {args.model} with toypkg {toypkg.__version__}",
          flush=True)
    toypkg.core.load_model()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                ok = getattr(toypkg.core, "healthy", lambda: True)()
                code, body = (200, {}) if ok else (503, {"error": "engine dead"})
            elif self.path == "/v1/models":
                code, body = 200, {"object": "list", "data": [
                    {"id": args.model, "object": "model", "toypkg": toypkg.__version__}]}
            else:
                code, body = 404, {"error": "not found"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(0)))
    print(f"(APIServer pid={os.getpid()}) INFO ready on http://127.0.0.1:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except SystemExit:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
