"""A toy `vllm` for the demo and the tests: stdlib only, no GPU, shaped like the real thing.

`toy_vllm_files(version, bad=...)` returns the files of a wheel that mimics vLLM where it
matters to rewheel: the `vllm` console script and `vllm serve` (an HTTP server with
`/health` and `/v1/models` that answers only once the engine has initialised), `vllm.LLM`
(accepting the real arguments: `load_format`, `hf_overrides`, `enforce_eager`,
`max_model_len`, `tensor_parallel_size`, ...), an engine core process `EngineCore_DP0` that
spawns one worker process per tensor-parallel rank (`Worker_TP0..N-1`), each printing with
vLLM's `(Worker_TP4 pid=…) ` prefix and `INFO 02-20 23:31:36 [file.py:NN]` log headers, and
a DeepSeek-V2 model whose decoder layer builds `self.self_attn = attn_cls(...)`.

The bad build (`bad=True`, the story's dev344) carries a new head-sharding helper for MLA
attention with an off-by-one that leaves tensor-parallel rank 4 (of 8) without query heads,
so attention init fails there and only there, followed by the cascade real vLLM prints
("WorkerProc was terminated", "Engine core initialization failed. See root cause above").
It also differs from the good build in several other files, adds one file and removes one,
so that a source diff between the two has something to show.

The model config comes from a Hugging Face–style cache (`$HF_HOME/hub/models--org--name/…`):
`toy_model_config()` is the config the demo writes there (Kimi-K2.5's shape: a multimodal
wrapper with a DeepSeek-V3 `text_config`, MLA attention, 384 routed experts, NVFP4).
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

from packaging.version import Version

# The story's two nightlies (setuptools-scm versions, `g` + 9-hex short sha).
GOOD_SHA = "8c1b3f2a0"
BAD_SHA = "5719a4e4e"
GOOD_VERSION = f"0.16.0rc2.dev313+g{GOOD_SHA}"
BAD_VERSION = f"0.16.0rc2.dev344+g{BAD_SHA}"
FLASHINFER_GOOD = "0.6.3"
FLASHINFER_BAD = "0.6.4"
TOY_MODEL = "toy/Kimi-K2.5-mini"
PROJECT_URLS = {"Homepage": "https://github.com/vllm-project/vllm",
                "Source": "https://github.com/vllm-project/vllm"}

# Files whose text is `_src(...)`-dedented below. "@VERSION@" is replaced per build.
_COMMON: dict[str, str] = {}
_GOOD_ONLY: dict[str, str] = {}
_BAD_ONLY: dict[str, str] = {}


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


_COMMON["vllm/__init__.py"] = _src(r'''
    """vLLM: a high-throughput and memory-efficient inference engine for LLMs (toy build)."""

    from vllm.version import __version__, __version_tuple__
    from vllm.sampling_params import SamplingParams
    from vllm.entrypoints.llm import LLM

    __all__ = ["LLM", "SamplingParams", "__version__", "__version_tuple__"]
''')

_COMMON["vllm/version.py"] = _src(r'''
    __version__ = version = "@VERSION@"
    __version_tuple__ = version_tuple = tuple(
        int(p) if p.isdigit() else p for p in "@VERSION@".replace("+", ".").split("."))
''')

_COMMON["vllm/logger.py"] = _src(r'''
    """Logging like vLLM's: `LEVEL MM-DD HH:MM:SS [file.py:NN] message`, on stdout, one
    header per line (a traceback is logged one record line per line)."""

    import logging
    import sys

    _FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
    _DATE_FORMAT = "%m-%d %H:%M:%S"


    class NewLineFormatter(logging.Formatter):
        """Adds the record's header to every line of a multi-line message."""

        def format(self, record):
            msg = super().format(record)
            if record.message != "":
                header = msg.split(record.message)[0]
                msg = msg.replace("\n", "\n" + header)
            return msg


    class _StdoutHandler(logging.StreamHandler):
        """Writes to whatever sys.stdout is now (worker processes decorate theirs)."""

        def __init__(self):
            super().__init__(sys.stdout)

        @property
        def stream(self):
            return sys.stdout

        @stream.setter
        def stream(self, value):
            pass


    _root = logging.getLogger("vllm")
    if not _root.handlers:
        _handler = _StdoutHandler()
        _handler.setFormatter(NewLineFormatter(_FORMAT, datefmt=_DATE_FORMAT))
        _root.addHandler(_handler)
        _root.setLevel(logging.INFO)
        _root.propagate = False


    def init_logger(name):
        return logging.getLogger(name)
''')

_COMMON["vllm/envs.py"] = _src(r'''
    import os

    VLLM_WORKER_MULTIPROC_METHOD = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))
    # Seconds each worker pretends to spend loading (dummy) weights.
    VLLM_TOY_LOAD_SECONDS = float(os.environ.get("VLLM_TOY_LOAD_SECONDS", "0.8"))
''')

_COMMON["vllm/sampling_params.py"] = _src(r'''
    class SamplingParams:
        def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, seed=None,
                     **kwargs):
            self.n = n
            self.temperature = temperature
            self.top_p = top_p
            self.top_k = top_k
            self.max_tokens = max_tokens
            self.seed = seed

        def __repr__(self):
            return f"SamplingParams(n={self.n}, temperature={self.temperature}, max_tokens={self.max_tokens})"
''')

_COMMON["vllm/outputs.py"] = _src(r'''
    class CompletionOutput:
        def __init__(self, index, text, token_ids):
            self.index = index
            self.text = text
            self.token_ids = token_ids


    class RequestOutput:
        def __init__(self, request_id, prompt, outputs):
            self.request_id = request_id
            self.prompt = prompt
            self.outputs = outputs
            self.finished = True
