"""Builds the "logs as they are collected" part of the `rewheel why` corpus.

Each scenario is one shape real crash logs take once a collector, a paste or another
runtime has been at them: collector wrappers (docker compose, `kubectl logs --prefix`, CI
timestamps, journald's output modes, syslog, `srun -l`, `nohup` progress bars), damaged
pastes (colour codes without their ESC byte, right padding, frame lines without quotes,
ranks interleaved character by character, lost indentation, quoted replies), structured
(JSON) logs with an escaped traceback, other runtimes (sglang, Ray, IPython, pytest,
torchrun, NCCL watchdog dumps), cascades raised while shutting down, and a message that
ends where the smoke runner's own lines begin. The logs are written here from the formats
those tools print; the expected root cause of each is stated BY HAND below (only
`log_line` is computed, from where the root's first line was placed).
Run `python tests/logs/build_shapes.py` to regenerate; the test suite reads the files only.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
SP = "/opt/venv/lib/python3.12/site-packages"
MARK = "\0ROOT\0"   # placed before the line the expected root starts on


def write(name: str, lines: list[str], expected: dict | None, *, newline: str = "\n") -> None:
    out = []
    log_line = None
    for n, ln in enumerate(lines, 1):
        if MARK in ln:
            ln = ln.replace(MARK, "")
            log_line = log_line or n
        out.append(ln)
    (HERE / f"{name}.log").write_text("".join(x + newline for x in out), encoding="utf-8", newline="")
    if expected is not None:
        expected = {"log_line": log_line, **expected}
    (HERE / f"{name}.expected.json").write_text(json.dumps({"root_cause": expected}, indent=2) + "\n",
                                                encoding="utf-8")


def worker_tb(exc: str = "RuntimeError: CUDA error: an illegal memory access was encountered") -> list[str]:
    """A vLLM worker's traceback (execute_model -> the sampler)."""
    return [
        "Traceback (most recent call last):",
        f'  File "{SP}/vllm/v1/executor/multiproc_executor.py", line 596, in worker_busy_loop',
        "    output = func(*args, **kwargs)",
        f'  File "{SP}/vllm/v1/worker/gpu_model_runner.py", line 1513, in execute_model',
        "    sampler_output = self.sampler(",
        f'  File "{SP}/vllm/v1/sample/ops/topk_topp_sampler.py", line 191, in apply_top_k_top_p',
        "    top_k_mask = logits_sort.size(1) - k.to(torch.long)",
        exc,
    ]


SAMPLER_FRAME = {"file": f"{SP}/vllm/v1/sample/ops/topk_topp_sampler.py", "line": 191,
                 "function": "apply_top_k_top_p", "source": "top_k_mask = logits_sort.size(1) - k.to(torch.long)"}
CUDA_MSG = "CUDA error: an illegal memory access was encountered"


def vllm_worker_crash(prefix: str = "(VllmWorker rank=2 pid=4711) ") -> list[str]:
    """A worker's error record, then the engine's cascade."""
    h = "ERROR 07-28 15:07:00 [multiproc_executor.py:600] "
    out = [prefix + "INFO 07-28 15:06:58 [gpu_worker.py:255] Available KV cache memory: 22.62 GiB",
           prefix + h + "WorkerProc hit an exception."]
    out += [(MARK if i == 0 else "") + prefix + h + ln for i, ln in enumerate(worker_tb())]
    e = "ERROR 07-28 15:07:01 [core.py:634] "
    out += [e + "EngineCore encountered a fatal error.", e + "Traceback (most recent call last):",
            e + f'  File "{SP}/vllm/v1/engine/core.py", line 625, in run_engine_core',
            e + "    engine_core.run_busy_loop()",
            e + "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered', "
                "please check the stack trace above for the root cause"]
    return out


