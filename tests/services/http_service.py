#!/usr/bin/env python3
"""A tiny stand-in model server for tests: a real HTTP service on 127.0.0.1.

GET /health answers 200 (503 with --never-healthy, or before --ready-after-s), GET
/v1/models answers an OpenAI-style model list naming --model. Options shape failure modes:
--crash (exit 1 at start, after printing a traceback), --die-after-s N (exit 1 later),
--workers N (child processes in the same process group, like vLLM's workers),
--ignore-sigterm, --version-of DIST (report an installed distribution's version, to show
which environment the server runs from). Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="tiny/model")
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--never-healthy", action="store_true")
    ap.add_argument("--ready-after-s", type=float, default=0.0)
    ap.add_argument("--die-after-s", type=float, default=None)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--worker-linger-s", type=float, default=0.0,
                    help="workers take this long to exit after SIGTERM")
    ap.add_argument("--version-of", default=None)
    args = ap.parse_args()

    print(f"(APIServer pid={os.getpid()}) starting on port {args.port}", flush=True)
    if args.crash:
        print("Traceback (most recent call last):", flush=True)
        print('  File "server.py", line 1, in <module>', flush=True)
        print("RuntimeError: model init failed on purpose", flush=True)
        return 1
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    workers = []
    for rank in range(args.workers):
        if args.ignore_sigterm:
            handler = "signal.SIG_IGN"
        else:
            handler = f"lambda *a: (time.sleep({args.worker_linger_s}), sys.exit(0))"
        code = ("import signal, sys, time\n"
                f"signal.signal(signal.SIGTERM, {handler})\n"
                "time.sleep(3600)\n")
        workers.append(subprocess.Popen([sys.executable, "-c", code]))
        print(f"(Worker_TP{rank} pid={workers[-1].pid}) started", flush=True)

    version = None
    if args.version_of:
        from importlib.metadata import version as dist_version
        version = dist_version(args.version_of)
    ready_at = time.monotonic() + args.ready_after_s

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def answer(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            ready = not args.never_healthy and time.monotonic() >= ready_at
            if self.path == "/health":
                self.answer(200 if ready else 503, {} if ready else {"error": "engine not ready"})
            elif self.path == "/v1/models" and ready:
                self.answer(200, {"object": "list", "data": [
                    {"id": args.model, "object": "model", "owned_by": "rewheel-tests",
                     "version": version}]})
            else:
                self.answer(404, {"error": "not found"})

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"(APIServer pid={os.getpid()}) listening on http://127.0.0.1:{args.port}", flush=True)
    if args.die_after_s is not None:
        def die() -> None:
            time.sleep(args.die_after_s)
            print("(APIServer pid=%d) RuntimeError: engine died on purpose" % os.getpid(), flush=True)
            os._exit(1)
        threading.Thread(target=die, daemon=True).start()
    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(0)

    if not args.ignore_sigterm:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        server.serve_forever(poll_interval=0.1)
    except SystemExit:
        print(f"(APIServer pid={os.getpid()}) shutting down", flush=True)
    finally:
        # Like a model server's workers, they get SIGTERM but are not waited for: the
        # service manager must notice them still running after the main process is gone.
        for w in workers:
            w.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