''')

_COMMON["vllm/utils/__init__.py"] = ""
_COMMON["vllm/utils/system_utils.py"] = _src(r'''
    import os
    import sys
    import threading
    import time


    def _add_prefix(file, prefix):
        """Prefix every line written to `file` (vLLM's `(Worker_TP4 pid=…) `). A forked child
        replaces its parent's prefix rather than adding to it."""
        file_write = getattr(file, "_undecorated_write", None) or file.write
        file._undecorated_write = file_write
        state = {"start": True}

        def write_with_prefix(s):
            # One write per call, prefix included: processes share the descriptor, and a
            # prefix written apart from its line could land in front of another process's.
            if not s:
                return
            out = []
            for piece in s.splitlines(keepends=True):
                if state["start"]:
                    out.append(prefix)
                out.append(piece)
                state["start"] = piece.endswith("\n")
            file_write("".join(out))
            if state["start"]:
                file.flush()

        file.write = write_with_prefix


    def decorate_logs(process_name):
        prefix = f"({process_name} pid={os.getpid()}) "
        _add_prefix(sys.stdout, prefix)
        _add_prefix(sys.stderr, prefix)


    def exit_with_parent():
        """Child processes go when their parent goes, however it went."""
        parent = os.getppid()

        def watch():
            while True:
                if os.getppid() != parent:
                    os._exit(1)
                time.sleep(0.2)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
''')

_COMMON["vllm/distributed/__init__.py"] = _src(r'''
    from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                 get_tensor_model_parallel_world_size)
''')
_COMMON["vllm/distributed/parallel_state.py"] = _src(r'''
    _TP_RANK = 0
    _TP_SIZE = 1


    def init_model_parallel(rank, world_size):
        global _TP_RANK, _TP_SIZE
        _TP_RANK, _TP_SIZE = rank, world_size


    def get_tensor_model_parallel_rank():
        return _TP_RANK


    def get_tensor_model_parallel_world_size():
        return _TP_SIZE
''')

_COMMON["vllm/transformers_utils/__init__.py"] = ""
_COMMON["vllm/transformers_utils/config.py"] = _src(r'''
    """Model configs from a local folder or the Hugging Face cache (offline)."""

    import json
    import os
    from pathlib import Path


    class PretrainedConfig:
        def __init__(self, data):
            for key, value in data.items():
                if isinstance(value, dict) and key.endswith("_config") and key != "quantization_config":
                    value = PretrainedConfig(value)
                setattr(self, key, value)

        def to_dict(self):
            return {k: (v.to_dict() if isinstance(v, PretrainedConfig) else v)
                    for k, v in self.__dict__.items()}


    def hf_hub_cache():
        if os.environ.get("HF_HUB_CACHE"):
            return Path(os.environ["HF_HUB_CACHE"])
        home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
        return Path(home) / "hub"


    def model_dir(model, revision=None):
        p = Path(model)
        if p.is_dir():
            return p
        repo = hf_hub_cache() / ("models--" + model.replace("/", "--"))
        ref = repo / "refs" / (revision or "main")
        if ref.is_file():
            snap = repo / "snapshots" / ref.read_text().strip()
            if (snap / "config.json").is_file():
                return snap
        raise OSError(f"Can't load the configuration of '{model}': it is not a local folder and "
                      f"not in the Hugging Face cache ({repo}), and this build works offline")


    def _apply_dict_overrides(config, overrides):
        for key, value in overrides.items():
            current = getattr(config, key, None)
            if isinstance(current, PretrainedConfig) and isinstance(value, dict):
                _apply_dict_overrides(current, value)
            else:
                setattr(config, key, value)


    def get_config(model, trust_remote_code=False, revision=None, hf_overrides=None):
        path = model_dir(model, revision) / "config.json"
        config = PretrainedConfig(json.loads(path.read_text()))
        if hf_overrides:
            _apply_dict_overrides(config, hf_overrides)
        return config


    def get_hf_text_config(config):
        return getattr(config, "text_config", config)
''')

_COMMON["vllm/config.py"] = _src(r'''
    from dataclasses import dataclass, field


    @dataclass
    class ModelConfig:
        model: str
        hf_config: object
        max_model_len: int
        dtype: str = "auto"
        enforce_eager: bool = False
        served_model_name: str = ""
        trust_remote_code: bool = False
        seed: int = 0

        @property
        def hf_text_config(self):
            return getattr(self.hf_config, "text_config", self.hf_config)


    @dataclass
    class ParallelConfig:
        tensor_parallel_size: int = 1

        @property
        def world_size(self):
            return self.tensor_parallel_size


    @dataclass
    class LoadConfig:
        load_format: str = "auto"


    @dataclass
    class CacheConfig:
        gpu_memory_utilization: float = 0.9
        block_size: int = 64


    @dataclass
    class SchedulerConfig:
        max_num_seqs: int = 256


    @dataclass
    class VllmConfig:
        model_config: ModelConfig
        parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
        load_config: LoadConfig = field(default_factory=LoadConfig)
        cache_config: CacheConfig = field(default_factory=CacheConfig)
        scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
''')

_COMMON["vllm/engine/__init__.py"] = ""
_COMMON["vllm/engine/arg_utils.py"] = _src(r'''
    from dataclasses import dataclass

    from vllm.config import (CacheConfig, LoadConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.transformers_utils.config import get_config, get_hf_text_config

    LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "gguf")


    @dataclass
    class EngineArgs:
        model: str = "facebook/opt-125m"
        tokenizer: str = None
        trust_remote_code: bool = False
        revision: str = None
        tensor_parallel_size: int = 1
        dtype: str = "auto"
        quantization: str = None
        seed: int = 0
        gpu_memory_utilization: float = 0.9
        enforce_eager: bool = False
        max_model_len: int = None
        max_num_seqs: int = None
        load_format: str = "auto"
        hf_overrides: dict = None
        served_model_name: str = None
        kv_cache_dtype: str = "auto"

        def create_engine_config(self):
            if self.load_format not in LOAD_FORMATS:
                raise ValueError(f"Unknown load format {self.load_format!r}; choose from {LOAD_FORMATS}")
            if self.tensor_parallel_size < 1:
                raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
            if not 0 < self.gpu_memory_utilization <= 1:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
            hf_config = get_config(self.model, self.trust_remote_code, self.revision, self.hf_overrides)
            text = get_hf_text_config(hf_config)
            limit = getattr(text, "max_position_embeddings", 4096)
            max_len = self.max_model_len or limit
            if max_len > limit:
                raise ValueError(f"User-specified max_model_len ({max_len}) is greater than the derived "
                                 f"max_model_len (max_position_embeddings={limit} in model's config.json).")
            model = ModelConfig(model=self.model, hf_config=hf_config, max_model_len=max_len,
                                dtype=self.dtype, enforce_eager=self.enforce_eager,
                                served_model_name=self.served_model_name or self.model,
                                trust_remote_code=self.trust_remote_code, seed=self.seed)
            return VllmConfig(model_config=model,
                              parallel_config=ParallelConfig(self.tensor_parallel_size),
                              load_config=LoadConfig(self.load_format),
                              cache_config=CacheConfig(self.gpu_memory_utilization),
                              scheduler_config=SchedulerConfig(self.max_num_seqs or 256))
