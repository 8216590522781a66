#!/usr/bin/env python3
"""The downtime benchmark's service: a small HTTP process run by the environment's own
interpreter. Like `vllm serve`, it imports the upgraded package before it answers, so
what the environment holds decides how long its start takes and whether it comes up;
then /health and /v1/models answer 200. Standard library only (it runs in the target
environment, where neither rewheel nor devtools is installed). Start it with `python -I`:
its folder holds a `profile.py` that would shadow the standard library's (torch imports
cProfile)."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--import", dest="modules", action="append", default=[],
                    help="a module to import before answering (repeatable)")
    args = ap.parse_args()
    loaded = {m: getattr(importlib.import_module(m), "__version__", "?") for m in args.modules}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path not in ("/health", "/v1/models"):
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"data": [{"id": "bench/model", "modules": loaded}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"serving on 127.0.0.1:{args.port} with {loaded}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
