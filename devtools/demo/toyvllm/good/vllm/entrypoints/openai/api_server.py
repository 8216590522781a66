"""An OpenAI-compatible server: /health, /v1/models, /version, /v1/completions.

Like `vllm serve`, it builds the engine first (which can take minutes on a real model) and
only then listens, so /health answers once the engine is up: 200 while the engine core is
alive, 503 once it is dead."""

import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.utils.system_utils import decorate_logs
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.version import __version__ as VLLM_VERSION

logger = init_logger("vllm.entrypoints.openai.api_server")


def make_handler(engine, served_name, created):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {args[1] if len(args) > 1 else ""}', flush=True)

        def _send(self, code, payload=None):
            body = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(200 if engine.is_alive() else 503)
            elif self.path == "/version":
                self._send(200, {"version": VLLM_VERSION})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": served_name, "object": "model", "created": created, "owned_by": "vllm",
                     "root": served_name, "parent": None, "max_model_len": engine.vllm_config.model_config.max_model_len}]})
            else:
                self._send(404, {"error": {"message": f"Not Found: {self.path}", "code": 404}})

        def do_POST(self):
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": f"Not Found: {self.path}", "code": 404}})
                return
            length = int(self.headers.get("Content-Length", "0") or 0)
            req = json.loads(self.rfile.read(length) or b"{}")
            tokens = engine.generate(str(req.get("prompt", "")), int(req.get("max_tokens", 16)))
            self._send(200, {"object": "text_completion", "model": served_name, "choices": [
                {"index": 0, "text": "".join(f" tok{t}" for t in tokens), "finish_reason": "length"}]})

    return Handler


def run_server(args):
    decorate_logs("APIServer")
    logger.info("vLLM API server version %s", VLLM_VERSION)
    logger.info("args: model=%r tensor_parallel_size=%d port=%d", args.model_tag,
                args.tensor_parallel_size, args.port)
    engine_args = EngineArgs(model=args.model_tag, tensor_parallel_size=args.tensor_parallel_size,
                             max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
                             gpu_memory_utilization=args.gpu_memory_utilization,
                             load_format=args.load_format, served_model_name=args.served_model_name,
                             trust_remote_code=args.trust_remote_code)
    engine = LLMEngine.from_engine_args(engine_args)
    served = args.served_model_name or args.model_tag
    server = ThreadingHTTPServer((args.host, args.port), make_handler(engine, served, int(time.time())))
    server.daemon_threads = True

    def on_term(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    logger.info("Starting vLLM API server 0 on http://%s:%d", args.host, args.port)
    logger.info("Available routes are: /health, /version, /v1/models, /v1/completions")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        logger.info("Shutting down the API server.")
        server.server_close()
        engine.shutdown()
    return 0