''')

_COMMON["vllm/entrypoints/__init__.py"] = ""
_COMMON["vllm/entrypoints/llm.py"] = _src(r'''
    import time

    from vllm.engine.arg_utils import EngineArgs
    from vllm.logger import init_logger
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    logger = init_logger(__name__)


    class LLM:
        """An LLM for offline inference (same constructor arguments as vLLM's)."""

        def __init__(self, model, *, tokenizer=None, trust_remote_code=False,
                     tensor_parallel_size=1, dtype="auto", quantization=None, revision=None,
                     seed=0, gpu_memory_utilization=0.9, enforce_eager=False,
                     max_model_len=None, load_format="auto", hf_overrides=None, **kwargs):
            engine_args = EngineArgs(
                model=model, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                tensor_parallel_size=tensor_parallel_size, dtype=dtype, quantization=quantization,
                revision=revision, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                enforce_eager=enforce_eager, max_model_len=max_model_len, load_format=load_format,
                hf_overrides=hf_overrides, **kwargs)
            self.llm_engine = LLMEngine.from_engine_args(engine_args)
            self._request_counter = 0

        def generate(self, prompts, sampling_params=None, use_tqdm=False):
            if isinstance(prompts, str):
                prompts = [prompts]
            params = sampling_params or SamplingParams()
            outputs = []
            for prompt in prompts:
                tokens = self.llm_engine.generate(prompt, params.max_tokens)
                outputs.append(RequestOutput(str(self._request_counter), prompt,
                                             [CompletionOutput(0, "".join(f" tok{t}" for t in tokens), tokens)]))
                self._request_counter += 1
            return outputs

        def shutdown(self):
            self.llm_engine.shutdown()

        def __del__(self):
            try:
                self.llm_engine.shutdown()
            except Exception:
                pass
''')

_COMMON["vllm/v1/__init__.py"] = ""
_COMMON["vllm/v1/engine/__init__.py"] = ""
_COMMON["vllm/v1/engine/llm_engine.py"] = _src(r'''
    import time

    from vllm.logger import init_logger
    from vllm.v1.engine.core_client import EngineCoreClient

    logger = init_logger(__name__)


    class LLMEngine:
        def __init__(self, vllm_config):
            self.vllm_config = vllm_config
            self.engine_core = EngineCoreClient.make_client(vllm_config)

        @classmethod
        def from_engine_args(cls, engine_args):
            return cls(engine_args.create_engine_config())

        def generate(self, prompt, max_tokens):
            return self.engine_core.call("generate", prompt, max_tokens)

        def is_alive(self):
            return self.engine_core.is_alive()

        def shutdown(self):
            self.engine_core.shutdown()
''')

_COMMON["vllm/v1/engine/core_client.py"] = _src(r'''
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
''')

_COMMON["vllm/v1/engine/utils.py"] = _src(r'''
    def wait_for_engine_startup(proc, conn, timeout_s):
        """Wait for EngineCore's READY; raise like vLLM when it died instead."""
        ready = conn.poll(timeout_s)
        message = None
        if ready:
            try:
                message = conn.recv()
            except EOFError:
                message = None
        if message != "READY":
            proc.join(timeout=10)
            failed = {proc.name: proc.exitcode}
            raise RuntimeError("Engine core initialization failed. See root cause above. "
                               f"Failed core proc(s): {failed}")
''')

_COMMON["vllm/v1/engine/core.py"] = _src(r'''
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
''')

_COMMON["vllm/v1/executor/__init__.py"] = ""
_COMMON["vllm/v1/executor/multiproc_executor.py"] = _src(r'''
    import multiprocessing
    import signal
    import sys
    from multiprocessing.connection import wait

    from vllm import envs
    from vllm.logger import init_logger
    from vllm.utils.system_utils import decorate_logs, exit_with_parent

    logger = init_logger(__name__)


    class WorkerProcHandle:
        def __init__(self, proc, rank, ready_pipe, rpc_conn):
            self.proc = proc
            self.rank = rank
            self.ready_pipe = ready_pipe
            self.rpc_conn = rpc_conn


    class MultiprocExecutor:
        """One worker process per tensor-parallel rank."""

        def __init__(self, vllm_config):
            self.vllm_config = vllm_config
            self.world_size = vllm_config.parallel_config.world_size
            ctx = multiprocessing.get_context(envs.VLLM_WORKER_MULTIPROC_METHOD)
            self.workers = []
            sys.stdout.flush()
            sys.stderr.flush()
            for rank in range(self.world_size):
                reader, writer = ctx.Pipe(duplex=False)
                parent_conn, child_conn = ctx.Pipe()
                proc = ctx.Process(target=WorkerProc.worker_main, name=f"VllmWorker-{rank}",
                                   kwargs=dict(vllm_config=vllm_config, local_rank=rank, rank=rank,
                                               ready_pipe=writer, rpc_conn=child_conn),
                                   daemon=True)
                proc.start()
                writer.close()
                child_conn.close()
                self.workers.append(WorkerProcHandle(proc, rank, reader, parent_conn))
            self.wait_for_ready()

        def wait_for_ready(self):
            pending = {w.ready_pipe: w for w in self.workers}
            while pending:
                for conn in wait(list(pending), timeout=envs.VLLM_ENGINE_READY_TIMEOUT_S) or []:
                    handle = pending.pop(conn)
                    try:
                        message = conn.recv()
                    except EOFError:
                        message = None
                    if not message or message.get("status") != "READY":
                        self.shutdown(graceful=False)
                        raise Exception("WorkerProc initialization failed due to an exception in a "
                                        "background process. See stack trace for root cause.")

        def collective_rpc(self, method, *args):
            for w in self.workers:
                w.rpc_conn.send((method, args))
            return [w.rpc_conn.recv() for w in self.workers]

        def shutdown(self, graceful=True):
            if graceful:
                for w in self.workers:
                    try:
                        w.rpc_conn.send(("shutdown", ()))
                    except (BrokenPipeError, OSError):
                        pass
                for w in self.workers:
                    w.proc.join(timeout=5)
            for w in self.workers:
                if w.proc.is_alive():
                    w.proc.terminate()
            for w in self.workers:
                w.proc.join(timeout=5)
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(timeout=5)


    class WorkerProc:
        def __init__(self, vllm_config, local_rank, rank):
            from vllm.distributed.parallel_state import init_model_parallel
            from vllm.v1.worker.gpu_worker import Worker

            init_model_parallel(rank, vllm_config.parallel_config.world_size)
            self.rank = rank
            self.worker = Worker(vllm_config, local_rank, rank)
            self.worker.init_device()
            self.worker.load_model()

        def worker_busy_loop(self, conn):
            while True:
                method, args = conn.recv()
                if method == "shutdown":
                    return
                conn.send(getattr(self.worker, method)(*args))

        @staticmethod
        def worker_main(vllm_config, local_rank, rank, ready_pipe, rpc_conn):
            shutdown_requested = False

            def signal_handler(signum, frame):
                nonlocal shutdown_requested
                if not shutdown_requested:
                    shutdown_requested = True
                    raise SystemExit()

            signal.signal(signal.SIGTERM, signal_handler)
            signal.signal(signal.SIGINT, signal_handler)
            decorate_logs(f"Worker_TP{rank}")
            exit_with_parent()
            worker = None
            try:
                worker = WorkerProc(vllm_config, local_rank, rank)
                ready_pipe.send({"status": "READY"})
                ready_pipe.close()
                ready_pipe = None
                worker.worker_busy_loop(rpc_conn)
            except Exception:
                if ready_pipe is not None:
                    logger.exception("WorkerProc failed to start.")
                elif shutdown_requested:
                    logger.info("WorkerProc shutting down.")
                else:
                    logger.exception("WorkerProc failed.")
                shutdown_requested = True
                sys.stdout.flush()
                sys.exit(1)
            except SystemExit:
                logger.warning("WorkerProc was terminated")
                raise
            finally:
                if ready_pipe is not None:
                    ready_pipe.close()
