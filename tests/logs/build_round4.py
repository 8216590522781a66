"""Builds the fourth round's part of the `rewheel why` corpus: tracebacks that are not where a
parser expects them, and the failing process named only by a launcher.

One log per shape, written from the shape's description (not from one real log): a traceback
drawn in a Rich box (whole, and cut at the top), a traceback inside a list repr behind
`grep -n` numbering and torchrun's prefixes, one inside a quoted message, a traceback cut
before its exception line with the error in prose after it, a paste with a blank line after
every line, a process named only by lmdeploy's `Rank[N] failed.`, by torchrun's
`ChildFailedError` table or by TGI's trailing ` rank=N` after a repeated traceback, a dead Ray
actor that left no traceback, a bare exception followed by a destructor's error at teardown,
and CANN's `TraceBack` block after a message. The expected root cause of each is stated BY HAND
below (only `log_line` is computed, from where the root's first line was placed).
Run `python tests/logs/build_round4.py` to regenerate; the test suite reads the files only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from build_shapes import MARK, write  # noqa: E402

SP = "/opt/venv/lib/python3.11/site-packages"


def header(file: str, line: int, func: str, width: int = 76) -> list[str]:
    """A frame's header as Rich wraps it in the box: words moved to the next line when they do
    not fit, a word longer than the line folded."""
    out: list[str] = []
    cur = ""
    for word in (f"{file}:{line}", "in", func):
        if len(f"{cur} {word}" if cur else word) <= width:
            cur = f"{cur} {word}" if cur else word
            continue
        if cur:
            out.append(cur)
        while len(word) > width:
            out.append(word[:width])
            word = word[width:]
        cur = word
    return out + [cur]


def box(lines: list[str], width: int = 80) -> list[str]:
    """Rich's box around already wrapped content lines ("" for a blank one)."""
    return ["│ " + ln[: width - 4].ljust(width - 4) + " │" for ln in lines]   # (Rich crops code lines)


TOP = "╭───────────────────── Traceback (most recent call last) ──────────────────────╮"
BOTTOM = "╰──────────────────────────────────────────────────────────────────────────────╯"


