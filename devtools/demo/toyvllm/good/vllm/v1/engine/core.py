import signal
import sys
import time

from vllm.logger import init_logger
from vllm.utils.system_utils import decorate_logs, exit_with_parent
from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.version import __version__ as VLLM_VERSION

logger = init_logger(__name__)


class EngineCore:
    def __init__(self, vllm_config):
        mc = vllm_config.model_config
        logger.info(
            "Initializing a V1 LLM engine (v%s) with config: model=%r, dtype=%s, "
            "max_seq_len=%d, tensor_parallel_size=%d, load_format=%s, enforce_eager=%s, "
            "seed=%d, served_model_name=%s", VLLM_VERSION, mc.model, mc.dtype, mc.max_model_len,
            vllm_config.parallel_config.tensor_parallel_size, vllm_config.load_config.load_format,
            mc.enforce_eager, mc.seed, mc.served_model_name)
        self.model_executor = MultiprocExecutor(vllm_config)
        start = time.perf_counter()
        blocks = self.model_executor.collective_rpc("determine_num_blocks")
        logger.info("GPU KV cache size: %d tokens", min(blocks) * vllm_config.cache_config.block_size)
        logger.info("init engine (profile, create kv cache, warmup model) took %.2f seconds",
                    time.perf_counter() - start)

    def generate(self, prompt, max_tokens):
        outs = self.model_executor.collective_rpc("execute_model", prompt, max_tokens)
        return outs[0]

    def shutdown(self):
        self.model_executor.shutdown()


def run_engine_core(vllm_config, conn):
    decorate_logs("EngineCore_DP0")
    exit_with_parent()
    engine = None

    def on_term(signum, frame):
        raise SystemExit()

    signal.signal(signal.SIGTERM, on_term)
    try:
        engine = EngineCore(vllm_config)
        conn.send("READY")
        while True:
            method, args = conn.recv()
            if method == "shutdown":
                break
            try:
                conn.send(("ok", getattr(engine, method)(*args)))
            except Exception as exc:
                logger.exception("EngineCore encountered an issue.")
                conn.send(("error", repr(exc)))
    except SystemExit:
        logger.debug("EngineCore exiting.")
        raise
    except EOFError:
        pass
    except Exception:
        if engine is None:
            logger.exception("EngineCore failed to start.")
        else:
            logger.exception("EngineCore encountered a fatal error.")
        sys.stdout.flush()
        sys.exit(1)
    finally:
        if engine is not None:
            engine.shutdown()