''')

_COMMON["vllm/v1/worker/__init__.py"] = ""
_COMMON["vllm/v1/worker/gpu_worker.py"] = _src(r'''
    from vllm.logger import init_logger
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    logger = init_logger(__name__)


    class Worker:
        def __init__(self, vllm_config, local_rank, rank):
            self.vllm_config = vllm_config
            self.local_rank = local_rank
            self.rank = rank
            self.model_runner = None

        def init_device(self):
            # The toy has no GPU: each rank pretends to own device `local_rank`.
            self.device = f"cuda:{self.local_rank}"
            self.model_runner = GPUModelRunner(self.vllm_config, self.device)

        def load_model(self):
            self.model_runner.load_model()

        def determine_num_blocks(self):
            util = self.vllm_config.cache_config.gpu_memory_utilization
            return int(2048 * util)

        def execute_model(self, prompt, max_tokens):
            return self.model_runner.execute_model(prompt, max_tokens)
''')

_COMMON["vllm/v1/worker/gpu_model_runner.py"] = _src(r'''
    import time

    from vllm.logger import init_logger
    from vllm.model_executor.model_loader import get_model_loader

    logger = init_logger(__name__)


    class GPUModelRunner:
        def __init__(self, vllm_config, device):
            self.vllm_config = vllm_config
            self.device = device
            self.model = None

        def load_model(self):
            mc = self.vllm_config.model_config
            logger.info("Starting to load model %s...", mc.model)
            start = time.perf_counter()
            loader = get_model_loader(self.vllm_config.load_config)
            self.model = loader.load_model(vllm_config=self.vllm_config, model_config=mc)
            logger.info("Model loading took %.4f GiB memory and %.6f seconds",
                        self.model.num_parameters() * 0.5 / 2**30, time.perf_counter() - start)

        def execute_model(self, prompt, max_tokens):
            seed = sum(map(ord, prompt))
            return [(seed * 31 + i * 7) % 163840 for i in range(max_tokens)]
''')

_COMMON["vllm/model_executor/__init__.py"] = ""
_COMMON["vllm/model_executor/model_loader/__init__.py"] = _src(r'''
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader


    def get_model_loader(load_config):
        if load_config.load_format == "dummy":
            return DummyModelLoader(load_config)
        return DefaultModelLoader(load_config)
''')
_COMMON["vllm/model_executor/model_loader/base_loader.py"] = _src(r'''
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.utils import initialize_model

    logger = init_logger(__name__)


    class BaseModelLoader:
        def __init__(self, load_config):
            self.load_config = load_config

        def load_model(self, vllm_config, model_config):
            model = initialize_model(vllm_config=vllm_config, model_config=model_config)
            self.load_weights(model, model_config)
            return model
''')
_COMMON["vllm/model_executor/model_loader/dummy_loader.py"] = _src(r'''
    import time

    from vllm import envs
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader


    class DummyModelLoader(BaseModelLoader):
        """Random weights: init exercises every layer without reading a checkpoint."""

        def load_weights(self, model, model_config):
            time.sleep(envs.VLLM_TOY_LOAD_SECONDS)
''')
_COMMON["vllm/model_executor/model_loader/default_loader.py"] = _src(r'''
    import time

    from vllm import envs
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.weight_utils import filter_files_not_needed_for_inference

    logger = init_logger(__name__)


    class DefaultModelLoader(BaseModelLoader):
        def load_weights(self, model, model_config):
            start = time.perf_counter()
            files = filter_files_not_needed_for_inference(
                [f"model-{i:05d}-of-00064.safetensors" for i in range(1, 65)])
            time.sleep(envs.VLLM_TOY_LOAD_SECONDS)
            logger.info("Loading weights took %.2f seconds (%d shards)",
                        time.perf_counter() - start, len(files))