def build_all() -> None:
    # -- a traceback drawn in a box (Rich / typer), chained -------------------------------
    first = [
        *header(f"{SP}/transformers/models/auto/configuration_auto.py", 1034, "from_pretrained"),
        "",
        "  1031 │   │   if \"model_type\" in config_dict:",
        "  1032 │   │   │   try:",
        "❱ 1034 │   │   │   │   config_class = CONFIG_MAPPING[config_dict[\"model_type\"]]",
        "  1035 │   │   │   except KeyError:",
        "",
        *header(f"{SP}/transformers/models/auto/configuration_auto.py", 732, "__getitem__"),
        "",
        "❱  732 │   │   │   raise KeyError(key)",
    ]
    second = [
        *header("/srv/serve/cli.py", 41, "main"),
        "",
        "   40 │   with console.status(\"loading\"):",
        "❱  41 │   │   engine = build_engine(model)",
        "",
        "╭──────────────────────────── locals ────────────────────────────╮",
        "│ model = '/models/Qwen3-Next-80B-A3B-Instruct'                  │",
        "╰────────────────────────────────────────────────────────────────╯",
        "",
        *header(f"{SP}/transformers/models/auto/configuration_auto.py", 1036, "from_pretrained"),
        "",
        "❱ 1036 │   │   │   │   raise ValueError(",
    ]
    lines = ["INFO:serve:loading /models/Qwen3-Next-80B-A3B-Instruct", MARK + TOP, *box(first), BOTTOM,
             "KeyError: 'qwen3_next'", "", "During handling of the above exception, another exception occurred:", "",
             TOP, *box(second), BOTTOM,
             "ValueError: The checkpoint you are trying to load has model type `qwen3_next` but Transformers does",
             "not recognize this architecture."]
    write("rich_box_traceback", lines, {
        "type": "ValueError",
        "message": "The checkpoint you are trying to load has model type `qwen3_next` but Transformers does\n"
                   "not recognize this architecture.",
        "rank": None,
        "frame": {"file": f"{SP}/transformers/models/auto/configuration_auto.py", "line": 1036,
                  "function": "from_pretrained", "source": "raise ValueError("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["KeyError"]})

    # -- the lower half of a box only, behind kubectl's prefix -----------------------------
    lower = [
        "❱  88 │   │   self.model = get_model(vllm_config=self.vllm_config)",
        "",
        *header(f"{SP}/vllm/model_executor/model_loader/weight_utils.py", 512, "safetensors_weights_iterator"),
        "",
        "   511 │   │   with safe_open(st_file, framework=\"pt\") as f:",
        "❱  512 │   │   │   for name in f.keys():",
    ]
    k = "[pod/vllm-7d9f/vllm] "
    lines = [k + ln for ln in box(lower[:2])]
    lines += [(MARK if i == 0 else "") + k + ln for i, ln in enumerate(box(lower[2:]))]
    lines += [k + BOTTOM, k + "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"]
    write("rich_box_cut_at_top", lines, {
        "type": "safetensors_rust.SafetensorError", "message": "Error while deserializing header: MetadataIncompleteBuffer",
        "rank": None, "node": "vllm-7d9f",
        "frame": {"file": f"{SP}/vllm/model_executor/model_loader/weight_utils.py", "line": 512,
                  "function": "safetensors_weights_iterator", "source": "for name in f.keys():"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- a traceback that survives only in a list repr, behind grep -n and torchrun's prefixes --
    tb = ["Traceback (most recent call last):\\n", f'  File "{SP}/deepspeed/runtime/engine.py", line 2020, in backward\\n',
          "    self.optimizer.backward(loss, retain_graph=retain_graph)\\n",
          f'  File "{SP}/deepspeed/runtime/zero/stage3.py", line 2261, in backward\\n',
          "    self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)\\n",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity "
          "of 79.33 GiB of which 1.20 GiB is free.\\n"]
    lines = ["1201:[default0]:[rank0]: step 300 loss 1.9921",
             MARK + "1234:[default0]:[rank0]: [" + ", ".join(f"'{t}'" for t in tb) + "]",
             "1235:[default1]:[rank1]: step 300 loss 1.9874"]
    write("traceback_in_list_repr", lines, {
        "type": "torch.OutOfMemoryError",
        "message": "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.33 GiB of "
                   "which 1.20 GiB is free.",
        "rank": "rank0",
        "frame": {"file": f"{SP}/deepspeed/runtime/zero/stage3.py", "line": 2261, "function": "backward",
                  "source": "self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- ... and inside a quoted message, behind Ray's prefix -----------------------------------
    esc = ("Traceback (most recent call last):\\n  File \"/workspace/verl/verl/workers/reward.py\", line 77, in score\\n"
           "    return fn(sol, gt)\\n  File \"/workspace/verl/verl/utils/reward_score/math.py\", line 31, in compute\\n"
           "    assert len(boxed) == 1, boxed\\nAssertionError: can\\'t parse \\\\boxed{}\\n")
    lines = ["(WorkerDict pid=2791, ip=10.0.0.3) step 12 done",
             MARK + f"(WorkerDict pid=2791, ip=10.0.0.3) ERROR 08-01 10:00:00 [reward.py:90] reward failed: '{esc}'",
             "(WorkerDict pid=2791, ip=10.0.0.3) step 13 done"]
    write("traceback_in_quoted_message", lines, {
        "type": "AssertionError", "message": "can't parse \\boxed{}", "rank": "WorkerDict pid=2791", "pid": 2791,
        "node": "10.0.0.3",
        "frame": {"file": "/workspace/verl/verl/utils/reward_score/math.py", "line": 31, "function": "compute",
                  "source": "assert len(boxed) == 1, boxed"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- a traceback cut before its exception line; the error in a sentence after it -------------
    lines = ["启动 lmdeploy serve 时报错：", "Traceback (most recent call last):",
             f'  File "{SP}/lmdeploy/turbomind/deploy/converter.py", line 251, in get_tm_model',
             "    raise RuntimeError(", "…（省略）", "",
             MARK + "最后一行是RuntimeError: Can not find model weight in /models/glm-4-9b，请问是格式不对吗？"]
    write("cut_traceback_error_in_prose", lines, {
        "type": "RuntimeError", "message": "最后一行是RuntimeError: Can not find model weight in /models/glm-4-9b",
        "rank": None,
        "frame": {"file": f"{SP}/lmdeploy/turbomind/deploy/converter.py", "line": 251, "function": "get_tm_model",
                  "source": "raise RuntimeError("},
        "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": []})

    # -- a paste with a blank line after every line (older sglang: the record before names it) ----
    body = ["[2024-08-20 10:00:01 TP0] Load weight end. type=LlamaForCausalLM, avail mem=12.31 GB",
            "[2024-08-20 10:00:05 TP1] Exception in ModelTpServer:", MARK + "Traceback (most recent call last):",
            '  File "/sgl/python/sglang/srt/managers/tp_worker.py", line 219, in exposed_step',
            "    self.forward_step()",
            '  File "/sgl/python/sglang/srt/layers/radix_attention.py", line 114, in extend_forward_flashinfer',
            "    o = self.prefill_wrapper.forward(",
            "RuntimeError: CHECK_EQ(paged_kv_indptr.size(0), batch_size + 1) failed. 1 vs 257",
            "[2024-08-20 10:00:05] Received sigquit from a child process. It usually means the child failed."]
    lines = []
    for ln in body:
        lines += [ln, ""]
    write("blank_line_after_every_line", lines, {
        "type": "RuntimeError", "message": "CHECK_EQ(paged_kv_indptr.size(0), batch_size + 1) failed. 1 vs 257",
        "rank": "TP1",
        "frame": {"file": "/sgl/python/sglang/srt/layers/radix_attention.py", "line": 114,
                  "function": "extend_forward_flashinfer", "source": "o = self.prefill_wrapper.forward("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    build_launchers()
    build_relatives()


def build_launchers() -> None:
    # -- lmdeploy: the TP child's traceback has no prefix; "Rank[2] failed." names it ------------
    lines = ["2025-03-01 10:00:00,101 - lmdeploy - INFO - async_engine.py:260 - input backend=pytorch, tp=4",
             MARK + "Traceback (most recent call last):",
             f'  File "{SP}/lmdeploy/pytorch/engine/model_agent.py", line 412, in _tp_build_model',
             "    patched_model = build_patched_model(model_config, device=device_map)",
             f'  File "{SP}/lmdeploy/pytorch/models/deepseek_v2.py", line 301, in __init__',
             "    assert self.num_heads % world_size == 0",
             "AssertionError",
             "2025-03-01 10:00:07,551 - lmdeploy - ERROR - model_agent.py:489 - Rank[2] failed.",
             "2025-03-01 10:00:07,552 - lmdeploy - INFO - model_agent.py:501 - Terminating TP processes."]
    write("launcher_names_rank_lmdeploy", lines, {
        "type": "AssertionError", "message": "", "rank": "rank2",
        "frame": {"file": f"{SP}/lmdeploy/pytorch/models/deepseek_v2.py", "line": 301, "function": "__init__",
                  "source": "assert self.num_heads % world_size == 0"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- torchrun: the child's traceback has no prefix; the table's Root Cause entry names it -----
    lines = ["W0301 10:00:00.000000 140 torch/distributed/run.py:793 Setting OMP_NUM_THREADS",
             MARK + "Traceback (most recent call last):",
             '  File "/work/train.py", line 52, in <module>', "    main()",
             '  File "/work/data.py", line 18, in load', "    return json.load(fh)",
             "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
             "E0301 10:00:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
             "local_rank: 2 (pid: 4402) of binary: /opt/venv/bin/python",
             "Traceback (most recent call last):",
             '  File "/opt/venv/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "=" * 60, "train.py FAILED", "-" * 60, "Failures:", "[1]:",
             "  time      : 2025-03-01_10:00:05", "  host      : gpu-09", "  rank      : 7 (local_rank: 3)",
             "  exitcode  : 1 (pid: 4403)", "-" * 60, "Root Cause (first observed failure):", "[0]:",
             "  time      : 2025-03-01_10:00:05", "  host      : gpu-09", "  rank      : 6 (local_rank: 2)",
             "  exitcode  : 1 (pid: 4402)",
             "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", "=" * 60]
    write("launcher_names_rank_torchrun_table", lines, {
        "type": "json.decoder.JSONDecodeError", "message": "Expecting value: line 1 column 1 (char 0)",
        "rank": "rank6", "pid": 4402, "node": "gpu-09",
        "frame": {"file": "/work/data.py", "line": 18, "function": "load", "source": "return json.load(fh)"},
        "kind": "traceback", "count": 1, "restarts": 1,
        "secondary_types": ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError"]})

    # -- TGI: the shard's traceback twice; only the second copy ends with " rank=1" -------------
    tb = ["Traceback (most recent call last):", "",
          '  File "/opt/conda/bin/text-generation-server", line 8, in <module>', "    sys.exit(app())", "",
          f'  File "{SP}/text_generation_server/utils/weights.py", line 64, in get_filename',
          '    raise RuntimeError(f"weight {tensor_name} does not exist")', "",
          "RuntimeError: weight lm_head.weight does not exist", ""]
    lines = ["2024-04-18T10:44:10.101010Z  INFO shard-manager: text_generation_launcher: Starting shard rank=1",
             "2024-04-18T10:44:19.170000Z ERROR text_generation_launcher: Error when initializing model",
             MARK + tb[0], *tb[1:],
             "2024-04-18T10:44:19.270000Z ERROR shard-manager: text_generation_launcher: Shard complete standard "
             "error output:", "", *tb, " rank=1",
             "2024-04-18T10:44:19.368946Z ERROR text_generation_launcher: Shard 1 failed to start", "Error: ShardCannotStart"]
    write("launcher_names_rank_tgi_repeat", lines, {
        "type": "RuntimeError", "message": "weight lm_head.weight does not exist", "rank": "rank=1",
        "frame": {"file": f"{SP}/text_generation_server/utils/weights.py", "line": 64, "function": "get_filename",
                  "source": 'raise RuntimeError(f"weight {tensor_name} does not exist")'},
        # (one shard, printed twice: its unnamed copy is the named one's, not another process)
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- a dead Ray actor that left no traceback; the driver reports it -------------------------
    lines = ["(WorkerDict pid=5120) INFO 05-02 09:00:00 [gpu_model_runner.py:1592] Model loading took 14.2 GiB",
             "(raylet) A worker died or was killed while executing a task by an unexpected system error. Worker IP "
             "address: 10.0.3.7 Worker port: 10010 Worker PID: 5120 Worker exit type: SYSTEM_ERROR",
             MARK + "Traceback (most recent call last):",
             '  File "/workspace/verl/verl/trainer/main_ppo.py", line 33, in run_ppo',
             "    ray.get(runner.run.remote(config))",
             f'  File "{SP}/ray/_private/worker.py", line 919, in get_objects',
             "    raise value",
             "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
             "\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict",
             "\tactor_id: 2bd4d1e9a1d2b3a34f0b3b8501000000", "\tpid: 5120", "\tip: 10.0.3.7",
             "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"]
    write("ray_actor_died_without_traceback", lines, {
        "type": "ray.exceptions.ActorDiedError",
        "message": "The actor died unexpectedly before finishing this task.\n\tclass_name: "
                   "create_colocated_worker_cls.<locals>.WorkerDict\n\tactor_id: 2bd4d1e9a1d2b3a34f0b3b8501000000\n"
                   "\tpid: 5120\n\tip: 10.0.3.7\nThe actor is dead because its worker process has died. Worker exit "
                   "type: SYSTEM_ERROR",
        "rank": "WorkerDict pid=5120", "pid": 5120, "node": "10.0.3.7",
        "frame": {"file": f"{SP}/ray/_private/worker.py", "line": 919, "function": "get_objects", "source": "raise value"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    # -- a bare exception (its traceback's top lost) and a destructor's error at teardown -------
    lines = ["llama_model_load: error loading model: unexpectedly reached end of file",
             "llama_load_model_from_file: failed to load model", "    assert self.model is not None",
             MARK + "AssertionError",
             "Exception ignored in: <function Llama.__del__ at 0x7f3c1b8e5ab0>",
             "Traceback (most recent call last):",
             f'  File "{SP}/llama_cpp/llama.py", line 2155, in close',
             "    self._stack.close()",
             "AttributeError: 'Llama' object has no attribute '_stack'"]
    write("bare_exception_then_teardown", lines, {
        "type": "AssertionError", "message": "", "rank": None, "frame": None,
        "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": ["AttributeError"]})

    # -- CANN's TraceBack block after the message: neither message nor traceback ----------------
    h = "(Worker_TP0 pid=3442) ERROR 08-28 10:28:33 [multiproc_executor.py:546] "
    lines = [h + "WorkerProc hit an exception.", MARK + h + "Traceback (most recent call last):",
             h + f'  File "{SP}/vllm_ascend/ops/fused_moe.py", line 612, in forward',
             h + "    torch_npu.npu_grouped_matmul(",
             h + "RuntimeError: call aclnnGroupedMatmulV4 failed, detail:EI9999: Inner Error!",
             h + "EI9999: [PID: 3442] 2025-08-28-10:28:33.604.129 The input weight shape is invalid.[FUNC:Check]",
             h + "        TraceBack (most recent call last):",
             h + "        GroupedMatmul check param failed.[FUNC:CheckParams][FILE:aclnn_grouped_matmul.cpp][LINE:203]",
             h + "        Check Shape failed.[FUNC:Check][FILE:op_api_def.h][LINE:96]",
             "(Worker_TP1 pid=3443) WARNING 08-28 10:28:33 [multiproc_executor.py:512] WorkerProc was terminated"]
    write("cann_traceback_block_after_message", lines, {
        "type": "RuntimeError",
        "message": "call aclnnGroupedMatmulV4 failed, detail:EI9999: Inner Error!\nEI9999: [PID: 3442] "
                   "2025-08-28-10:28:33.604.129 The input weight shape is invalid.[FUNC:Check]",
        "rank": "Worker_TP0", "pid": 3442,
        "frame": {"file": f"{SP}/vllm_ascend/ops/fused_moe.py", "line": 612, "function": "forward",
                  "source": "torch_npu.npu_grouped_matmul("},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})



def build_relatives() -> None:
    """The same families in other dress: a box in RichHandler's message column, a child named
    by torch.multiprocessing.spawn or by mpirun, an actor whose creation task raised, an error
    named in a sentence without its message."""
    pad = " " * 20
    inner = box(["/app/serve.py:86 in load", "", "   85 │   try:", "❱  86 │   │   model = build(cfg)", "",
                 "/app/build.py:12 in build", "", "❱ 12 │   raise ValueError(\"no such architecture: qwen3_next\")"],
                width=70)
    lines = ["[03/04/25 11:20:17] INFO     Loading model /models/x" + " " * 30 + "serve.py:80",
             "[03/04/25 11:20:19] ERROR    Model failed to load" + " " * 33 + "serve.py:88",
             MARK + pad + "╭" + "─" * 16 + " Traceback (most recent call last) " + "─" * 17 + "╮",
             *[pad + ln for ln in inner], pad + "╰" + "─" * 68 + "╯",
             pad + "ValueError: no such architecture: qwen3_next",
             "[03/04/25 11:20:19] INFO     Shutting down" + " " * 40 + "serve.py:95"]
    write("rich_box_in_richhandler", lines, {
        "type": "ValueError", "message": "no such architecture: qwen3_next", "rank": None,
        "frame": {"file": "/app/build.py", "line": 12, "function": "build",
                  "source": 'raise ValueError("no such architecture: qwen3_next")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    lines = ["Epoch 0", MARK + "Traceback (most recent call last):", '  File "/work/train.py", line 100, in <module>',
             "    mp.spawn(main, args=(world_size,), nprocs=world_size)",
             f'  File "{SP}/torch/multiprocessing/spawn.py", line 160, in join',
             "    raise ProcessRaisedException(msg, error_index, failed_process.pid)",
             "torch.multiprocessing.spawn.ProcessRaisedException: ", "",
             "-- Process 2 terminated with the following error:", "Traceback (most recent call last):",
             f'  File "{SP}/torch/multiprocessing/spawn.py", line 69, in _wrap', "    fn(i, *args)",
             '  File "/work/model.py", line 31, in forward', "    return self.fc(h.view(h.size(0), -1))",
             "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x4096 and 2048x10)"]
    write("spawn_names_the_child", lines, {
        "type": "RuntimeError", "message": "mat1 and mat2 shapes cannot be multiplied (32x4096 and 2048x10)",
        "rank": "rank2",
        "frame": {"file": "/work/model.py", "line": 31, "function": "forward",
                  "source": "return self.fc(h.view(h.size(0), -1))"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": ["torch.multiprocessing.spawn.ProcessRaisedException"]})

    rule = "-" * 74
    lines = ["[1,0]<stdout>:Epoch 1/10", MARK + "Traceback (most recent call last):",
             '  File "/work/train_hvd.py", line 88, in <module>', "    hvd.allreduce(t)",
             f'  File "{SP}/horovod/torch/mpi_ops.py", line 441, in synchronize',
             "    mpi_lib.horovod_torch_wait_and_clear(handle)",
             "horovod.common.exceptions.HorovodInternalError: ncclCommInitRank failed: unhandled cuda error",
             rule, "Primary job  terminated normally, but 1 process returned",
             "a non-zero exit code. Per user-direction, the job has been aborted.", rule, rule,
             "mpirun detected that one or more processes exited with non-zero status, thus causing",
             "the job to be terminated. The first process to do so was:", "",
             "  Process name: [[31226,1],3]", "  Exit code:    1", rule]
    write("mpirun_names_the_first_process", lines, {
        "type": "horovod.common.exceptions.HorovodInternalError", "message": "ncclCommInitRank failed: unhandled cuda error",
        "rank": "rank3",
        "frame": {"file": f"{SP}/horovod/torch/mpi_ops.py", "line": 441, "function": "synchronize",
                  "source": "mpi_lib.horovod_torch_wait_and_clear(handle)"},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    lines = [MARK + "Traceback (most recent call last):",
             '  File "/workspace/verl/verl/trainer/main_ppo.py", line 33, in run_ppo', "    ray.get(runner.run.remote(config))",
             f'  File "{SP}/ray/_private/worker.py", line 919, in get_objects', "    raise value",
             "ray.exceptions.ActorDiedError: The actor died because of an error raised in its creation task, "
             "ray::WorkerDict.__init__() (pid=2793, ip=10.0.0.5, actor_id=2bd4d1e9a1d2b3a34f0b3b8501000000)",
             '  File "/workspace/verl/verl/workers/fsdp_workers.py", line 98, in __init__',
             '    torch.distributed.init_process_group(backend="nccl")',
             "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use"]
    write("ray_actor_creation_task_failed", lines, {
        "type": "torch.distributed.DistNetworkError",
        "message": "The server socket has failed to listen on any local network address. port: 29500, useIPv6: 0, "
                   "code: -98, name: EADDRINUSE, message: address already in use",
        "rank": "WorkerDict pid=2793", "pid": 2793, "node": "10.0.0.5",
        "frame": {"file": "/workspace/verl/verl/workers/fsdp_workers.py", "line": 98, "function": "__init__",
                  "source": 'torch.distributed.init_process_group(backend="nccl")'},
        "kind": "traceback", "count": 1, "restarts": 1, "secondary_types": []})

    lines = ["Traceback (most recent call last):", '  File "/srv/app/run.py", line 12, in <module>',
             '    llm = LLM(model="Qwen/Qwen2.5-72B-Instruct-AWQ", quantization="awq")',
             f'  File "{SP}/vllm/model_executor/layers/quantization/awq.py", line 88, in get_min_capability',
             "    raise ValueError(", "(truncated)", "", MARK + "运行后报 ValueError 错误，显卡是 V100，是不是不支持 AWQ？"]
    write("cut_traceback_error_named_in_prose", lines, {
        "type": "ValueError", "message": "运行后报 ValueError 错误，显卡是 V100，是不是不支持 AWQ？", "rank": None,
        "frame": {"file": f"{SP}/vllm/model_executor/layers/quantization/awq.py", "line": 88,
                  "function": "get_min_capability", "source": "raise ValueError("},
        "kind": "error-line", "count": 1, "restarts": 1, "secondary_types": []})


if __name__ == "__main__":
    build_all()