WORKER_EXPECT = {"type": "RuntimeError", "message": CUDA_MSG, "frame": SAMPLER_FRAME, "kind": "traceback",
                 "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]}


def build_all() -> None:
    # -- collector wrappers ----------------------------------------------------------
    body = vllm_worker_crash()
    write("wrap_docker_compose", [f"vllm-1  | {ln}" for ln in body],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "vllm-1"})
    write("wrap_kubectl_prefix", [f"[pod/vllm-7d9f/vllm] {ln}" for ln in body],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "vllm-7d9f"})
    write("wrap_ci_timestamps", [f"2025-07-28T15:07:00.{9685040 + i:07d}Z {ln}" for i, ln in enumerate(body)],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711})
    # journald's modes: short-iso, short-precise, short-monotonic, cat (no prefix at all)
    write("journald_short_iso", [f"2025-07-28T15:07:00+0000 gpu-07 vllm[4700]: {ln}" for ln in body],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "gpu-07"})
    write("journald_short_precise", [f"Jul 28 15:07:00.{i:06d} gpu-07 vllm[4700]: {ln}" for i, ln in enumerate(body)],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "gpu-07"})
    write("journald_short_monotonic", [f"[ 8123.{i:06d}] gpu-07 vllm[4700]: {ln}" for i, ln in enumerate(body)],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "gpu-07"})
    # journalctl -o json saved to a file: one entry per line; a multi-line message in one entry
    entries = []
    for i, ln in enumerate(body):
        entries.append((MARK if MARK in ln else "") + json.dumps(
            {"__REALTIME_TIMESTAMP": str(1753715220000000 + i), "_HOSTNAME": "gpu-07", "_PID": "4700",
             "SYSLOG_IDENTIFIER": "vllm", "MESSAGE": ln.replace(MARK, "")}))
    write("journald_json", entries, {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "gpu-07"})
    write("syslog_rfc5424", [f"<11>1 2025-07-28T15:07:00.968504+00:00 gpu-07 vllm 4700 - - {ln}" for ln in body],
          {**WORKER_EXPECT, "rank": "VllmWorker rank=2", "pid": 4711, "node": "gpu-07"})

    # srun -l: task numbers, two tasks' tracebacks interleaved line by line; task 1 first
    t1 = ["Traceback (most recent call last):",
          '  File "/work/train.py", line 40, in <module>',
          "    main()",
          '  File "/work/train.py", line 31, in main',
          "    loss = model(batch).loss",
          f'  File "{SP}/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl',
          "    return self._call_impl(*args, **kwargs)",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
          "of 79.10 GiB of which 1.02 GiB is free."]
    t0 = [ln.replace("GPU 1", "GPU 0") for ln in t1]
    lines = ["0: step 10 loss 2.31", "1: step 10 loss 2.29"]
    for i in range(len(t1)):
        lines.append((MARK if i == 0 else "") + f"1: {t1[i]}")
        lines.append(f"0: {t0[i]}")
    lines += ["srun: error: gpu-03: tasks 0-1: Exited with exit code 1"]
    write("srun_ranks", lines, {
        "type": "torch.OutOfMemoryError", "message": t1[-1].split(": ", 1)[1], "rank": "rank1",
        "frame": {"file": f"{SP}/torch/nn/modules/module.py", "line": 1751, "function": "_wrapped_call_impl",
                  "source": "return self._call_impl(*args, **kwargs)"},
        "kind": "traceback", "count": 2, "restarts": 1, "secondary_types": []})

    # nohup: progress bars redrawn with \r, a logger line glued to a bar
    bar = "".join(f"\rLoading safetensors checkpoint shards: {p:3d}% Completed | {p // 25}/4 [00:0{p // 25}<00:01,"
                  f"  1.2it/s]" for p in (0, 25, 50))
    h = "ERROR 07-28 15:07:00 [core.py:708] "
    tb = ["Traceback (most recent call last):",
          f'  File "{SP}/vllm/model_executor/model_loader/weight_utils.py", line 512, in safetensors_weights_iterator',
          "    with safe_open(st_file, framework=\"pt\") as f:",
          "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"]
    lines = ["INFO 07-28 15:06:50 [core.py:70] Initializing a V1 LLM engine",
             h + "EngineCore failed to start.", bar + MARK + h + tb[0], *[h + ln for ln in tb[1:]],
             "INFO 07-28 15:07:01 [launcher.py:80] Shutting down."]
    write("nohup_progress_bars", lines, {
        "type": "safetensors_rust.SafetensorError",
        "message": "Error while deserializing header: MetadataIncompleteBuffer", "rank": None,
        "frame": {"file": f"{SP}/vllm/model_executor/model_loader/weight_utils.py", "line": 512,
                  "function": "safetensors_weights_iterator", "source": "with safe_open(st_file, framework=\"pt\") as f:"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- damaged pastes ----------------------------------------------------------------
    # colour codes that lost ESC, lines right-padded to the terminal's width, frame lines
    # whose quotes were lost
    p = "[1;36m(VllmWorker rank=1 pid=229)[0;0m "
    h = "ERROR 06-12 01:21:13 [multiproc_executor.py:527] "
    tb = [ln.replace('File "', "File ").replace('", line', ", line") for ln in worker_tb()]
    lines = [p + "INFO 06-12 01:21:10 [gpu_worker.py:255] Available KV cache memory: 22.62 GiB",
             *[(MARK if i == 0 else "") + (p + h + ln).ljust(220) for i, ln in enumerate(tb)],
             "[1;31mERROR[0m 06-12 01:21:14 [core.py:634] EngineCore encountered a fatal error."]
    write("paste_damaged", lines, {**WORKER_EXPECT, "rank": "VllmWorker rank=1", "pid": 229,
                                   "secondary_types": []})

    # ranks interleaved character by character: no traceback survives; the first clean
    # `Type: message` line is the answer, not a keyword in prose before it
    a = "Traceback (most recent call last):"
    garbled = "".join(x + y for x, y in zip(a, a, strict=True))
    lines = ["If you get `CUDA error: invalid device function` errors, the paths above might be the cause.",
             garbled, 'FFiillee  ""//wwoorrkk//xx..ppyy"",,  lliinnee  33',
             MARK + "ValueError: expected sequence of length 4 at dim 1 (got 3)",
             "ValueError: expected sequence of length 4 at dim 1 (got 3)"]
    write("paste_chars_interleaved", lines, {
        "type": "ValueError", "message": "ValueError: expected sequence of length 4 at dim 1 (got 3)", "rank": None,
        "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": ["CUDA error"]})  # the prose before it: listed, never the root

    # -- other runtimes -----------------------------------------------------------------
    # sglang: the traceback is one record, begun mid-line after a header naming the ranks
    lines = ["[2025-07-28 15:06:59 DP0 TP0] Load weight end. type=DeepseekV3ForCausalLM, avail mem=12.31 GB",
             MARK + "[2025-07-28 15:07:00 DP0 TP1] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2312, in run_scheduler_process',
             "    scheduler.event_loop_overlap()",
             '  File "/sgl-workspace/sglang/python/sglang/srt/layers/moe/ep_moe/layer.py", line 271, in forward',
             "    assert self.num_experts % self.tp_size == 0",
             "AssertionError",
             "",
             "[2025-07-28 15:07:00] Received sigquit from a child process. It usually means the child failed.",
             "[2025-07-28 15:07:00 DP0 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2312, in run_scheduler_process',
             "    scheduler.event_loop_overlap()",
             "EOFError"]
    write("sglang_scheduler_exception", lines, {
        "type": "AssertionError", "message": "", "rank": "DP0 TP1",
        "frame": {"file": "/sgl-workspace/sglang/python/sglang/srt/layers/moe/ep_moe/layer.py", "line": 271,
                  "function": "forward", "source": "assert self.num_experts % self.tp_size == 0"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["EOFError"]})

    # Ray: the driver's traceback ends in RayTaskError(X), nested twice, then the remote frames
    lines = ["2025-07-28 15:07:00,101 ERROR tune_controller.py:1374 -- Trial task failed for trial T_0001",
             MARK + "Traceback (most recent call last):",
             f'  File "{SP}/ray/_private/worker.py", line 2624, in get',
             "    raise value.as_instanceof_cause()",
             "ray.exceptions.RayTaskError(KeyError): ray::_Inner.train() (pid=3455, ip=10.68.12.214, "
             "actor_id=3ae8e14d, repr=TorchTrainer)",
             f'  File "{SP}/ray/train/_internal/utils.py", line 43, in check_for_failure',
             "    ray.get(object_ref)",
             "ray.exceptions.RayTaskError(KeyError): ray::_RayTrainWorker__execute.get_next() (pid=6302, "
             "ip=10.68.23.157, actor_id=7789599, repr=<RayTrainWorker object at 0x7f83c6ae1720>)",
             f'  File "{SP}/ray/train/_internal/worker_group.py", line 33, in __execute',
             "    raise skipped from exception_cause(skipped)",
             f'  File "{SP}/transformers/models/auto/configuration_auto.py", line 1022, in from_pretrained',
             "    config_class = CONFIG_MAPPING[config_dict[\"model_type\"]]",
             "KeyError: 'qwen3_next'"]
    write("ray_nested_task_error", lines, {
        "type": "KeyError", "message": "'qwen3_next'", "rank": "_RayTrainWorker__execute pid=6302",
        "pid": 6302, "node": "10.68.23.157",
        "frame": {"file": f"{SP}/transformers/models/auto/configuration_auto.py", "line": 1022,
                  "function": "from_pretrained", "source": "config_class = CONFIG_MAPPING[config_dict[\"model_type\"]]"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # IPython 8 / Jupyter: `Cell In[..]`, `File path:N, in Class.f(...)`, `--> N` arrows
    lines = ["Requirement already satisfied: bitsandbytes in /opt/venv/lib/python3.12/site-packages (0.45.0)",
             "---------------------------------------------------------------------------",
             MARK + "ValueError                                Traceback (most recent call last)",
             "Cell In[3], line 15",
             "     13 config = AutoConfig.from_pretrained(path)",
             "---> 15 model = AutoModelForCausalLM.from_pretrained(path, load_in_4bit=True).to('cuda')",
             "",
             f"File {SP}/transformers/modeling_utils.py:3895, in PreTrainedModel.to(self, *args, **kwargs)",
             "   3893 if getattr(self, 'is_quantized', False):",
             "-> 3895     raise ValueError(",
             "   3896         '`.to` is not supported for `4-bit` or `8-bit` bitsandbytes models.'",
             "   3897     )",
             "",
             "ValueError: `.to` is not supported for `4-bit` or `8-bit` bitsandbytes models."]
    write("ipython_traceback", lines, {
        "type": "ValueError", "message": "`.to` is not supported for `4-bit` or `8-bit` bitsandbytes models.",
        "rank": None,
        "frame": {"file": f"{SP}/transformers/modeling_utils.py", "line": 3895, "function": "to",
                  "source": "raise ValueError("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # pytest: `E   ` lines and the location line under them
    lines = ["============================= test session starts ==============================",
             "tests/test_model.py F                                                    [100%]",
             "=================================== FAILURES ===================================",
             "_________________________________ test_load ___________________________________",
             "",
             "    def test_load():",
             ">       load_model('tiny')",
             "",
             "tests/test_model.py:12: ",
             "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _",
             "",
             "    def load_model(name):",
             "        if name not in REGISTRY:",
             ">           raise LookupError(f'unknown model {name!r}')",
             MARK + "E           LookupError: unknown model 'tiny'",
             "E           (registered: base, large)",
             "",
             "src/models/registry.py:41: LookupError",
             "=========================== short test summary info ============================",
             "FAILED tests/test_model.py::test_load - LookupError: unknown model 'tiny'"]
    write("pytest_failure", lines, {
        "type": "LookupError", "message": "unknown model 'tiny'\n(registered: base, large)", "rank": None,
        "frame": {"file": "src/models/registry.py", "line": 41, "function": "load_model", "source": None},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # torchrun: the child's own traceback ([rank3]:), then the ChildFailedError summary
    r = "[rank3]: "
    lines = ["W0728 15:07:00.123000 140 torch/distributed/run.py:793 Setting OMP_NUM_THREADS",
             MARK + r + "Traceback (most recent call last):",
             r + '  File "/work/train.py", line 88, in <module>',
             r + "    main()",
             r + '  File "/work/train.py", line 61, in main',
             r + "    dist.all_reduce(t)",
             r + f'  File "{SP}/torch/distributed/c10d_logger.py", line 81, in wrapper',
             r + "    return func(*args, **kwargs)",
             r + "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
                 "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
             "E0728 15:07:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
             "local_rank: 3 (pid: 2231) of binary: /opt/venv/bin/python",
             "Traceback (most recent call last):",
             '  File "/opt/venv/bin/torchrun", line 8, in <module>',
             "    sys.exit(main())",
             f'  File "{SP}/torch/distributed/run.py", line 892, in main',
             "    run(args)",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================",
             "train.py FAILED",
             "------------------------------------------------------------",
             "Root Cause (first observed failure):",
             "[0]:",
             "  time      : 2025-07-28_15:07:05",
             "  host      : gpu-03",
             "  rank      : 3 (local_rank: 3)",
             "  exitcode  : 1 (pid: 2231)",
             "============================================================"]
    write("torchrun_child_failed", lines, {
        "type": "torch.distributed.DistBackendError",
        "message": "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error (run "
                   "with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        "rank": "rank3",
        "frame": {"file": f"{SP}/torch/distributed/c10d_logger.py", "line": 81, "function": "wrapper",
                  "source": "return func(*args, **kwargs)"},
        "kind": "traceback", "count": 1, "restarts": 1,
        "secondary_types": ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError"]})

    # an error raised in the executor's shutdown after an NCCL watchdog abort: a cascade
    lines = ["[rank0]:[E728 15:07:00.000000000 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
             "Process group watchdog thread terminated with exception: NCCL error: unhandled cuda error",
             MARK + "RuntimeError: NCCL error: unhandled cuda error, NCCL version 2.21.5",
             "ERROR 07-28 15:07:01 [core.py:700] Traceback (most recent call last):",
             f'ERROR 07-28 15:07:01 [core.py:700]   File "{SP}/vllm/v1/executor/multiproc_executor.py", line 301, in shutdown',
             "ERROR 07-28 15:07:01 [core.py:700]     for w in self.workers:",
             "ERROR 07-28 15:07:01 [core.py:700] AttributeError: 'MultiprocExecutor' object has no attribute 'workers'"]
    write("shutdown_cascade_after_nccl", lines, {
        "type": "RuntimeError", "message": "RuntimeError: NCCL error: unhandled cuda error, NCCL version 2.21.5",
        # the `[rank0]:` record just before the unprefixed line names its process
        "rank": "rank0", "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": ["NCCL error", "AttributeError"]})  # the watchdog's line, the shutdown's error

    # the smoke runner's own lines after the error are not part of its message
    lines = [MARK + "Traceback (most recent call last):",
             f'  File "{SP}/vllm/model_executor/models/deepseek_v2.py", line 998, in __init__',
             "    self.self_attn = attn_cls(",
             "TypeError: DeepseekV2MLAAttention.__init__() got an unexpected keyword argument 'topk_indices_buffer'",
             "vllm_init: FAILED during model init after 41.2s: TypeError: DeepseekV2MLAAttention.__init__() got "
             "an unexpected keyword argument 'topk_indices_buffer'",
             'vllm_init: timings {"import_s": 12.1, "total_s": 41.2}']
    write("smoke_runner_lines_end_message", lines, {
        "type": "TypeError",
        "message": "DeepseekV2MLAAttention.__init__() got an unexpected keyword argument 'topk_indices_buffer'",
        "rank": None,
        "frame": {"file": f"{SP}/vllm/model_executor/models/deepseek_v2.py", "line": 998, "function": "__init__",
                  "source": "self.self_attn = attn_cls("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})


    # Ray tasks: `(pid=N)` prefixes without an actor name; lines de-duplicated across workers
    p = "(pid=41877, ip=10.40.2.17) "
    lines = ["(raylet) [2025-07-28 15:06:59,001 I 912 912] (raylet) Starting worker",
             MARK + p + "Traceback (most recent call last):",
             p + '  File "/work/preprocess.py", line 22, in tokenize_shard',
             p + "    ids = tok(batch)[\"input_ids\"]",
             p + "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
             "(pid=41878, ip=10.40.2.18) UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
             "invalid start byte [repeated 7x across cluster]"]
    write("ray_task_pid_prefix", lines, {
        "type": "UnicodeDecodeError",
        "message": "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte", "rank": "pid=41877",
        "pid": 41877, "node": "10.40.2.17",
        "frame": {"file": "/work/preprocess.py", "line": 22, "function": "tokenize_shard",
                  "source": "ids = tok(batch)[\"input_ids\"]"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # pytest --tb=short: the frames' locations come before the E lines
    lines = ["=================================== FAILURES ===================================",
             "__________________________________ test_load ___________________________________",
             "tests/test_model.py:12: in test_load",
             "    load_model('tiny')",
             "src/models/registry.py:41: in load_model",
             "    raise LookupError(f'unknown model {name!r}')",
             MARK + "E   LookupError: unknown model 'tiny'",
             "=========================== short test summary info ============================",
             "FAILED tests/test_model.py::test_load - LookupError: unknown model 'tiny'"]
    write("pytest_short_traceback", lines, {
        "type": "LookupError", "message": "unknown model 'tiny'", "rank": None,
        "frame": {"file": "src/models/registry.py", "line": 41, "function": "load_model", "source": None},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # an NCCL watchdog dump with no Python traceback: C++'s terminate and its what()
    r = "[rank1]:"
    lines = [r + "[E728 15:07:00.000 ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Watchdog caught collective operation "
                 "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                 "600031 milliseconds before timing out.",
             r + "[E728 15:07:00.000 ProcessGroupNCCL.cpp:583] [Rank 1] To avoid data inconsistency, we are taking "
                 "the entire process down.",
             "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 "
             "(most recent call first):",
             "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f3a in "
             "/opt/venv/lib/python3.12/site-packages/torch/lib/libc10.so)",
             MARK + "terminate called after throwing an instance of 'c10::DistBackendError'",
             "  what():  [PG 0 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog "
             "caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600031 milliseconds "
             "before timing out.",
             "Fatal Python error: Aborted"]
    write("nccl_watchdog_terminate", lines, {
        "type": "c10::DistBackendError",
        "message": "[PG 0 Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught "
                   "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600031 milliseconds "
                   "before timing out.",
        # C++'s report has no prefix: its text (and the `[rank1]:` records before it) name the rank
        "rank": "rank1", "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": ["NCCL error", "fatal signal"]})


    # torchrun: a child killed by a signal has no traceback; the summary names it
    lines = ["E0728 15:09:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
             "local_rank: 1 (pid: 2231) of binary: /opt/venv/bin/python",
             "Traceback (most recent call last):",
             '  File "/opt/venv/bin/torchrun", line 8, in <module>',
             "    sys.exit(main())",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================",
             "train.py FAILED",
             "------------------------------------------------------------",
             "Root Cause (first observed failure):",
             "[0]:",
             "  time      : 2025-07-28_15:09:05",
             "  host      : gpu-03",
             "  rank      : 1 (local_rank: 1)",
             "  exitcode  : -9 (pid: 2231)",
             "  error_file: <N/A>",
             MARK + "  traceback : Signal 9 (SIGKILL) received by PID 2231",
             "============================================================"]
    write("torchrun_child_signal", lines, {
        "type": "fatal signal", "message": "Signal 9 (SIGKILL) received by PID 2231", "rank": "rank1",
        "pid": 2231, "node": "gpu-03", "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError"]})


    # a segfault: faulthandler's dump names where the current thread died (innermost first)
    lines = ["INFO 07-28 15:07:00 [gpu_model_runner.py:1500] Loading model",
             MARK + "Fatal Python error: Segmentation fault",
             "",
             "Thread 0x00007f3a2bfff640 (most recent call first):",
             '  File "/usr/lib/python3.12/threading.py", line 355 in wait',
             '  File "/usr/lib/python3.12/threading.py", line 1030 in _bootstrap',
             "",
             "Current thread 0x00007f3a9c1d2740 (most recent call first):",
             f'  File "{SP}/flash_attn/flash_attn_interface.py", line 91 in _flash_attn_forward',
             f'  File "{SP}/vllm/attention/backends/flash_attn.py", line 412 in forward',
             f'  File "{SP}/torch/nn/modules/module.py", line 1762 in _call_impl',
             "",
             "Extension modules: numpy.core._multiarray_umath, torch._C (total: 42)",
             "Segmentation fault (core dumped)"]
    write("faulthandler_segfault", lines, {
        "type": "fatal signal", "message": "Fatal Python error: Segmentation fault", "rank": None,
        # the corpus is read with --package vllm: the innermost frame inside vllm
        "frame": {"file": f"{SP}/vllm/attention/backends/flash_attn.py", "line": 412, "function": "forward",
                  "source": None},
        "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": ["fatal signal"]})


    # a structured (JSON) log: the traceback is one escaped string field
    tb = ["Traceback (most recent call last):",
          '  File "/app/server.py", line 88, in handle',
          "    out = model.generate(req)",
          f'  File "{SP}/vllm/entrypoints/llm.py", line 401, in generate',
          '    raise ValueError(f"prompt too long: {n}")',
          "ValueError: prompt too long: 40000"]
    lines = [json.dumps({"ts": "2025-07-28T15:06:59Z", "level": "info", "msg": "serving"}),
             MARK + json.dumps({"ts": "2025-07-28T15:07:00Z", "level": "error", "msg": "request failed",
                                "exc": "\n".join(tb)})]
    write("json_escaped_traceback", lines, {
        "type": "ValueError", "message": "prompt too long: 40000", "rank": None,
        "frame": {"file": f"{SP}/vllm/entrypoints/llm.py", "line": 401, "function": "generate",
                  "source": 'raise ValueError(f"prompt too long: {n}")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # a log quoted in a reply (markdown "> ")
    lines = ["I see the same thing on 0.10.1:",
             MARK + "> Traceback (most recent call last):",
             f'>   File "{SP}/vllm/v1/worker/gpu_worker.py", line 190, in load_model',
             ">     self.model_runner.load_model()",
             "> torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
             "",
             "Any idea?"]
    write("quoted_in_reply", lines, {
        "type": "torch.OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 1.00 GiB.", "rank": None,
        "frame": {"file": f"{SP}/vllm/v1/worker/gpu_worker.py", "line": 190, "function": "load_model",
                  "source": "self.model_runner.load_model()"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})


# -- third round: the shapes real logs still came in ------------------------------------
def build_round3() -> None:
    """Prefixes stacked on or before a traceback, tracebacks inside an exception's message,
    ranks interleaved without prefixes, and crashes with no Python traceback at all."""
    # sglang under Ray (verl): the traceback begins mid-line after sglang's header, and every
    # line of it carries Ray's prefix for the worker
    ray = "(WorkerDict pid=2791, ip=10.0.3.14) "
    lines = [ray + "[2025-05-12 09:41:02 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
                   "avail mem=41.08 GB, mem usage=14.42 GB.",
             ray + "[2025-05-12 09:41:07 TP1] Capture cuda graph begin. This can take up to several minutes.",
             MARK + ray + "[2025-05-12 09:41:09 TP1] Scheduler hit an exception: Traceback (most recent call last):",
             ray + '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/scheduler.py", line 2311, '
                   "in run_scheduler_process",
             ray + "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank)",
             ray + '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/model_executor/model_runner.py", '
                   "line 1183, in init_cuda_graphs",
             ray + "    self.cuda_graph_runner = CudaGraphRunner(self)",
             ray + '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/model_executor/cuda_graph_runner.py", '
                   "line 317, in __init__",
             ray + "    raise Exception(",
             ray + "Exception: Capture cuda graph failed: CUDA error: out of memory",
             ray + "Possible solutions:",
             ray + "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
             ray + "",
             "(WorkerDict pid=2790, ip=10.0.3.14) [2025-05-12 09:41:10] Received sigquit from a child process. "
             "It usually means the child failed.",
             "Error executing job with overrides: ['trainer.n_gpus_per_node=2']",
             "Traceback (most recent call last):",
             '  File "/workspace/verl/verl/trainer/main_ppo.py", line 64, in run_ppo',
             "    ray.get(runner.run.remote(config))",
             "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."]
    write("ray_prefix_midline_traceback", lines, {
        "type": "Exception",
        "message": "Capture cuda graph failed: CUDA error: out of memory\nPossible solutions:\n"
                   "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "rank": "WorkerDict pid=2791 TP1", "pid": 2791, "node": "10.0.3.14",
        "frame": {"file": "/usr/local/lib/python3.10/dist-packages/sglang/srt/model_executor/cuda_graph_runner.py",
                  "line": 317, "function": "__init__", "source": "raise Exception("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["ray.exceptions.ActorDiedError"]})

    # SkyPilot over Ray over torchrun: three prefixes on every line
    sky = "(worker1, rank=1, pid=4121, ip=10.128.0.7) "
    r4 = "[rank4]: [rank4]: "
    tb = ["Traceback (most recent call last):",
          '  File "/home/sky/sky_workdir/train.py", line 212, in <module>',
          "    trainer.train()",
          f'  File "{SP}/transformers/trainer.py", line 2241, in train',
          "    return inner_training_loop(",
          f'  File "{SP}/torch/nn/modules/module.py", line 1762, in _call_impl',
          "    return forward_call(*args, **kwargs)",
          f'  File "{SP}/torch/nn/parallel/distributed.py", line 1637, in forward',
          "    inputs, kwargs = self._pre_forward(*inputs, **kwargs)",
          "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
          "This error indicates that your module has parameters that were not used in producing loss."]
    lines = [sky + "[rank4]: [rank4]:[W512 09:41:02.000 ProcessGroupNCCL.cpp:4561] [PG ID 0 PG GUID 0 Rank 4] "
                   "using GPU 0 to perform barrier as devices used by this process are currently unknown.",
             *[(MARK if i == 0 else "") + sky + r4 + ln for i, ln in enumerate(tb)],
             "(worker0, rank=0, pid=3988, ip=10.128.0.6) W0512 09:41:09.000000 3988 torch/distributed/elastic/"
             "multiprocessing/api.py:897] Sending process 4019 closing signal SIGTERM",
             "ERROR: Job 1 failed with return code list: [0, 1]"]
    write("stacked_prefixes_skypilot", lines, {
        "type": "RuntimeError", "message": tb[-1].split(": ", 1)[1], "rank": "worker1, rank=1 rank4",
        "pid": 4121, "node": "10.128.0.7",
        "frame": {"file": f"{SP}/torch/nn/parallel/distributed.py", "line": 1637, "function": "forward",
                  "source": "inputs, kwargs = self._pre_forward(*inputs, **kwargs)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # Docker Desktop's log view: its own timestamp and a bar before vLLM's prefixes
    def dd(i: int, ln: str) -> str:
        return f"2025-10-14 17:12:{33 + i // 10:02d}.{412 + i:03d} | {ln}"
    e = "(EngineCore_DP0 pid=271) ERROR 10-14 09:12:33 [core.py:708] "
    tb = ["Traceback (most recent call last):",
          f'  File "{SP}/vllm/v1/engine/core.py", line 699, in run_engine_core',
          "    engine_core = EngineCoreProc(*args, **kwargs)",
          f'  File "{SP}/vllm/v1/worker/gpu_worker.py", line 239, in determine_available_memory',
          "    self.model_runner.profile_run()",
          f'  File "{SP}/vllm/v1/worker/utils.py", line 295, in request_memory',
          "    raise ValueError(",
          "ValueError: Free memory on device (6.9/23.99 GiB) on startup is less than desired GPU memory "
          "utilization (0.9, 21.59 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
          "processes."]
    body = ["(APIServer pid=1) INFO 10-14 09:12:20 [api_server.py:1896] vLLM API server version 0.11.0",
            "(EngineCore_DP0 pid=271) INFO 10-14 09:12:31 [core.py:77] Initializing a V1 LLM engine (v0.11.0)",
            e + "EngineCore failed to start.",
            *[(MARK if i == 0 else "") + e + ln for i, ln in enumerate(tb)],
            "(EngineCore_DP0 pid=271) Process EngineCore_DP0:",
            "(APIServer pid=1) Traceback (most recent call last):",
            f'(APIServer pid=1)   File "{SP}/vllm/v1/engine/utils.py", line 878, in wait_for_engine_startup',
            "(APIServer pid=1)     raise RuntimeError(",
            "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}"]
    write("docker_desktop_engine_core", [dd(i, ln) for i, ln in enumerate(body)], {
        "type": "ValueError", "message": tb[-1].split(": ", 1)[1], "rank": "EngineCore_DP0", "pid": 271,
        "frame": {"file": f"{SP}/vllm/v1/worker/utils.py", "line": 295, "function": "request_memory",
                  "source": "raise ValueError("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # two ranks launched without prefixes: their identical tracebacks interleaved line by
    # line, and rank 0's exception line run into rank 1's source line
    def oom(gpu: int) -> str:
        return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {gpu} has a total "
                "capacity of 79.25 GiB of which 1.43 GiB is free.")
    frames = [('/work/finetune.py', 96, '<module>', 'main()'),
              ('/work/finetune.py', 81, 'main', 'loss = model(**batch).loss'),
              (f'{SP}/torch/nn/modules/module.py', 1762, '_call_impl', 'return forward_call(*args, **kwargs)'),
              (f'{SP}/transformers/models/llama/modeling_llama.py', 561, 'forward',
               'logits = self.lm_head(hidden_states[:, slice_indices, :])')]
    one = ["Traceback (most recent call last):"]
    for f, n, fn, src in frames:
        one += [f'  File "{f}", line {n}, in {fn}', f"    {src}"]
    lines = ["[2025-05-12 09:41:00] loading checkpoint shards: 100%"]
    for i, ln in enumerate(one):
        lines += [(MARK if i == 0 else "") + ln, ln]
    lines[-1] = lines[-1] + oom(0)     # rank 0's exception line glued to rank 1's last source line
    lines += [oom(1),
              "E0512 09:41:09.000000 140 torch/distributed/elastic/multiprocessing/api.py:874] failed "
              "(exitcode: 1) local_rank: 0 (pid: 3301) of binary: /opt/venv/bin/python"]
    write("ranks_interleaved_no_prefix", lines, {
        "type": "torch.OutOfMemoryError", "message": oom(1).split(": ", 1)[1], "rank": None,
        "frame": {"file": f"{SP}/transformers/models/llama/modeling_llama.py", "line": 561, "function": "forward",
                  "source": "logits = self.lm_head(hidden_states[:, slice_indices, :])"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # Ray Serve: the replica's error comes back as RayTaskError(RuntimeError) whose message is
    # the replica's formatted traceback; its innermost exception is the cause
    lines = ["INFO 2025-05-12 09:41:02,101 proxy 10.0.0.45 -- Proxy starting on node 9f2c (HTTP port: 8000).",
             MARK + "Traceback (most recent call last):",
             '  File "/app/client.py", line 18, in <module>',
             "    print(handle.remote(payload).result())",
             f'  File "{SP}/ray/serve/handle.py", line 398, in result',
             "    return self._fetch_future_result_sync(timeout_s)",
             "ray.exceptions.RayTaskError(RuntimeError): ray::ServeReplica:default:Classifier."
             "handle_request_with_rejection() (pid=2868, ip=10.0.0.45, actor_id=9b1c, "
             "repr=<ray.serve._private.replica.ServeReplica:default:Classifier object at 0x7f5e1c2a3d90>)",
             f'  File "{SP}/ray/serve/_private/utils.py", line 168, in wrap_to_ray_error',
             "    raise exception",
             "RuntimeError: Traceback (most recent call last):",
             f'  File "{SP}/ray/serve/_private/replica.py", line 1090, in call_user_method',
             "    result = await method_to_call(*request_args, **request_kwargs)",
             '  File "/app/serve_app.py", line 31, in __call__',
             "    return self.model.predict(features)",
             '  File "/app/serve_app.py", line 22, in predict',
             '    raise ValueError(f"expected 4 features, got {len(x)}")',
             "ValueError: expected 4 features, got 3",
             ""]
    write("ray_serve_wrapped_traceback", lines, {
        "type": "ValueError", "message": "expected 4 features, got 3",
        "rank": "ServeReplica:default:Classifier pid=2868", "pid": 2868, "node": "10.0.0.45",
        "frame": {"file": "/app/serve_app.py", "line": 22, "function": "predict",
                  "source": 'raise ValueError(f"expected 4 features, got {len(x)}")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # PyTorch DataLoader: the worker's traceback re-raised in the main process, inside the
    # message after "Original Traceback"
    lines = ["Epoch 3:  41%|████      | 205/500 [01:12<01:44,  2.83it/s, loss=0.412]",
             MARK + "Traceback (most recent call last):",
             '  File "/work/train.py", line 140, in <module>',
             "    for step, batch in enumerate(loader):",
             f'  File "{SP}/torch/utils/data/dataloader.py", line 1480, in _next_data',
             "    return self._process_data(data)",
             f'  File "{SP}/torch/utils/data/dataloader.py", line 1505, in _process_data',
             "    data.reraise()",
             f'  File "{SP}/torch/_utils.py", line 733, in reraise',
             "    raise exception",
             "RuntimeError: Caught RuntimeError in DataLoader worker process 0.",
             "Original Traceback (most recent call last):",
             f'  File "{SP}/torch/utils/data/_utils/worker.py", line 349, in _worker_loop',
             "    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]",
             f'  File "{SP}/torch/utils/data/_utils/collate.py", line 213, in collate_tensor_fn',
             "    return torch.stack(batch, 0, out=out)",
             "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and "
             "[3, 224, 225] at entry 5",
             ""]
    write("dataloader_worker_reraise", lines, {
        "type": "RuntimeError", "message": lines[-2].split(": ", 1)[1], "rank": None,
        "frame": {"file": f"{SP}/torch/utils/data/_utils/collate.py", "line": 213, "function": "collate_tensor_fn",
                  "source": "return torch.stack(batch, 0, out=out)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["RuntimeError"]})

    # an older torch's NCCL watchdog: no Python traceback, no `[rankN]:` prefix; the rank is
    # in the text
    lines = ["[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
             "WorkNCCL(SeqNum=1517, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
             "1800546 milliseconds before timing out.",
             "[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to the asynchronous "
             "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
             "[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire process down.",
             MARK + "terminate called after throwing an instance of 'std::runtime_error'",
             "  what():  [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1517, "
             "OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800546 milliseconds before "
             "timing out.",
             "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 18221 closing signal SIGTERM",
             "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 2 (pid: 18223) "
             "of binary: /usr/bin/python3"]
    write("nccl_watchdog_rank_text", lines, {
        "type": "std::runtime_error", "message": lines[4].split("what():", 1)[1].strip(), "rank": "rank2",
        "frame": None, "kind": "error-line", "count": 1, "restarts": 1,
        "secondary_types": ["NCCL error"]})

    # older sglang: the header names the rank on the record before the traceback, whose lines
    # carry no prefix and no pid
    lines = ["[2024-08-20 10:00:01 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.17 GB",
             "[2024-08-20 10:00:01 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.17 GB",
             "[2024-08-20 10:00:05 TP1] Exception in ModelTpServer:",
             MARK + "Traceback (most recent call last):",
             '  File "/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py", line 237, in exposed_step',
             "    self.forward_step()",
             '  File "/sgl-workspace/sglang/python/sglang/srt/layers/sampler.py", line 96, in forward',
             "    batch_next_token_ids, success = flashinfer_top_k_top_p(probs, top_ks, top_ps)",
             "RuntimeError: CUDA error: device-side assert triggered",
             "",
             "[2024-08-20 10:00:05 TP0] Exception in ControllerSingle:"]
    write("sglang_tp_header_no_pid", lines, {
        "type": "RuntimeError", "message": "CUDA error: device-side assert triggered", "rank": "TP1",
        "frame": {"file": "/sgl-workspace/sglang/python/sglang/srt/layers/sampler.py", "line": 96,
                  "function": "forward", "source": "batch_next_token_ids, success = flashinfer_top_k_top_p(probs, top_ks, top_ps)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # two ranks' characters interleaved within one line: rank 0's exception line is lost in
    # rank 1's; rank 1's own exception line comes out clean after it
    def tb_lines() -> list[str]:
        return ["Traceback (most recent call last):",
               '  File "/work/train.py", line 61, in main',
               "    dist.all_reduce(t)",
               f'  File "{SP}/torch/distributed/distributed_c10d.py", line 2806, in all_reduce',
               "    work = group.allreduce([tensor], opts)"]
    exc = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
           "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
    a, b = "[rank0]: " + exc, "[rank1]: " + exc
    mixed = "".join(x + y for x, y in zip(a[:60], b[:60], strict=True)) + a[60:]
    lines = []
    for i, ln in enumerate(tb_lines()):
        lines += ["[rank0]: " + ln, (MARK if i == 0 else "") + "[rank1]: " + ln]
    lines += [mixed, b, "W0512 09:41:09.000000 140 torch/distributed/elastic/multiprocessing/api.py:897] "
                        "Sending process 3302 closing signal SIGTERM"]
    write("ranks_chars_interleaved_line", lines, {
        "type": "torch.distributed.DistBackendError", "message": exc.split(": ", 1)[1], "rank": "rank1",
        "frame": {"file": f"{SP}/torch/distributed/distributed_c10d.py", "line": 2806, "function": "all_reduce",
                  "source": "work = group.allreduce([tensor], opts)"},
        # rank 0's traceback, cut off where its exception line was lost: listed, never the root
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": [None]})


    # a wrapper nobody listed, on every line (DeepSpeed's pdsh launcher: "worker-1: "), learnt
    # from the prefixes it stands before
    tb = ["Traceback (most recent call last):",
          '  File "/work/train_ds.py", line 77, in <module>',
          "    engine.backward(loss)",
          f'  File "{SP}/deepspeed/runtime/zero/stage_1_and_2.py", line 2051, in backward',
          "    self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total capacity of "
          "79.10 GiB of which 3.21 GiB is free."]
    lines = ["worker-0: [2025-05-12 09:41:00,101] [INFO] [launch.py:146:main] WORLD INFO DICT: {'worker-0': [0, 1]}",
             *[(MARK if i == 0 else "") + "worker-1: [rank2]: " + ln for i, ln in enumerate(tb)],
             "worker-1: [2025-05-12 09:41:09,001] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 5120",
             "worker-1: [2025-05-12 09:41:09,002] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', "
             "'-u', 'train_ds.py'] exits with return code = 1",
             "pdsh@worker-0: worker-1: ssh exited with exit code 1"]
    write("unknown_wrapper_pdsh", lines, {
        "type": "torch.OutOfMemoryError", "message": tb[-1].split(": ", 1)[1], "rank": "rank2",
        "frame": {"file": f"{SP}/deepspeed/runtime/zero/stage_1_and_2.py", "line": 2051, "function": "backward",
                  "source": "self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # TGI: the shard's traceback after the launcher's record, blank lines between frames, the
    # rank as a structured field after the message
    lines = ["2024-04-18T10:44:10.101010Z  INFO text_generation_launcher: Starting shard rank=0",
             "2024-04-18T10:44:19.170164Z ERROR shard-manager: text_generation_launcher: Shard complete standard "
             "error output:",
             "",
             MARK + "Traceback (most recent call last):",
             "",
             '  File "/opt/conda/bin/text-generation-server", line 8, in <module>',
             "    sys.exit(app())",
             "",
             '  File "/opt/conda/lib/python3.10/site-packages/text_generation_server/models/__init__.py", '
             "line 301, in get_model",
             '    raise ValueError(f"Unsupported model type {model_type}")',
             "",
             "ValueError: Unsupported model type qwen3_moe",
             " rank=0",
             "2024-04-18T10:44:19.268946Z ERROR text_generation_launcher: Shard 0 failed to start",
             "2024-04-18T10:44:19.268970Z  INFO text_generation_launcher: Shutting down shards",
             "Error: ShardCannotStart"]
    write("tgi_shard_rank_field", lines, {
        "type": "ValueError", "message": "Unsupported model type qwen3_moe", "rank": "rank=0",
        "frame": {"file": "/opt/conda/lib/python3.10/site-packages/text_generation_server/models/__init__.py",
                  "line": 301, "function": "get_model",
                  "source": 'raise ValueError(f"Unsupported model type {model_type}")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # concurrent.futures: the worker's traceback quoted in _RemoteTraceback's message, then
    # the same error re-raised in the parent
    lines = ["concurrent.futures.process._RemoteTraceback: ",
             '"""',
             MARK + "Traceback (most recent call last):",
             '  File "/usr/lib/python3.10/concurrent/futures/process.py", line 246, in _process_worker',
             "    r = call_item.fn(*call_item.args, **call_item.kwargs)",
             '  File "/work/prep.py", line 12, in tokenize',
             '    raise ValueError("empty document")',
             "ValueError: empty document",
             '"""',
             "",
             "The above exception was the direct cause of the following exception:",
             "",
             "Traceback (most recent call last):",
             '  File "/work/prep.py", line 30, in <module>',
             "    for r in pool.map(tokenize, docs):",
             '  File "/usr/lib/python3.10/concurrent/futures/_base.py", line 458, in result',
             "    return self.__get_result()",
             "ValueError: empty document"]
    write("process_pool_remote_traceback", lines, {
        "type": "ValueError", "message": "empty document", "rank": None,
        "frame": {"file": "/work/prep.py", "line": 12, "function": "tokenize", "source": 'raise ValueError("empty document")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["ValueError"]})


    # Ray Data: the failing task is an operator, `ray::MapBatches(fn)()`, not an actor's method
    lines = ["2025-05-12 09:41:09,101\tERROR streaming_executor_state.py:485 -- An exception was raised from a task "
             'of operator "MapBatches(tokenize)". Dataset execution will now abort.',
             MARK + "Traceback (most recent call last):",
             '  File "/work/pipeline.py", line 40, in <module>',
             '    ds.write_parquet("/out")',
             f'  File "{SP}/ray/data/_internal/execution/streaming_executor_state.py", line 453, in '
             "process_completed_tasks",
             "    bytes_read = task.on_data_ready(",
             "ray.exceptions.RayTaskError(KeyError): ray::MapBatches(tokenize)() (pid=8812, ip=10.0.1.7)",
             f'  File "{SP}/ray/data/_internal/planner/plan_udf_map_op.py", line 300, in transform_fn',
             "    out = fn(batch)",
             '  File "/work/pipeline.py", line 12, in tokenize',
             '    return {"ids": tok(batch["txt"])}',
             "KeyError: 'txt'"]
    write("ray_data_operator_error", lines, {
        "type": "KeyError", "message": "'txt'", "rank": "MapBatches(tokenize) pid=8812", "pid": 8812,
        "node": "10.0.1.7",
        "frame": {"file": "/work/pipeline.py", "line": 12, "function": "tokenize",
                  "source": 'return {"ids": tok(batch["txt"])}'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})


    # torchrun's summary with the child's traceback in its `traceback :` field (@record): the
    # fields above it name the child
    lines = ["E0512 09:41:09.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
             "local_rank: 1 (pid: 3302) of binary: /opt/venv/bin/python",
             "Traceback (most recent call last):",
             '  File "/opt/venv/bin/torchrun", line 8, in <module>',
             "    sys.exit(main())",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================",
             "train.py FAILED",
             "------------------------------------------------------------",
             "Root Cause (first observed failure):",
             "[0]:",
             "  time      : 2025-05-12_09:41:09",
             "  host      : gpu-07",
             "  rank      : 1 (local_rank: 1)",
             "  exitcode  : 1 (pid: 3302)",
             "  error_file: /tmp/torchelastic_abc/none_1/attempt_0/1/error.json",
             MARK + "  traceback : Traceback (most recent call last):",
             f'    File "{SP}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
             "      return f(*args, **kwargs)",
             '    File "/work/train.py", line 40, in main',
             "      model.load_state_dict(sd)",
             f'    File "{SP}/torch/nn/modules/module.py", line 2215, in load_state_dict',
             "      raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format(",
             "  RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:",
             "  \tsize mismatch for lm_head.weight: copying a param with shape torch.Size([32000, 4096]) from "
             "checkpoint, the shape in current model is torch.Size([32001, 4096]).",
             "",
             "============================================================"]
    write("torchrun_error_file_traceback", lines, {
        "type": "RuntimeError",
        "message": "Error(s) in loading state_dict for LlamaForCausalLM:\n\tsize mismatch for lm_head.weight: copying "
                   "a param with shape torch.Size([32000, 4096]) from checkpoint, the shape in current model is "
                   "torch.Size([32001, 4096]).",
        "rank": "rank1", "pid": 3302, "node": "gpu-07",
        "frame": {"file": f"{SP}/torch/nn/modules/module.py", "line": 2215, "function": "load_state_dict",
                  "source": "raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format("},
        "kind": "traceback", "count": 1, "restarts": 1,
        "secondary_types": ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError"]})


    # Docker's json-file log as saved from the container's log file: one JSON object a line,
    # the text (with its colour codes as JSON escapes) in "log"
    ray = "\x1b[36m(WorkerDict pid=616, ip=192.168.149.159)\x1b[0m "
    body = [ray + "[2025-04-23 21:31:38 TP0] Load weight end. type=Qwen2ForCausalLM, avail mem=52.10 GB",
            MARK + ray + "[2025-04-23 21:31:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            ray + '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/scheduler.py", line 2015, '
                  "in run_scheduler_process",
            ray + "    scheduler.event_loop_normal()",
            ray + '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/schedule_batch.py", '
                  "line 1138, in prepare_for_extend",
            ray + "    write_req_to_token_pool_triton[(bs,)](",
            ray + "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
            ray]
    lines = [(MARK if MARK in ln else "") + json.dumps(
        {"log": ln.replace(MARK, "") + "\n", "stream": "stderr", "time": f"2025-04-23T21:31:4{i}.000000000Z"},
        separators=(",", ":")) for i, ln in enumerate(body)]
    write("docker_json_file_log", lines, {
        "type": "RuntimeError", "message": "Triton Error [CUDA]: an illegal memory access was encountered",
        "rank": "WorkerDict pid=616 TP0", "pid": 616, "node": "192.168.149.159",
        "frame": {"file": "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/schedule_batch.py",
                  "line": 1138, "function": "prepare_for_extend", "source": "write_req_to_token_pool_triton[(bs,)]("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})


    # four ranks' NCCL watchdog aborts at once, no Python traceback: their terminate reports
    # ran into each other character-wise, and the terminal copy hard-wrapped every line at
    # 140 columns (the what() message cut mid-word)
    what = ("  what():  [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with "
            "exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLGATHER, "
            "NumelIn=4096, NumelOut=16384, Timeout(ms)=1800000) ran for 1800093 milliseconds before timing out.")
    raw = ["100%|██████████| 12/12 [00:41<00:00,  3.45s/it]",
           "[rank2]:[E512 09:41:09.101000000 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation "
           "timeout: WorkNCCL(SeqNum=9, OpType=ALLGATHER, NumelIn=4096, NumelOut=16384, Timeout(ms)=1800000) ran for "
           "1800093 milliseconds before timing out.",
           MARK + "terminate called after throwing an instance of 'c10::DistBackendErrorterminate called after throwing "
           "an instance of ''",
           "terminate called after throwing an instance of 'terminate called after throwing an instance of 'c10::"
           "DistBackendErrorc10::DistBackendError'",
           "c10::DistBackendError'",
           "'",
           what,
           "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most "
           "recent call first):",
           "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f5a9616c1b6 in "
           "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)"]
    lines = []
    for ln in raw:
        mark = MARK if MARK in ln else ""
        ln = ln.replace(MARK, "")
        cut = [ln[i:i + 140] for i in range(0, len(ln), 140)] or [""]
        lines += [mark + cut[0], *cut[1:]]
    write("nccl_abort_ranks_garbled_wrapped", lines, {
        "type": "c10::DistBackendError", "message": what.split("what():", 1)[1].strip(), "rank": "rank2",
        "frame": None, "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": None})


if __name__ == "__main__":
    build_all()
    build_round3()