''')
_COMMON["vllm/model_executor/model_loader/weight_utils.py"] = _src(r'''
    """Utilities for downloading and initializing model weights."""

    _SKIP = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


    def filter_files_not_needed_for_inference(hf_weights_files):
        """Exclude files that are not needed for inference."""
        return [f for f in hf_weights_files if not any(f.endswith(x) for x in _SKIP)]
''')
_COMMON["vllm/model_executor/model_loader/gguf_loader.py"] = _src(r'''
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader


    class GGUFModelLoader(BaseModelLoader):
        """Model loader that can load GGUF files."""

        def _get_gguf_weights_map(self, model_config):
            return {}

        def load_weights(self, model, model_config):
            raise NotImplementedError("GGUF checkpoints are not part of the toy build")
''')
_COMMON["vllm/model_executor/model_loader/utils.py"] = _src(r'''
    from vllm.model_executor.models.registry import resolve_model_cls


    def initialize_model(vllm_config, model_config, prefix=""):
        model_class = resolve_model_cls(model_config.hf_config.architectures)
        return model_class(vllm_config=vllm_config, prefix=prefix)
''')

_COMMON["vllm/model_executor/layers/__init__.py"] = ""
_COMMON["vllm/model_executor/layers/linear.py"] = _src(r'''
    from vllm.distributed import get_tensor_model_parallel_world_size


    def divide(numerator, denominator):
        assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
        return numerator // denominator


    class LinearBase:
        def __init__(self, input_size, output_size, quant_config=None, prefix=""):
            self.input_size = input_size
            self.output_size = output_size
            self.prefix = prefix
            self.quant_method = quant_config.get_quant_method(self, prefix) if quant_config else "unquantized"

        def num_parameters(self):
            return self.input_size * self.output_size_per_partition


    class ReplicatedLinear(LinearBase):
        def __init__(self, input_size, output_size, quant_config=None, prefix=""):
            super().__init__(input_size, output_size, quant_config, prefix)
            self.output_size_per_partition = output_size


    class ColumnParallelLinear(LinearBase):
        def __init__(self, input_size, output_size, quant_config=None, prefix=""):
            super().__init__(input_size, output_size, quant_config, prefix)
            self.output_size_per_partition = divide(output_size, get_tensor_model_parallel_world_size())


    class RowParallelLinear(LinearBase):
        def __init__(self, input_size, output_size, quant_config=None, prefix=""):
            super().__init__(input_size, output_size, quant_config, prefix)
            self.input_size_per_partition = divide(input_size, get_tensor_model_parallel_world_size())
            self.output_size_per_partition = output_size
''')
_COMMON["vllm/model_executor/layers/quantization/__init__.py"] = _src(r'''
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config


    def get_quantization_config(hf_config):
        qc = getattr(hf_config, "quantization_config", None)
        if not qc:
            return None
        if qc.get("quant_method") == "modelopt" and qc.get("quant_algo") == "NVFP4":
            return ModelOptNvFp4Config(qc)
        raise ValueError(f"Unknown quantization method: {qc.get('quant_method')!r}")
''')
_COMMON["vllm/model_executor/layers/quantization/modelopt.py"] = _src(r'''
    from vllm.logger import init_logger

    logger = init_logger(__name__)


    class ModelOptNvFp4Config:
        def __init__(self, config):
            self.group_size = config.get("group_size", 16)
            self.exclude_modules = config.get("exclude_modules", [])
            logger.info("Detected ModelOpt NVFP4 checkpoint (group_size=%d)", self.group_size)

        def get_quant_method(self, layer, prefix):
            if any(prefix.startswith(m) or m in prefix for m in self.exclude_modules):
                return "unquantized"
            return "ModelOptNvFp4LinearMethod"
''')
_COMMON["vllm/model_executor/layers/fused_moe/__init__.py"] = _src(r'''
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE
''')
_COMMON["vllm/model_executor/layers/fused_moe/layer.py"] = _src(r'''
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.logger import init_logger

    logger = init_logger(__name__)


    class FusedMoE:
        def __init__(self, num_experts, top_k, hidden_size, intermediate_size, quant_config=None,
                     prefix="", n_group=1, topk_group=1):
            tp_size = get_tensor_model_parallel_world_size()
            if top_k > num_experts:
                raise ValueError(f"top_k ({top_k}) must not exceed the number of experts ({num_experts})")
            if n_group and num_experts % n_group:
                raise ValueError(f"num_experts ({num_experts}) must be divisible by n_group ({n_group})")
            self.num_experts = num_experts
            self.top_k = top_k
            self.intermediate_size_per_partition = intermediate_size // tp_size
            self.hidden_size = hidden_size
            self.quant_method = ("ModelOptNvFp4FusedMoE" if quant_config and
                                 quant_config.get_quant_method(self, prefix) != "unquantized" else "UnquantizedFusedMoEMethod")
            if get_tensor_model_parallel_rank() == 0 and prefix.endswith("layers.1.mlp.experts"):
                logger.info("Using %s for %d experts (top-%d) in %s", self.quant_method, num_experts, top_k, prefix)

        def num_parameters(self):
            return self.num_experts * 3 * self.hidden_size * self.intermediate_size_per_partition
''')
_COMMON["vllm/attention/__init__.py"] = ""
_COMMON["vllm/attention/layer.py"] = _src(r'''
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.logger import init_logger

    logger = init_logger(__name__)
    _announced = False


    class MLAAttention:
        """Multi-head latent attention over the paged KV cache."""

        def __init__(self, num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                     q_lora_rank, kv_lora_rank, prefix=""):
            global _announced
            if num_heads <= 0:
                raise ValueError(f"MLAAttention needs at least one head, got {num_heads} ({prefix})")
            self.num_heads = num_heads
            self.scale = scale
            self.kv_lora_rank = kv_lora_rank
            self.head_size = kv_lora_rank + qk_rope_head_dim
            self.backend = "FLASHINFER_MLA"
            if not _announced:
                _announced = True
                import flashinfer
                logger.info("Using %s attention backend (flashinfer %s) on rank %d", self.backend,
                            flashinfer.__version__, get_tensor_model_parallel_rank())
