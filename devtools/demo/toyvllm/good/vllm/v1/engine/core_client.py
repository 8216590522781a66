import atexit
import multiprocessing
import sys

from vllm import envs
from vllm.v1.engine.utils import wait_for_engine_startup


class EngineCoreClient:
    """Runs EngineCore_DP0 in its own process and talks to it over a pipe."""

    def __init__(self, vllm_config):
        from vllm.v1.engine.core import run_engine_core

        ctx = multiprocessing.get_context(envs.VLLM_WORKER_MULTIPROC_METHOD)
        self.conn, child_conn = ctx.Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.proc = ctx.Process(target=run_engine_core, name="EngineCore_DP0",
                                args=(vllm_config, child_conn))
        self.proc.start()
        child_conn.close()
        self._closed = False
        # Before multiprocessing's own exit handler, which would wait for the engine forever.
        atexit.register(self.shutdown)
        wait_for_engine_startup(self.proc, self.conn, envs.VLLM_ENGINE_READY_TIMEOUT_S)

    @classmethod
    def make_client(cls, vllm_config):
        return cls(vllm_config)

    def call(self, method, *args):
        self.conn.send((method, args))
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"EngineCore {method} failed: {value}")
        return value

    def is_alive(self):
        return not self._closed and self.proc.is_alive()

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        try:
            self.conn.send(("shutdown", ()))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
