"""Builds the `rewheel why` test corpus (tests/logs/*.log + *.expected.json).

The logs are composed from vLLM's real output formats (logger headers on every traceback
line, `(Worker_TP4 pid=...)` process prefixes, journald short lines, ANSI colours, Python
3.12/3.13 traceback decorations). Each scenario states its expected root cause BY HAND
below; only `log_line` is computed, from where the builder placed the root traceback.
Run `python tests/logs/build_corpus.py` to regenerate; the test suite reads the files only.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
SP = "/root/ml-env/lib/python3.12/site-packages"
SP13 = "/opt/venv/lib/python3.13/site-packages"
MARK = "\0ROOT\0"   # placed before the line the expected root traceback starts on


def hdr(level: str, src: str, ts: str = "02-20 23:31:36") -> str:
    return f"{level} {ts} [{src}] "


def tb(frames: list[tuple], exc: list[str], caret: bool = True) -> list[str]:
    """A Python traceback: frames are (file, line, func, source[, caret-line])."""
    out = ["Traceback (most recent call last):"]
    for fr in frames:
        file, line, func, source = fr[:4]
        out.append(f'  File "{file}", line {line}, in {func}')
        if source is not None:
            out.append(f"    {source}")
            if caret and len(fr) > 4:
                out.append(fr[4])
    return out + exc


def logged(prefix: str, header: str, lines: list[str]) -> list[str]:
    """Each line of one logger record carries the process prefix and the logger header."""
    return [f"{prefix}{header}{ln}" for ln in lines]


def raw(prefix: str, lines: list[str]) -> list[str]:
    return [f"{prefix}{ln}" for ln in lines]


def interleave(*streams: list[str], pattern: list[int] | None = None) -> list[str]:
    """Round-robin (or by `pattern` of stream indexes) until all streams are drained."""
    streams_l = [list(s) for s in streams]
    out: list[str] = []
    i = 0
    while any(streams_l):
        idx = pattern[i % len(pattern)] if pattern else i % len(streams_l)
        i += 1
        if streams_l[idx]:
            out.append(streams_l[idx].pop(0))
    return out


def journald(lines: list[str], ident: str, pid: int, clock: str = "23:31:36", host: str = "llm-two") -> list[str]:
    out = []
    for ln in lines:
        mark = ""
        if ln.startswith(MARK):
            mark, ln = MARK, ln[len(MARK):]
        if ln.startswith("@systemd "):
            out.append(f"{mark}Feb 20 {clock} {host} systemd[1]: {ln[9:]}")
        else:
            out.append(f"{mark}Feb 20 {clock} {host} {ident}[{pid}]: {ln}")
    return out


def write(name: str, lines: list[str], expected: dict | None) -> None:
    text_lines = []
    log_line = None
    for n, ln in enumerate(lines, 1):
        if MARK in ln:
            ln = ln.replace(MARK, "")
            if log_line is None:
                log_line = n
        text_lines.append(ln)
    (HERE / f"{name}.log").write_text("".join(x + "\n" for x in text_lines), encoding="utf-8")
    if expected is not None:
        expected = dict(expected)
        if "log_line" not in expected:
            expected["log_line"] = log_line
    (HERE / f"{name}.expected.json").write_text(
        json.dumps({"root_cause": expected}, indent=2) + "\n", encoding="utf-8")


def mark(lines: list[str]) -> list[str]:
    return [MARK + lines[0]] + lines[1:]


# ---------------------------------------------------------------------------------------
# Building blocks from vLLM's real messages.
VERSION = "0.16.0rc2.dev344+g5719a4e4e"


def api_startup(pid: int) -> list[str]:
    p = f"(APIServer pid={pid}) "
    return [
        p + hdr("INFO", "api_server.py:1891") + f"vLLM API server version {VERSION}",
        p + hdr("INFO", "utils.py:328") + "non-default args: {'model_tag': 'moonshotai/Kimi-K2.5-NVFP4', "
        "'model': 'moonshotai/Kimi-K2.5-NVFP4', 'trust_remote_code': True, 'tensor_parallel_size': 8}",
        p + hdr("INFO", "model.py:547") + "Resolved architecture: DeepseekV3ForCausalLM",
        p + hdr("INFO", "model.py:1510") + "Using max model len 262144",
        p + hdr("WARNING", "arg_utils.py:1775") + "Detected VLLM_USE_V1=1 with Engine in background thread. "
        "Usage should be considered experimental.",
    ]


def engine_startup(pid: int) -> list[str]:
    p = f"(EngineCore_DP0 pid={pid}) "
    return [
        p + hdr("INFO", "core.py:93") + f"Initializing a V1 LLM engine (v{VERSION}) with config: "
        "model='moonshotai/Kimi-K2.5-NVFP4', speculative_config=None, tokenizer='moonshotai/Kimi-K2.5-NVFP4', "
        "dtype=torch.bfloat16, max_seq_len=262144, tensor_parallel_size=8, quantization=modelopt_fp4, "
        "enforce_eager=False, kv_cache_dtype=auto",
        p + hdr("WARNING", "multiproc_executor.py:882") + "Reducing Torch parallelism from 64 threads to 1 to "
        "avoid unnecessary CPU contention. Set OMP_NUM_THREADS in the external environment to tune this value as needed.",
        p + hdr("INFO", "shm_broadcast.py:313") + "vLLM message queue communication handle: "
        "Handle(local_reader_ranks=[0, 1, 2, 3, 4, 5, 6, 7], buffer_handle=(8, 16777216, 10, 'psm_9d1f4c2b'), "
        "local_subscribe_addr='ipc:///tmp/7b1f0c55-1e7e-4bd4-8e9f-1c3b3d0a4e1f', remote_subscribe_addr=None, remote_addr_ipv6=False)",
    ]


def worker_startup(label: str, pid: int, rank: int) -> list[str]:
    p = f"({label} pid={pid}) "
    return [
        p + hdr("INFO", "parallel_state.py:1208") + f"rank {rank} in world size 8 is assigned as DP rank 0, "
        f"PP rank 0, TP rank {rank}, EP rank {rank}",
        p + hdr("INFO", "gpu_model_runner.py:3338") + "Starting to load model moonshotai/Kimi-K2.5-NVFP4...",
        p + hdr("INFO", "cuda.py:366") + "Using FLASHINFER_MLA attention backend out of potential backends: "
        "['FLASHINFER_MLA', 'CUTLASS_MLA', 'FLASH_ATTN_MLA', 'TRITON_MLA']",
    ]


def engine_cascade(pid: int, src: str = "core.py:866", sp: str = SP, raw_copy: bool = True) -> list[str]:
    p = f"(EngineCore_DP0 pid={pid}) "
    frames = [
        (f"{sp}/vllm/v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        (f"{sp}/vllm/v1/engine/core.py", 623, "__init__", "super().__init__("),
        (f"{sp}/vllm/v1/engine/core.py", 103, "__init__", "self.model_executor = executor_class(vllm_config)"),
        (f"{sp}/vllm/v1/executor/abstract.py", 101, "__init__", "self._init_executor()"),
        (f"{sp}/vllm/v1/executor/multiproc_executor.py", 171, "_init_executor",
         "self.workers = WorkerProc.wait_for_ready(unready_workers)"),
        (f"{sp}/vllm/v1/executor/multiproc_executor.py", 660, "wait_for_ready", "raise e from None"),
    ]
    exc = ["Exception: WorkerProc initialization failed due to an exception in a background process. "
           "See stack trace for root cause."]
    out = [p + hdr("ERROR", src) + "EngineCore failed to start."]
    out += logged(p, hdr("ERROR", src), tb(frames, exc))
    if raw_copy:
        out += raw(p, ["Process EngineCore_DP0:"])
        out += raw(p, tb([("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
                          ("/usr/lib/python3.12/multiprocessing/process.py", 108, "run",
                           "self._target(*self._args, **self._kwargs)"),
                          (f"{sp}/vllm/v1/engine/core.py", 870, "run_engine_core", "raise e")] + frames, exc))
    return out


def api_cascade(pid: int, sp: str = SP, failed: str = "{}") -> list[str]:
    p = f"(APIServer pid={pid}) "
    frames = [
        ("/root/ml-env/bin/vllm", 10, "<module>", "sys.exit(main())", "             ^^^^^^"),
        (f"{sp}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
        (f"{sp}/vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
        (f"{sp}/uvloop/__init__.py", 96, "run", "return __asyncio.run("),
        ("uvloop/loop.pyx", 1518, "uvloop.loop.Loop.run_until_complete", None),
        (f"{sp}/vllm/entrypoints/openai/api_server.py", 1945, "run_server",
         "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
        (f"{sp}/vllm/entrypoints/openai/api_server.py", 183, "build_async_engine_client_from_engine_args",
         "async_llm = AsyncLLM.from_vllm_config("),
        (f"{sp}/vllm/v1/engine/async_llm.py", 134, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
        (f"{sp}/vllm/v1/engine/core_client.py", 448, "__init__", "with launch_core_engines(vllm_config, executor_class,"),
        ("/usr/lib/python3.12/contextlib.py", 144, "__exit__", "next(self.gen)"),
        (f"{sp}/vllm/v1/engine/utils.py", 732, "launch_core_engines", "wait_for_engine_startup("),
        (f"{sp}/vllm/v1/engine/utils.py", 785, "wait_for_engine_startup", "raise RuntimeError("),
    ]
    exc = [f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {failed}"]
    return raw(p, tb(frames, exc)) + [
        "/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: "
        "There appear to be 1 leaked shared_memory objects to clean up at shutdown",
        "  warnings.warn('resource_tracker: There appear to be %d '",
    ]


def systemd_crash(restart_counter: int | None, unit: str = "vllm-kimi-k25.service") -> list[str]:
    out = [f"@systemd {unit}: Main process exited, code=exited, status=1/FAILURE",
           f"@systemd {unit}: Failed with result 'exit-code'.",
           f"@systemd {unit}: Consumed 3min 12.345s CPU time, 41.2G memory peak."]
    if restart_counter is not None:
        out += [f"@systemd {unit}: Scheduled restart job, restart counter is at {restart_counter}.",
                f"@systemd Started {unit} - vLLM Kimi-K2.5."]
    return out


WORKER_INIT_FRAMES = [
    (f"{SP}/vllm/v1/executor/multiproc_executor.py", 743, "worker_main", "worker = WorkerProc(*args, **kwargs)",
     "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"),
    (f"{SP}/vllm/v1/executor/multiproc_executor.py", 569, "__init__", "self.worker.load_model()"),
    (f"{SP}/vllm/v1/worker/gpu_worker.py", 273, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
    (f"{SP}/vllm/v1/worker/gpu_model_runner.py", 3460, "load_model", "self.model = model_loader.load_model("),
    (f"{SP}/vllm/model_executor/model_loader/base_loader.py", 49, "load_model", "model = initialize_model("),
]


# ---------------------------------------------------------------------------------------
def story_crash(api: int, engine: int, workers: dict[int, int], failing: list[int], first_mark: bool) -> list[str]:
    """One start of the story's service: Worker_TP4 (and maybe others) die in deepseek_v2.py:998."""
    lines = api_startup(api) + engine_startup(engine)
    for r, pid in workers.items():
        lines += worker_startup(f"Worker_TP{r}", pid, r)
    frames = WORKER_INIT_FRAMES + [
        (f"{SP}/vllm/model_executor/model_loader/utils.py", 48, "initialize_model",
         "return model_class(vllm_config=vllm_config, prefix=prefix)",
         "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1421, "__init__", "self.model = DeepseekV2Model("),
        (f"{SP}/vllm/compilation/decorators.py", 291, "__init__", "old_init(self, **kwargs)"),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1290, "__init__",
         "self.start_layer, self.end_layer, self.layers = make_layers("),
        (f"{SP}/vllm/model_executor/models/utils.py", 641, "make_layers",
         "maybe_offload_to_cpu(layer_fn(prefix=f\"{prefix}.{idx}\"))",
         "                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1292, "<lambda>", "lambda prefix: DeepseekV2DecoderLayer("),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 998, "__init__", "self.self_attn = attn_cls(",
         "                 ^^^^^^^^^"),
    ]
    exc = ["TypeError: DeepseekV2MLAAttention.__init__() got an unexpected keyword argument 'topk_indices_buffer'"]
    streams = []
    for i, r in enumerate(failing):
        p = f"(Worker_TP{r} pid={workers[r]}) "
        h = hdr("ERROR", "multiproc_executor.py:783")
        s = [p + h + "WorkerProc failed to start."] + logged(p, h, tb(frames, exc))
        if i == 0 and first_mark:
            s[1] = MARK + s[1]
        streams.append(s)
    lines += interleave(*streams, pattern=[0, 0, 0] + [k % len(streams) for k in range(len(streams) * 2)]) \
        if len(streams) > 1 else streams[0]
    for r, pid in workers.items():
        if r not in failing:
            lines.append(f"(Worker_TP{r} pid={pid}) " + hdr("WARNING", "multiproc_executor.py:772") + "WorkerProc was terminated")
    lines += engine_cascade(engine)
    lines += api_cascade(api)
    return lines


def build_story() -> tuple[list[str], list[str]]:
    starts = [(216054, 216060, 216066, [4, 1]), (217301, 217307, 217313, [4]), (218544, 218550, 218556, [4, 6])]
    journal_lines: list[str] = ["@systemd Started vllm-kimi-k25.service - vLLM Kimi-K2.5."]
    journal_lines = journald(journal_lines, "vllm-kimi", 0)
    for n, (api, eng, w0, failing) in enumerate(starts):
        workers = {r: w0 + r for r in range(8)}
        crash = story_crash(api, eng, workers, failing, first_mark=(n == 0))
        crash += systemd_crash(n + 1 if n < len(starts) - 1 else None)
        journal_lines += journald(crash, "vllm-kimi", api, clock=f"23:3{1 + n}:36")
    return journal_lines, starts


STORY_EXPECTED = {
    "type": "TypeError",
    "message": "DeepseekV2MLAAttention.__init__() got an unexpected keyword argument 'topk_indices_buffer'",
    "rank": "Worker_TP4",
    "frame": {"file": f"{SP}/vllm/model_executor/models/deepseek_v2.py", "line": 998, "function": "__init__",
              "source": "self.self_attn = attn_cls("},
    "kind": "traceback",
    "count": 5,        # TP4+TP1, TP4, TP4+TP6
    "restarts": 3,
    "secondary_types": ["Exception", "RuntimeError"],
}


def build_all() -> None:
    # 1. The story: multiproc worker failure, journald, interleaved ranks, three crash restarts.
    story, _ = build_story()
    write("story_worker_crash_journald", story, STORY_EXPECTED)
    # The same crash as plain vLLM output (what a smoke test's log looks like), first start only.
    plain = story_crash(216054, 216060, {r: 216066 + r for r in range(8)}, [4, 1], first_mark=True)
    write("story_worker_crash_plain", plain, {**STORY_EXPECTED, "count": 2, "restarts": 1})

    # 2. Engine core failure with TP=1 (the model loads inside EngineCore), ANSI-coloured output.
    c = "\x1b[1;36m(EngineCore_DP0 pid=3712)\x1b[0;0m "
    ca = "\x1b[1;36m(APIServer pid=3650)\x1b[0;0m "
    err = "\x1b[1;31mERROR\x1b[0m 03-02 10:14:07 [core.py:866] "
    frames = [
        (f"{SP}/vllm/v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        (f"{SP}/vllm/v1/engine/core.py", 103, "__init__", "self.model_executor = executor_class(vllm_config)"),
        (f"{SP}/vllm/v1/executor/uniproc_executor.py", 48, "_init_executor", "self.driver_worker.load_model()"),
        (f"{SP}/vllm/v1/worker/gpu_worker.py", 273, "load_model", "self.model_runner.load_model(eep_scale_up=eep_scale_up)"),
        (f"{SP}/vllm/v1/worker/gpu_model_runner.py", 3460, "load_model", "self.model = model_loader.load_model("),
        (f"{SP}/vllm/model_executor/model_loader/base_loader.py", 56, "load_model", "self.load_weights(model, model_config)"),
        (f"{SP}/vllm/model_executor/model_loader/default_loader.py", 300, "load_weights", "loaded_weights = model.load_weights("),
        (f"{SP}/vllm/model_executor/models/qwen3_moe.py", 720, "load_weights", "return loader.load_weights(weights)"),
        (f"{SP}/vllm/model_executor/models/utils.py", 335, "load_weights",
         "autoloaded_weights = set(self._load_module(\"\", self.module, weights))"),
        (f"{SP}/vllm/model_executor/models/utils.py", 261, "_load_module", "loaded_params = module_load_weights(weights)"),
        (f"{SP}/vllm/model_executor/models/qwen3_moe.py", 633, "load_weights", "param = params_dict[name_mapped]",
         "            ~~~~~~~~~~~^^^^^^^^^^^^^"),
    ]
    exc = ["KeyError: 'layers.0.mlp.experts.w2_weight_scale'"]
    lines = [ca + "\x1b[32mINFO\x1b[0m 03-02 10:13:55 [api_server.py:1891] vLLM API server version " + VERSION,
             c + "\x1b[32mINFO\x1b[0m 03-02 10:13:58 [core.py:93] Initializing a V1 LLM engine with config: model='Qwen/Qwen3-30B-A3B-FP8'",
             c + "\x1b[32mINFO\x1b[0m 03-02 10:14:01 [default_loader.py:262] Loading weights took 5.84 seconds",
             c + err + "EngineCore failed to start."]
    lines += mark(logged(c, err, tb(frames, exc)))
    lines += raw(c, ["Process EngineCore_DP0:"]) + raw(c, tb(
        [("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()")] + frames, exc))
    lines += raw(ca, tb([(f"{SP}/vllm/v1/engine/utils.py", 785, "wait_for_engine_startup", "raise RuntimeError(")],
                        ["RuntimeError: Engine core initialization failed. See root cause above. "
                         "Failed core proc(s): {'EngineCore_DP0': 1}"]))
    write("engine_core_failure_ansi", lines, {
        "type": "KeyError", "message": "'layers.0.mlp.experts.w2_weight_scale'", "rank": "EngineCore_DP0",
        "frame": {"file": f"{SP}/vllm/model_executor/models/qwen3_moe.py", "line": 633, "function": "load_weights",
                  "source": "param = params_dict[name_mapped]"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # 3. KV-cache too small (raised in EngineCore), Python 3.13 traceback decorations.
    p = "(EngineCore_DP0 pid=6880) "
    h = hdr("ERROR", "core.py:712", "10-27 14:02:11")
    msg = ("To serve at least one request with the models's max seq len (262144), (30.52 GiB KV cache is needed, "
           "which is larger than the available KV cache memory (11.87 GiB). Based on the available memory, the "
           "estimated maximum model length is 101856. Try increasing `gpu_memory_utilization` or decreasing "
           "`max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/"
           "conserving_memory/ for more details.")
    kv_frames = [
        (f"{SP13}/vllm/v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        (f"{SP13}/vllm/v1/engine/core.py", 498, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"),
        (f"{SP13}/vllm/v1/engine/core.py", 92, "__init__", "self._initialize_kv_caches(vllm_config)",
         "    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^"),
        (f"{SP13}/vllm/v1/engine/core.py", 199, "_initialize_kv_caches",
         "kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,"),
        (f"{SP13}/vllm/v1/core/kv_cache_utils.py", 1243, "get_kv_cache_configs",
         "check_enough_kv_cache_memory(vllm_config, kv_cache_spec_one_worker,",
         "    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"),
    ]
    kv_tb = tb(kv_frames, []) + [
        f'  File "{SP13}/vllm/v1/core/kv_cache_utils.py", line 716, in check_enough_kv_cache_memory',
        "    raise ValueError(", "    ...<6 lines>...", '        f"`max_model_len` when initializing the engine.")',
        f"ValueError: {msg}"]
    lines = [p + hdr("INFO", "gpu_worker.py:298", "10-27 14:02:10") + "Available KV cache memory: 11.87 GiB",
             p + h + "EngineCore failed to start."]
    lines += mark(logged(p, h, kv_tb))
    lines += raw(p, ["Process EngineCore_DP0:"]) + raw(p, kv_tb)
    lines += api_cascade(6815, sp=SP13, failed="{'EngineCore_DP0': 1}")
    write("kv_cache_too_small", lines, {
        "type": "ValueError", "message": msg, "rank": "EngineCore_DP0",
        "frame": {"file": f"{SP13}/vllm/v1/core/kv_cache_utils.py", "line": 716,
                  "function": "check_enough_kv_cache_memory", "source": "raise ValueError("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # 4. CUDA OOM in two workers during the memory profile (busy loop, with vLLM's add_note copy).
    oom = ("CUDA out of memory. Tried to allocate 3.50 GiB. GPU {g} has a total capacity of 94.97 GiB of which "
           "1.19 GiB is free. Including non-PyTorch memory, this process has 93.76 GiB memory in use. Of the "
           "allocated memory 88.02 GiB is allocated by PyTorch, and 4.12 GiB is reserved by PyTorch but "
           "unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
           "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    oom_frames = [
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 957, "worker_busy_loop", "output = func(*args, **kwargs)"),
        (f"{SP}/torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
        (f"{SP}/vllm/v1/worker/gpu_worker.py", 311, "determine_available_memory", "self.model_runner.profile_run()"),
        (f"{SP}/vllm/v1/worker/gpu_model_runner.py", 4012, "profile_run", "hidden_states, last_hidden_states = self._dummy_run("),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1180, "forward", "hidden_states = self.mlp(hidden_states)"),
        (f"{SP}/torch/nn/modules/module.py", 1775, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
        (f"{SP}/vllm/model_executor/layers/fused_moe/fused_moe.py", 1603, "fused_experts_impl",
         "intermediate_cache1 = torch.empty("),
        (f"{SP}/torch/_ops.py", 1243, "__call__", "return self._op(*args, **kwargs)"),
    ]
    streams = []
    for g, pid in ((0, 41230), (1, 41231)):
        pw = f"(Worker_TP{g} pid={pid}) "
        hw = hdr("ERROR", "multiproc_executor.py:962", "05-20 20:54:32")
        e = [f"torch.OutOfMemoryError: {oom.format(g=g)}"]
        rec = [pw + hw + "WorkerProc hit an exception."] + logged(pw, hw, tb(oom_frames, e) + tb(oom_frames, e))
        streams.append(rec)
    streams[0][1] = MARK + streams[0][1]
    body = interleave(*streams, pattern=[0, 0, 0, 0, 1])
    eng = "(EngineCore_DP0 pid=41200) "
    he = hdr("ERROR", "core.py:866", "05-20 20:54:33")
    body += [eng + he + "EngineCore failed to start."] + logged(eng, he, tb([
        (f"{SP}/vllm/v1/engine/core.py", 219, "_initialize_kv_caches",
         "available_gpu_memory = self.model_executor.determine_available_memory()"),
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 264, "get_response", "raise RuntimeError("),
    ], [f"RuntimeError: Worker failed with error '{oom.format(g=0)}', please check the stack trace above for the root cause"]))
    body += api_cascade(41150)
    lines = journald([hdr("INFO", "gpu_model_runner.py:3380", "05-20 20:54:10").join(["(Worker_TP0 pid=41230) ",
                     "Model loading took 88.02 GiB memory and 412.5 seconds"])] + body, "vllm-kimi", 41150, clock="20:54:32")
    write("cuda_oom_worker_journald", lines, {
        "type": "torch.OutOfMemoryError", "message": oom.format(g=0), "rank": "Worker_TP0",
        "frame": {"file": f"{SP}/vllm/model_executor/layers/fused_moe/fused_moe.py", "line": 1603,
                  "function": "fused_experts_impl", "source": "intermediate_cache1 = torch.empty("},
        "kind": "traceback", "count": 2, "restarts": 1,
        # the engine core's "Worker failed with error ..." and the API server's cascade
        "secondary_types": ["RuntimeError", "RuntimeError"]})

    # 5. Unsupported GPU architecture (older `VllmWorker rank=N` prefixes), multi-line CUDA message.
    warn = ["/root/ml-env/lib/python3.12/site-packages/torch/cuda/__init__.py:287: UserWarning: ",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition with CUDA capability sm_120 is not compatible with the "
            "current PyTorch installation.",
            "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.",
            "  warnings.warn("]
    cuda_msg = ["RuntimeError: CUDA error: no kernel image is available for execution on the device",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.",
                "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", ""]
    arch_frames = [
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 492, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 364, "__init__", "self.worker.init_device()"),
        (f"{SP}/vllm/worker/worker_base.py", 606, "init_device", "self.worker.init_device()  # type: ignore"),
        (f"{SP}/vllm/v1/worker/gpu_worker.py", 165, "init_device", "init_worker_distributed_environment(self.vllm_config,"),
        (f"{SP}/vllm/distributed/parallel_state.py", 1009, "initialize_model_parallel", "_TP = init_model_parallel_group("),
        (f"{SP}/vllm/distributed/device_communicators/cuda_communicator.py", 45, "__init__",
         "self.pynccl_comm = PyNcclCommunicator("),
        (f"{SP}/vllm/distributed/device_communicators/pynccl.py", 143, "__init__", "data = torch.zeros(1, device=device)"),
    ]
    lines = raw("", warn)
    streams = []
    for r, pid in ((0, 63590), (1, 63591)):
        pw = f"(VllmWorker rank={r} pid={pid}) "
        hw = hdr("ERROR", "multiproc_executor.py:527", "06-20 12:27:37")
        streams.append([pw + hw + "WorkerProc failed to start."] + logged(pw, hw, tb(arch_frames, cuda_msg, caret=False)))
    streams[0][1] = MARK + streams[0][1]
    lines += interleave(*streams)
    lines += engine_cascade(63540, src="core.py:515")
    write("unsupported_gpu_arch", lines, {
        "type": "RuntimeError", "message": "\n".join(m[len("RuntimeError: "):] if i == 0 else m
                                                    for i, m in enumerate(cuda_msg[:-1])),
        "rank": "VllmWorker rank=0",
        "frame": {"file": f"{SP}/vllm/distributed/device_communicators/pynccl.py", "line": 143,
                  "function": "__init__", "source": "data = torch.zeros(1, device=device)"},
        "kind": "traceback", "count": 2, "restarts": 1, "secondary_types": ["Exception"]})

    # 6. Import error after the upgrade: undefined symbol in vllm._C; systemd restarts it 5 times.
    sym = (f"{SP}/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib")
    imp_frames = [
        ("/root/ml-env/bin/vllm", 5, "<module>", "from vllm.entrypoints.cli.main import main"),
        (f"{SP}/vllm/entrypoints/cli/__init__.py", 3, "<module>",
         "from vllm.entrypoints.cli.benchmark.latency import BenchmarkLatencySubcommand"),
        (f"{SP}/vllm/entrypoints/cli/benchmark/latency.py", 5, "<module>", "from vllm.benchmarks.latency import add_cli_args, main"),
        (f"{SP}/vllm/benchmarks/latency.py", 18, "<module>", "from vllm.engine.arg_utils import EngineArgs"),
        (f"{SP}/vllm/engine/arg_utils.py", 34, "<module>", "from vllm.config import (BlockSize, CacheConfig, CacheDType,"),
        (f"{SP}/vllm/platforms/__init__.py", 276, "__getattr__", "_current_platform = resolve_obj_by_qualname("),
        (f"{SP}/vllm/utils/__init__.py", 2556, "resolve_obj_by_qualname", "module = importlib.import_module(module_name)"),
        ("/usr/lib/python3.12/importlib/__init__.py", 90, "import_module", "return _bootstrap._gcd_import(name[level:], package, level)"),
        (f"{SP}/vllm/platforms/cuda.py", 18, "<module>", "import vllm._C  # noqa"),
    ]
    lines = journald(["@systemd Started vllm-kimi-k25.service - vLLM Kimi-K2.5."], "vllm-kimi", 0, clock="23:40:01")
    for n in range(5):
        pid = 230100 + n * 37
        body = tb(imp_frames, [f"ImportError: {sym}"])
        if n == 0:
            body = mark(body)
        body += systemd_crash(n + 1 if n < 4 else None)
        if n == 4:
            body += ["@systemd vllm-kimi-k25.service: Start request repeated too quickly.",
                     "@systemd vllm-kimi-k25.service: Failed with result 'exit-code'.",
                     "@systemd Failed to start vllm-kimi-k25.service - vLLM Kimi-K2.5."]
        lines += journald(body, "vllm-kimi", pid, clock=f"23:40:{11 + 10 * n}")
    write("import_undefined_symbol_restarts", lines, {
        "type": "ImportError", "message": sym, "rank": None,
        "frame": {"file": f"{SP}/vllm/platforms/cuda.py", "line": 18, "function": "<module>",
                  "source": "import vllm._C  # noqa"},
        "kind": "traceback", "count": 5, "restarts": 5, "secondary_types": []})

    # 7. Config validation error (pydantic) in the API server, before any engine starts.
    pa = "(APIServer pid=91234) "
    val_msg = ["1 validation error for ModelConfig",
               "  Value error, The checkpoint you are trying to load has model type `kimi_k25` but Transformers "
               "does not recognize this architecture. This could be because of an issue with the checkpoint, or "
               "because your version of Transformers is out of date. [type=value_error, input_value=ArgsKwargs((), "
               "{'model': 'moonshotai/Kimi-K2.5-NVFP4', 'trust_remote_code': True}), input_type=ArgsKwargs]",
               "    For further information visit https://errors.pydantic.dev/2.12/v/value_error"]
    val_frames = [
        ("/root/ml-env/bin/vllm", 10, "<module>", "sys.exit(main())"),
        (f"{SP}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
        (f"{SP}/vllm/entrypoints/openai/api_server.py", 166, "build_async_engine_client_from_engine_args",
         "vllm_config = engine_args.create_engine_config(usage_context=usage_context)"),
        (f"{SP}/vllm/engine/arg_utils.py", 1335, "create_engine_config", "model_config = self.create_model_config()"),
        (f"{SP}/vllm/engine/arg_utils.py", 1190, "create_model_config", "return ModelConfig("),
        (f"{SP}/pydantic/_internal/_dataclasses.py", 123, "__init__",
         "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"),
    ]
    lines = [pa + hdr("INFO", "api_server.py:1891", "02-21 09:12:03") + f"vLLM API server version {VERSION}",
             pa + hdr("INFO", "utils.py:328", "02-21 09:12:03") + "non-default args: {'model': 'moonshotai/Kimi-K2.5-NVFP4'}"]
    lines += mark(raw(pa, tb(val_frames, ["pydantic_core._pydantic_core.ValidationError: " + val_msg[0]] + val_msg[1:])))
    write("config_validation_error", lines, {
        "type": "pydantic_core._pydantic_core.ValidationError", "message": "\n".join(val_msg), "rank": "APIServer",
        "frame": {"file": f"{SP}/vllm/engine/arg_utils.py", "line": 1190, "function": "create_model_config",
                  "source": "return ModelConfig("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # 8. NCCL error on four ranks, tracebacks interleaved line by line; TP2 starts first.
    nccl_frames = [
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 743, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
        (f"{SP}/vllm/v1/executor/multiproc_executor.py", 560, "__init__", "self.worker.init_device()"),
        (f"{SP}/vllm/v1/worker/gpu_worker.py", 218, "init_device", "init_worker_distributed_environment("),
        (f"{SP}/vllm/distributed/parallel_state.py", 1208, "initialize_model_parallel", "_TP = init_model_parallel_group("),
        (f"{SP}/vllm/distributed/parallel_state.py", 376, "__init__", "self.device_communicator = device_comm_cls("),
        (f"{SP}/vllm/distributed/device_communicators/cuda_communicator.py", 75, "__init__", "self.pynccl_comm = PyNcclCommunicator("),
        (f"{SP}/vllm/distributed/device_communicators/pynccl.py", 127, "__init__",
         "self.comm: ncclComm_t = self.nccl.ncclCommInitRank("),
        (f"{SP}/vllm/distributed/device_communicators/pynccl_wrapper.py", 369, "ncclCommInitRank",
         'self.NCCL_CHECK(self._funcs["ncclCommInitRank"](ctypes.byref(comm),'),
        (f"{SP}/vllm/distributed/device_communicators/pynccl_wrapper.py", 308, "NCCL_CHECK",
         'raise RuntimeError(f"NCCL error: {error_str}")'),
    ]
    nexc = ["RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"]
    body = []
    for r in range(4):
        body.append(f"(Worker_TP{r} pid={52010 + r}) llm-two:{52010 + r}:{52010 + r} [{r}] transport/p2p.cc:275 "
                    "NCCL WARN Cuda failure 'peer access is not supported between these two devices'")
    streams = []
    for r in (2, 0, 3, 1):
        pw = f"(Worker_TP{r} pid={52010 + r}) "
        hw = hdr("ERROR", "multiproc_executor.py:783")
        streams.append([pw + hw + "WorkerProc failed to start."] + logged(pw, hw, tb(nccl_frames, nexc)))
    streams[0][1] = MARK + streams[0][1]
    body += interleave(*streams, pattern=[0, 0, 1, 2, 3])
    body += engine_cascade(52001)
    body += api_cascade(52000)
    write("nccl_error_interleaved", journald(body, "vllm-kimi", 52000), {
        "type": "RuntimeError", "message": "NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "rank": "Worker_TP2",
        "frame": {"file": f"{SP}/vllm/distributed/device_communicators/pynccl_wrapper.py", "line": 308,
                  "function": "NCCL_CHECK", "source": 'raise RuntimeError(f"NCCL error: {error_str}")'},
        "kind": "traceback", "count": 4, "restarts": 1, "secondary_types": ["Exception", "RuntimeError"]})

    # 9. NCCL abort without a Python traceback: the best error line is the root.
    w3 = "(Worker_TP3 pid=52213) "
    dead = ("EngineCore encountered an issue. See stack trace (above) for the root cause.")
    body = [
        "(APIServer pid=52200) " + hdr("INFO", "loggers.py:123") + "Engine 000: Avg prompt throughput: 812.3 tokens/s, "
        "Avg generation throughput: 95.1 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.1%",
        MARK + w3 + "llm-two:52213:52290 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        w3 + "llm-two:52213:52290 [3] NCCL INFO include/alloc.h:125 -> 1",
        w3 + "Fatal Python error: Aborted",
        w3 + "",
        w3 + "Thread 0x00007f3a2bfff640 (most recent call first):",
        w3 + f'  File "{SP}/vllm/distributed/device_communicators/pynccl.py", line 151 in all_reduce',
        w3 + f'  File "{SP}/vllm/distributed/parallel_state.py", line 498 in _all_reduce_out_place',
        "(EngineCore_DP0 pid=52201) " + hdr("ERROR", "multiproc_executor.py:149", "02-20 23:31:37")
        + "Worker proc VllmWorker-3 died unexpectedly, shutting down executor.",
    ]
    body += raw("(APIServer pid=52200) ", tb([(f"{SP}/vllm/v1/engine/async_llm.py", 439, "generate",
                                               "out = q.get_nowait() or await q.get()")],
                                             [f"vllm.v1.engine.exceptions.EngineDeadError: {dead}"]))
    write("nccl_abort_no_traceback", journald(body, "vllm-kimi", 52200), {
        "type": "NCCL error",
        "message": "llm-two:52213:52290 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        "rank": "Worker_TP3", "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": None})

    # 10. Chained: a bare KeyError answered with a telling ValueError ("During handling ...").
    pa = "(APIServer pid=7001) "
    k_frames = [(f"{SP}/transformers/models/auto/configuration_auto.py", 1271, "from_pretrained",
                 "config_class = CONFIG_MAPPING[config_dict[\"model_type\"]]"),
                (f"{SP}/transformers/models/auto/configuration_auto.py", 966, "__getitem__", "raise KeyError(key)")]
    v_frames = [("/root/ml-env/bin/vllm", 10, "<module>", "sys.exit(main())"),
                (f"{SP}/vllm/engine/arg_utils.py", 1190, "create_model_config", "return ModelConfig("),
                (f"{SP}/vllm/config/model.py", 512, "__post_init__", "hf_config = get_config(self.hf_config_path or self.model,"),
                (f"{SP}/vllm/transformers_utils/config.py", 510, "get_config", "config = AutoConfig.from_pretrained("),
                (f"{SP}/transformers/models/auto/configuration_auto.py", 1273, "from_pretrained", "raise ValueError(")]
    vmsg = ("The checkpoint you are trying to load has model type `kimi_k25` but Transformers does not recognize "
            "this architecture. This could be because of an issue with the checkpoint, or because your version "
            "of Transformers is out of date.")
    chain = tb(k_frames, ["KeyError: 'kimi_k25'", "", "During handling of the above exception, another exception occurred:", ""]) \
        + tb(v_frames, [f"ValueError: {vmsg}"])
    lines = [pa + hdr("INFO", "api_server.py:1891") + f"vLLM API server version {VERSION}"] + mark(raw(pa, chain))
    write("chained_during_handling", lines, {
        "type": "ValueError", "message": vmsg, "rank": "APIServer",
        "frame": {"file": f"{SP}/vllm/transformers_utils/config.py", "line": 510, "function": "get_config",
                  "source": "config = AutoConfig.from_pretrained("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["KeyError"]})

    # 11. Chained: "The above exception was the direct cause" — the cause is the root.
    pw = "(Worker_TP0 pid=8810) "
    hw = hdr("ERROR", "multiproc_executor.py:783")
    s_frames = WORKER_INIT_FRAMES + [
        (f"{SP}/vllm/model_executor/model_loader/default_loader.py", 276, "load_weights", "loaded_weights = model.load_weights("),
        (f"{SP}/vllm/model_executor/models/deepseek_v2.py", 1610, "load_weights", "for name, loaded_weight in weights:"),
        (f"{SP}/vllm/model_executor/model_loader/weight_utils.py", 760, "safetensors_weights_iterator",
         'with safe_open(st_file, framework="pt") as f:'),
    ]
    r_frames = [(f"{SP}/vllm/v1/executor/multiproc_executor.py", 743, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
                (f"{SP}/vllm/model_executor/model_loader/weight_utils.py", 765, "safetensors_weights_iterator",
                 'raise RuntimeError(f"Failed to load checkpoint shard {st_file}") from e')]
    smsg = "Error while deserializing header: MetadataIncompleteBuffer"
    chain = tb(s_frames, [f"safetensors_rust.SafetensorError: {smsg}", "",
                          "The above exception was the direct cause of the following exception:", ""]) \
        + tb(r_frames, ["RuntimeError: Failed to load checkpoint shard /models/kimi/model-00012-of-000064.safetensors"])
    lines = [pw + hw + "WorkerProc failed to start."] + mark(logged(pw, hw, chain)) + engine_cascade(8800, raw_copy=False)
    write("chained_direct_cause", lines, {
        "type": "safetensors_rust.SafetensorError", "message": smsg, "rank": "Worker_TP0",
        "frame": {"file": f"{SP}/vllm/model_executor/model_loader/weight_utils.py", "line": 760,
                  "function": "safetensors_weights_iterator", "source": 'with safe_open(st_file, framework="pt") as f:'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError", "Exception"]})

    # 12. Truncated at the end: the log stops inside the failing worker's traceback.
    story = story_crash(216054, 216060, {r: 216066 + r for r in range(8)}, [2], first_mark=True)
    cut = next(i for i, ln in enumerate(story) if "deepseek_v2.py\", line 1290" in ln) + 2
    write("truncated_end", story[:cut], {
        "type": None, "message": "(traceback cut off before its exception line: the log is truncated)",
        "rank": "Worker_TP2",
        "frame": {"file": f"{SP}/vllm/model_executor/models/deepseek_v2.py", "line": 1290, "function": "__init__",
                  "source": "self.start_layer, self.end_layer, self.layers = make_layers("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # 13. Truncated at the start (`--since` cut the traceback's head off).
    whole = logged(p, h, kv_tb)
    start = next(i for i, ln in enumerate(whole) if "line 199, in _initialize_kv_caches" in ln)
    lines = whole[start:] + raw(p, ["Process EngineCore_DP0:"]) + raw(p, kv_tb) + api_cascade(6815, sp=SP13)
    write("truncated_start", lines, {
        "type": "ValueError", "message": msg, "rank": "EngineCore_DP0",
        "frame": {"file": f"{SP13}/vllm/v1/core/kv_cache_utils.py", "line": 716,
                  "function": "check_enough_kv_cache_memory", "source": "raise ValueError("},
        "kind": "traceback", "log_line": 1, "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # 14. Empty, and healthy (no error at all; INFO chatter that mentions errors must not count).
    write("empty", [], None)
    healthy = api_startup(3001) + engine_startup(3002)
    for r in range(2):
        healthy += worker_startup(f"Worker_TP{r}", 3003 + r, r)
    healthy += [
        "(APIServer pid=3001) " + hdr("INFO", "launcher.py:34") + "Route: /v1/chat/completions, Methods: POST",
        "(APIServer pid=3001) INFO:     Started server process [3001]",
        "(APIServer pid=3001) INFO:     Application startup complete.",
        "(APIServer pid=3001) INFO:     127.0.0.1:50644 - \"GET /health HTTP/1.1\" 200 OK",
        "(APIServer pid=3001) " + hdr("INFO", "loggers.py:123") + "Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, "
        "Prefix cache hit rate: 0.0%, errors: 0",
        "(APIServer pid=3001) " + hdr("INFO", "serving_chat.py:139") + "Using default chat sampling params from model: "
        "{'temperature': 0.6, 'top_p': 0.95}",
    ]
    write("healthy_no_errors", healthy, None)

    # 15. A warning-level traceback early on (handled), then the real crash at error level.
    pw0 = "(Worker_TP0 pid=9100) "
    lines = [pw0 + hdr("WARNING", "registry.py:612") + "Unable to load fused kernel; falling back to Triton:"]
    lines += logged(pw0, hdr("WARNING", "registry.py:612"), tb(
        [(f"{SP}/vllm/model_executor/layers/quantization/utils/fp4_utils.py", 41, "<module>", "import cutlass_fp4_ext")],
        ["ModuleNotFoundError: No module named 'cutlass_fp4_ext'"]))
    pw1 = "(Worker_TP1 pid=9101) "
    hw1 = hdr("ERROR", "multiproc_executor.py:783")
    lines += [pw1 + hw1 + "WorkerProc failed to start."] + mark(logged(pw1, hw1, tb(WORKER_INIT_FRAMES + [
        (f"{SP}/vllm/model_executor/layers/quantization/modelopt.py", 1120, "create_weights",
         "raise NotImplementedError("),
    ], ["NotImplementedError: NVFP4 MoE on sm_120 requires FlashInfer >= 0.6.4 (found 0.6.3)"])))
    lines += engine_cascade(9050, raw_copy=False)
    write("warning_traceback_then_crash", lines, {
        "type": "NotImplementedError", "message": "NVFP4 MoE on sm_120 requires FlashInfer >= 0.6.4 (found 0.6.3)",
        "rank": "Worker_TP1",
        "frame": {"file": f"{SP}/vllm/model_executor/layers/quantization/modelopt.py", "line": 1120,
                  "function": "create_weights", "source": "raise NotImplementedError("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["Exception"]})

    # 16. Killed by the kernel's OOM killer: systemd says so; vLLM only shows the cascade.
    body = ["(Worker_TP5 pid=61005) " + hdr("INFO", "default_loader.py:262") + "Loading weights took 212.33 seconds",
            MARK + "@systemd vllm-kimi-k25.service: A process of this unit has been killed by the OOM killer.",
            "(EngineCore_DP0 pid=61001) " + hdr("ERROR", "multiproc_executor.py:149")
            + "Worker proc VllmWorker-5 died unexpectedly, shutting down executor."]
    body += engine_cascade(61001, raw_copy=False)
    body += api_cascade(61000)
    body += ["@systemd vllm-kimi-k25.service: Main process exited, code=exited, status=1/FAILURE",
             "@systemd vllm-kimi-k25.service: Failed with result 'oom-kill'."]
    write("host_oom_killer", journald(body, "vllm-kimi", 61000), {
        "type": "out of memory (OOM killer)",
        "message": "vllm-kimi-k25.service: A process of this unit has been killed by the OOM killer.",
        "rank": None, "frame": None, "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": None})

    # 17. Python 3.11+ exception group (asyncio.TaskGroup in the API server): the root is the
    # sub-exception inside the `| ` margins, not the group or the cancelled sibling task.
    pa = "(APIServer pid=72000) "
    ha = hdr("ERROR", "api_server.py:1820", "03-30 09:12:44")
    group = [
        "  + Exception Group Traceback (most recent call last):",
        f'  |   File "{SP}/vllm/entrypoints/openai/api_server.py", line 1811, in run_server',
        "  |     async with asyncio.TaskGroup() as tg:",
        "  |                ^^^^^^^^^^^^^^^^^^^",
        '  |   File "/usr/lib/python3.12/asyncio/taskgroups.py", line 145, in __aexit__',
        "  |     raise me from None",
        "  | ExceptionGroup: unhandled errors in a TaskGroup (2 sub-exceptions)",
        "  +-+---------------- 1 ----------------",
        "    | asyncio.exceptions.CancelledError",
        "    +---------------- 2 ----------------",
        "    | Traceback (most recent call last):",
        f'    |   File "{SP}/vllm/entrypoints/openai/api_server.py", line 1790, in build_app_state',
        "    |     await init_app_state(engine_client, vllm_config, app.state, args)",
        f'    |   File "{SP}/vllm/entrypoints/openai/serving_models.py", line 88, in init_app_state',
        "    |     raise ValueError(f\"served model name {name!r} is not a valid identifier\")",
        "    | ValueError: served model name 'Kimi K2.5' is not a valid identifier",
        "    +------------------------------------",
    ]
    body = [pa + hdr("INFO", "api_server.py:1700", "03-30 09:12:40") + "vLLM API server version " + VERSION]
    body += mark(logged(pa, ha, group))
    body += [pa + hdr("INFO", "launcher.py:80", "03-30 09:12:44") + "Shutting down FastAPI HTTP server."]
    write("exception_group_taskgroup", body, {
        "type": "ValueError", "message": "served model name 'Kimi K2.5' is not a valid identifier",
        "rank": "APIServer",
        "frame": {"file": f"{SP}/vllm/entrypoints/openai/serving_models.py", "line": 88,
                  "function": "init_app_state",
                  "source": "raise ValueError(f\"served model name {name!r} is not a valid identifier\")"},
        "kind": "traceback", "count": 1, "restarts": 1,
        "secondary_types": ["ExceptionGroup", "asyncio.exceptions.CancelledError"]})


if __name__ == "__main__":
    build_all()