''')

_COMMON["vllm/model_executor/models/__init__.py"] = ""
_COMMON["vllm/model_executor/models/registry.py"] = _src(r'''
    import importlib

    _MODELS = {
        "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
        "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
        "KimiK25ForConditionalGeneration": ("kimi_k25", "KimiK25ForConditionalGeneration"),
    }


    def resolve_model_cls(architectures):
        for arch in architectures or []:
            if arch in _MODELS:
                module, name = _MODELS[arch]
                return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
        raise ValueError(f"Model architectures {architectures} are not supported for now. "
                         f"Supported architectures: {sorted(_MODELS)}")
''')
_COMMON["vllm/model_executor/models/kimi_k25.py"] = _src(r'''
    """Kimi-K2.5: a vision tower in front of a DeepSeek-V3 language model."""

    import copy

    from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM


    class KimiK25ForConditionalGeneration:
        def __init__(self, *, vllm_config, prefix=""):
            hf_config = vllm_config.model_config.hf_config
            self.vision_layers = getattr(getattr(hf_config, "vision_config", None), "num_hidden_layers", 0)
            self.language_model = DeepseekV3ForCausalLM(
                vllm_config=vllm_config, hf_config=hf_config.text_config,
                prefix=f"{prefix}language_model")

        def num_parameters(self):
            return self.language_model.num_parameters()
''')

# --- deepseek_v2.py: the file of the story. The decoder layer builds `self.self_attn = attn_cls(...)`.
_DEEPSEEK_HEAD = r'''
    """Inference-only DeepseekV2/DeepseekV3 model (toy build: shapes and wiring, no tensors)."""

    from vllm.attention.layer import MLAAttention
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.logger import init_logger
    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, ReplicatedLinear,
                                                   RowParallelLinear)
    from vllm.model_executor.layers.quantization import get_quantization_config
@EXTRA_IMPORTS@
    logger = init_logger(__name__)


    class DeepseekV2MLP:
        def __init__(self, hidden_size, intermediate_size, quant_config=None, prefix=""):
            self.gate_up_proj = ColumnParallelLinear(hidden_size, 2 * intermediate_size, quant_config,
                                                     prefix=f"{prefix}.gate_up_proj")
            self.down_proj = RowParallelLinear(intermediate_size, hidden_size, quant_config,
                                               prefix=f"{prefix}.down_proj")

        def num_parameters(self):
            return self.gate_up_proj.num_parameters() + self.down_proj.num_parameters()


    class DeepseekV2MoE:
        def __init__(self, config, quant_config=None, prefix=""):
            self.n_routed_experts = config.n_routed_experts
            self.gate = ReplicatedLinear(config.hidden_size, config.n_routed_experts, None,
                                         prefix=f"{prefix}.gate")
            self.experts = FusedMoE(num_experts=config.n_routed_experts,
                                    top_k=config.num_experts_per_tok,
                                    hidden_size=config.hidden_size,
                                    intermediate_size=config.moe_intermediate_size,
                                    quant_config=quant_config, prefix=f"{prefix}.experts",
                                    n_group=getattr(config, "n_group", 1),
                                    topk_group=getattr(config, "topk_group", 1))
            self.shared_experts = None
            if getattr(config, "n_shared_experts", 0):
                self.shared_experts = DeepseekV2MLP(
                    config.hidden_size, config.moe_intermediate_size * config.n_shared_experts,
                    quant_config, prefix=f"{prefix}.shared_experts")

        def num_parameters(self):
            n = self.experts.num_parameters()
            return n + (self.shared_experts.num_parameters() if self.shared_experts else 0)
'''

_ATTN_GOOD = r'''

    class DeepseekV2MLAAttention:
        """Multi-head latent attention (DeepSeek-V2 paper, section 2.1)."""

        def __init__(self, vllm_config, config, hidden_size, num_heads, qk_nope_head_dim,
                     qk_rope_head_dim, v_head_dim, q_lora_rank, kv_lora_rank,
                     max_position_embeddings=8192, quant_config=None, prefix=""):
            self.hidden_size = hidden_size
            self.qk_nope_head_dim = qk_nope_head_dim
            self.qk_rope_head_dim = qk_rope_head_dim
            self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
            self.v_head_dim = v_head_dim
            self.q_lora_rank = q_lora_rank
            self.kv_lora_rank = kv_lora_rank
            self.num_heads = num_heads
            tp_size = get_tensor_model_parallel_world_size()
            assert num_heads % tp_size == 0
            self.num_local_heads = num_heads // tp_size
            self.scaling = self.qk_head_dim ** -0.5

            if self.q_lora_rank is not None:
                self.fused_qkv_a_proj = ReplicatedLinear(
                    hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim, quant_config,
                    prefix=f"{prefix}.fused_qkv_a_proj")
                self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * self.qk_head_dim,
                                                     quant_config, prefix=f"{prefix}.q_b_proj")
            else:
                self.q_proj = ColumnParallelLinear(hidden_size, num_heads * self.qk_head_dim,
                                                   quant_config, prefix=f"{prefix}.q_proj")
            self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                                  quant_config, prefix=f"{prefix}.kv_b_proj")
            self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size, quant_config,
                                            prefix=f"{prefix}.o_proj")
            self.mla_attn = MLAAttention(
                num_heads=self.num_local_heads, scale=self.scaling, qk_nope_head_dim=qk_nope_head_dim,
                qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank,
                kv_lora_rank=kv_lora_rank, prefix=f"{prefix}.attn")

        def num_parameters(self):
            return self.kv_b_proj.num_parameters() + self.o_proj.num_parameters()
'''

_ATTN_BAD = r'''

    class DeepseekV2MLAAttention:
        """Multi-head latent attention (DeepSeek-V2 paper, section 2.1)."""

        def __init__(self, vllm_config, config, hidden_size, num_heads, qk_nope_head_dim,
                     qk_rope_head_dim, v_head_dim, q_lora_rank, kv_lora_rank,
                     max_position_embeddings=8192, quant_config=None, prefix=""):
            self.hidden_size = hidden_size
            self.qk_nope_head_dim = qk_nope_head_dim
            self.qk_rope_head_dim = qk_rope_head_dim
            self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
            self.v_head_dim = v_head_dim
            self.q_lora_rank = q_lora_rank
            self.kv_lora_rank = kv_lora_rank
            self.num_heads = num_heads
            tp_size = get_tensor_model_parallel_world_size()
            tp_rank = get_tensor_model_parallel_rank()
            assert num_heads % tp_size == 0
            # The query heads this rank owns; the second half of the TP group takes them
            # mirrored so that all-gathers pair GPUs across the two PCIe switches.
            self.head_range = mla_head_range(num_heads, tp_size, tp_rank)
            self.num_local_heads = len(self.head_range)
            self.scaling = self.qk_head_dim ** -0.5

            if self.q_lora_rank is not None:
                self.fused_qkv_a_proj = ReplicatedLinear(
                    hidden_size, q_lora_rank + kv_lora_rank + qk_rope_head_dim, quant_config,
                    prefix=f"{prefix}.fused_qkv_a_proj")
                self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * self.qk_head_dim,
                                                     quant_config, prefix=f"{prefix}.q_b_proj")
                q_out = self.q_b_proj.output_size_per_partition
            else:
                self.q_proj = ColumnParallelLinear(hidden_size, num_heads * self.qk_head_dim,
                                                   quant_config, prefix=f"{prefix}.q_proj")
                q_out = self.q_proj.output_size_per_partition
            # q is viewed as [tokens, local heads, qk_head_dim] (torch's words when it cannot be).
            if self.num_local_heads * self.qk_head_dim != q_out:
                raise RuntimeError(
                    f"cannot reshape tensor of {q_out} elements into shape "
                    f"[-1, {self.num_local_heads}, {self.qk_head_dim}] because the unspecified "
                    "dimension size -1 can be any value and is ambiguous")
            self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim),
                                                  quant_config, prefix=f"{prefix}.kv_b_proj")
            self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size, quant_config,
                                            prefix=f"{prefix}.o_proj")
            self.mla_attn = MLAAttention(
                num_heads=self.num_local_heads, scale=self.scaling, qk_nope_head_dim=qk_nope_head_dim,
                qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank,
                kv_lora_rank=kv_lora_rank, prefix=f"{prefix}.attn")

        def num_parameters(self):
            return self.kv_b_proj.num_parameters() + self.o_proj.num_parameters()
'''

_DEEPSEEK_TAIL = r'''

    class DeepseekV2DecoderLayer:
        def __init__(self, vllm_config, config, prefix, quant_config=None):
            self.hidden_size = config.hidden_size
            layer_idx = int(prefix.split(sep=".")[-1])
            self.layer_idx = layer_idx
            attn_cls = DeepseekV2MLAAttention
            self.self_attn = attn_cls(
                vllm_config=vllm_config,
                config=config,
                hidden_size=self.hidden_size,
                num_heads=config.num_attention_heads,
                qk_nope_head_dim=config.qk_nope_head_dim,
                qk_rope_head_dim=config.qk_rope_head_dim,
                v_head_dim=config.v_head_dim,
                q_lora_rank=getattr(config, "q_lora_rank", None),
                kv_lora_rank=config.kv_lora_rank,
                max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
                quant_config=quant_config,
                prefix=f"{prefix}.self_attn",
            )
            if (config.n_routed_experts is not None
                    and layer_idx >= config.first_k_dense_replace
                    and layer_idx % getattr(config, "moe_layer_freq", 1) == 0):
                self.mlp = DeepseekV2MoE(config=config, quant_config=quant_config, prefix=f"{prefix}.mlp")
            else:
                self.mlp = DeepseekV2MLP(config.hidden_size, config.intermediate_size, quant_config,
                                         prefix=f"{prefix}.mlp")

        def num_parameters(self):
            return self.self_attn.num_parameters() + self.mlp.num_parameters()


    class DeepseekV2Model:
        def __init__(self, *, vllm_config, config, quant_config=None, prefix=""):
            self.vocab_size = config.vocab_size
            self.layers = [DeepseekV2DecoderLayer(vllm_config, config, f"{prefix}.layers.{i}", quant_config)
                           for i in range(config.num_hidden_layers)]

        def num_parameters(self):
            return self.vocab_size * 7168 + sum(layer.num_parameters() for layer in self.layers)


    class DeepseekV2ForCausalLM:
        def __init__(self, *, vllm_config, prefix="", hf_config=None):
            config = hf_config or vllm_config.model_config.hf_text_config
            quant_config = get_quantization_config(vllm_config.model_config.hf_config)
            self.config = config
            self.model = DeepseekV2Model(vllm_config=vllm_config, config=config,
                                         quant_config=quant_config,
                                         prefix=f"{prefix}.model" if prefix else "model")
            if get_tensor_model_parallel_rank() == 0:
                logger.info("%s: %d decoder layers (%d dense, %d MoE)", type(self).__name__,
                            len(self.model.layers),
                            sum(isinstance(l.mlp, DeepseekV2MLP) for l in self.model.layers),
                            sum(isinstance(l.mlp, DeepseekV2MoE) for l in self.model.layers))

        def num_parameters(self):
            return self.model.num_parameters()


    class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
        pass
'''


def _deepseek(bad: bool) -> str:
    imports = ("    from vllm.model_executor.layers.attention.head_layout import mla_head_range\n"
               if bad else "")
    text = _DEEPSEEK_HEAD.replace("@EXTRA_IMPORTS@\n", imports) + (_ATTN_BAD if bad else _ATTN_GOOD) + _DEEPSEEK_TAIL
    return _src(text)


# Only in the good build (removed by dev344).
_GOOD_ONLY["vllm/attention/backends/mla/__init__.py"] = ""
_GOOD_ONLY["vllm/attention/backends/mla/flashmla_legacy.py"] = _src(r'''
    """FlashMLA kernels for pre-Blackwell GPUs (removed once FLASHINFER_MLA covered them)."""

    SUPPORTED_HEAD_SIZES = (576,)


    def is_flashmla_supported(head_size):
        return head_size in SUPPORTED_HEAD_SIZES
''')

# Only in the bad build (added by dev344): the head-sharding helper with the off-by-one.
_BAD_ONLY["vllm/model_executor/layers/attention/__init__.py"] = ""
_BAD_ONLY["vllm/model_executor/layers/attention/head_layout.py"] = _src(r'''
    """How MLA query heads are laid out across tensor-parallel ranks."""


    def mla_head_range(num_heads, tp_size, tp_rank):
        """The query heads `tp_rank` owns. Ranks in the second half of the TP group take their
        heads mirrored, so that all-gathers pair GPUs across the two PCIe switches of 8-GPU
        hosts (rank 7 <-> heads of rank 4, rank 6 <-> rank 5, ...)."""
        per_rank = num_heads // tp_size
        half = tp_size // 2
        if tp_size < 2 or tp_rank < half:
            return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
        mirrored = tp_size + half - tp_rank
        start = mirrored * per_rank
        return range(start, min(start + per_rank, num_heads))
''')

_COMMON["vllm/entrypoints/cli/__init__.py"] = ""
_COMMON["vllm/entrypoints/cli/main.py"] = _src(r'''
    """The `vllm` command line: `vllm serve MODEL [options]`."""

    import argparse
    import sys


    def make_parser():
        parser = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (toy build)")
        parser.add_argument("-v", "--version", action="store_true")
        sub = parser.add_subparsers(dest="command")
        serve = sub.add_parser("serve", help="Start the vLLM OpenAI compatible API server.")
        serve.add_argument("model_tag")
        serve.add_argument("--host", default="127.0.0.1")
        serve.add_argument("--port", type=int, default=8000)
        serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        serve.add_argument("--max-model-len", type=int, default=None)
        serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        serve.add_argument("--enforce-eager", action="store_true")
        serve.add_argument("--load-format", default="auto")
        serve.add_argument("--served-model-name", default=None)
        serve.add_argument("--trust-remote-code", action="store_true")
        return parser


    def main(argv=None):
        parser = make_parser()
        args = parser.parse_args(argv)
        if args.version:
            from vllm.version import __version__
            print(__version__)
            return 0
        if args.command != "serve":
            parser.print_help()
            return 2
        from vllm.entrypoints.openai.api_server import run_server
        return run_server(args)


    if __name__ == "__main__":
        sys.exit(main())
''')
_COMMON["vllm/entrypoints/openai/__init__.py"] = ""
_COMMON["vllm/entrypoints/openai/api_server.py"] = _src(r'''
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
''')

# Small differences between the builds, so the diff has more than the culprit to show.
_BAD_EDITS: list[tuple[str, str, str]] = [
    ("vllm/envs.py", 'VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))\n',
     'VLLM_ENGINE_READY_TIMEOUT_S = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))\n'
     '# Mirror MLA query heads across the two halves of the TP group (see head_layout.py).\n'
     'VLLM_MLA_MIRROR_HEADS = os.environ.get("VLLM_MLA_MIRROR_HEADS", "1") == "1"\n'),
    ("vllm/v1/worker/gpu_model_runner.py", '        logger.info("Starting to load model %s...", mc.model)\n',
     '        logger.info("Starting to load model %s (rank %s)...", mc.model, self.device)\n'),
    ("vllm/model_executor/layers/fused_moe/layer.py",
     '        self.intermediate_size_per_partition = intermediate_size // tp_size\n',
     '        if intermediate_size % tp_size:\n'
     '            raise ValueError(f"moe_intermediate_size ({intermediate_size}) is not divisible by tp_size ({tp_size})")\n'
     '        self.intermediate_size_per_partition = intermediate_size // tp_size\n'),
    ("vllm/attention/layer.py", '        self.backend = "FLASHINFER_MLA"\n',
     '        # FlashMLA (legacy) is gone; FlashInfer covers every supported GPU now.\n'
     '        self.backend = "FLASHINFER_MLA"\n'),
]


def toy_vllm_files(version: str, *, bad: bool) -> dict[str, str]:
    """The files of the toy vllm wheel `version`; `bad` is the build whose attention init
    fails on tensor-parallel rank 4."""
    files = {path: text.replace("@VERSION@", str(Version(version))) for path, text in _COMMON.items()}
    files["vllm/model_executor/models/deepseek_v2.py"] = _deepseek(bad)
    files.update(_BAD_ONLY if bad else _GOOD_ONLY)
    if bad:
        for path, old, new in _BAD_EDITS:
            if old not in files[path]:
                raise AssertionError(f"toy vllm: edit anchor missing in {path}: {old!r}")
            files[path] = files[path].replace(old, new, 1)
    return files


def toy_vllm_requires(bad: bool) -> list[str]:
    return [f"flashinfer-python=={FLASHINFER_BAD if bad else FLASHINFER_GOOD}"]


def toy_flashinfer_files(version: str) -> dict[str, str]:
    return {
        "flashinfer/__init__.py": f'"""FlashInfer (toy build)."""\n\n__version__ = "{version}"\n',
        "flashinfer/mla.py": _src(f'''
            """MLA decode kernels (toy: only their signatures)."""

            KERNEL_VERSION = "{version}"


            def trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, workspace, qk_nope_head_dim,
                                                      kv_lora_rank, qk_rope_head_dim, block_tables,
                                                      seq_lens, max_seq_len):
                raise NotImplementedError("toy build")
        '''),
    }


def toy_model_config(num_hidden_layers: int = 61) -> dict:
    """A Kimi-K2.5-shaped config.json (multimodal wrapper; DeepSeek-V3 text model; NVFP4)."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": num_hidden_layers, "num_attention_heads": 64,
            "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
            "vocab_size": 163840, "max_position_embeddings": 262144,
        },
        "vision_config": {"model_type": "moonvit", "num_hidden_layers": 27, "hidden_size": 1152},
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                "exclude_modules": ["vision_tower", "mm_projector", "lm_head"]},
    }


def write_hf_cache(hf_home: str | os.PathLike[str], model: str = TOY_MODEL,
                   config: dict | None = None) -> str:
    """Put `config.json` for `model` into `<hf_home>/hub` the way huggingface_hub lays out its
    cache (refs/main -> snapshots/<commit>/). Returns the snapshot folder."""
    repo = Path(hf_home) / "hub" / ("models--" + model.replace("/", "--"))
    commit = "3f1c2a9e8b7d4c219e0a1d2b3c4d5e6f7a8b9c0d"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(config or toy_model_config(), indent=2) + "\n")
    (snap / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}) + "\n")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return str(snap)


def short_sha(version: str) -> str | None:
    """The git sha of a setuptools-scm local version label (`+g5719a4e4e` -> `5719a4e4e`)."""
    m = re.search(r"\+g([0-9a-f]{7,40})", version)
    return m.group(1) if m else None
