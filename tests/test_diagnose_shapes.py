"""`rewheel why` on logs as they are collected and pasted, and on any input at all.

The shape corpus (tests/logs, written by build_shapes.py) is checked by test_diagnose.py's
corpus tests like every other log; here: the process identity each shape names (pid, node),
the same log in other wrappers, and robustness — random bytes and every corpus log cut
anywhere give an answer, never an exception.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from rewheel import diagnose

LOGS = Path(__file__).parent / "logs"
SHAPES = ["wrap_docker_compose", "wrap_kubectl_prefix", "wrap_ci_timestamps", "journald_short_iso",
          "journald_short_precise", "journald_short_monotonic", "journald_json", "syslog_rfc5424", "srun_ranks",
          "nohup_progress_bars", "paste_damaged", "paste_chars_interleaved", "sglang_scheduler_exception",
          "ray_nested_task_error", "ipython_traceback", "pytest_failure", "torchrun_child_failed",
          "shutdown_cascade_after_nccl", "smoke_runner_lines_end_message", "ray_task_pid_prefix",
          "pytest_short_traceback", "nccl_watchdog_terminate", "torchrun_child_signal",
          "faulthandler_segfault", "json_escaped_traceback", "quoted_in_reply",
          # third round: prefixes before / stacked on a traceback, tracebacks inside a message,
          # ranks interleaved without prefixes, crashes without a Python traceback
          "ray_prefix_midline_traceback", "stacked_prefixes_skypilot", "docker_desktop_engine_core",
          "ranks_interleaved_no_prefix", "ray_serve_wrapped_traceback", "dataloader_worker_reraise",
          "nccl_watchdog_rank_text", "sglang_tp_header_no_pid", "ranks_chars_interleaved_line",
          # ... and shapes nobody listed: a wrapper learnt, TGI's rank field, a quoted remote traceback
          "unknown_wrapper_pdsh", "tgi_shard_rank_field", "process_pool_remote_traceback",
          "ray_data_operator_error", "torchrun_error_file_traceback", "docker_json_file_log",
          "nccl_abort_ranks_garbled_wrapped"]


def expected(name: str) -> dict:
    return json.loads((LOGS / f"{name}.expected.json").read_text())["root_cause"]


def root_of_text(text: str) -> dict | None:
    return diagnose.analyse_lines(text.splitlines(), package="vllm").to_json()["root_cause"]


def test_shape_corpus_is_complete() -> None:
    for name in SHAPES:
        assert (LOGS / f"{name}.log").is_file() and (LOGS / f"{name}.expected.json").is_file(), name


@pytest.mark.parametrize("name", [n for n in SHAPES if "pid" in expected(n) or "node" in expected(n)])
def test_process_identity_is_kept(name: str) -> None:
    exp = expected(name)
    got = diagnose.analyse_file(LOGS / f"{name}.log", package="vllm").to_json()["root_cause"]
    for key in ("pid", "node"):
        if key in exp:
            assert got[key] == exp[key], (key, got[key])


@pytest.mark.parametrize("wrap", [
    lambda ln: f"vllm-1  | {ln}",
    lambda ln: f"[pod/vllm-0/vllm] {ln}",
    lambda ln: f"2025-07-28T15:07:00.9685040Z {ln}",
    lambda ln: f"2025-07-28T15:07:00.9685040Z vllm-1  | {ln}",          # CI running docker compose
    lambda ln: f"\x1b[36mvllm-1  |\x1b[0m {ln}",                          # compose's colours
    lambda ln: f"Jul 28 15:07:00 gpu-07 vllm[4700]: {ln}",
    lambda ln: f"Mon 2025-07-28 15:07:00 UTC gpu-07 vllm.service[4700]: {ln}",   # journalctl -o short-full
    lambda ln: f"[pod/vllm-0/vllm] 2025-07-28T15:07:00.968504123Z {ln}",         # kubectl --prefix --timestamps
    lambda ln: f"{ln}" + " " * 90,
])
@pytest.mark.parametrize("name", ["story_worker_crash_plain", "ray_nested_task_error", "sglang_scheduler_exception",
                                  "ipython_traceback", "chained_direct_cause", "ray_prefix_midline_traceback",
                                  "stacked_prefixes_skypilot", "ray_serve_wrapped_traceback",
                                  "dataloader_worker_reraise", "sglang_tp_header_no_pid",
                                  "ranks_interleaved_no_prefix", "nccl_watchdog_rank_text",
                                  "unknown_wrapper_pdsh", "process_pool_remote_traceback"])
def test_wrappers_do_not_change_the_answer(name: str, wrap) -> None:
    exp = expected(name)
    text = (LOGS / f"{name}.log").read_text()
    got = root_of_text("\n".join(wrap(ln) for ln in text.splitlines()))
    for key in ("type", "message", "rank", "frame", "kind", "count", "log_line"):
        assert got[key] == exp[key], (key, got[key])


def test_ray_remote_identity_names_the_node() -> None:
    rc = diagnose.analyse_file(LOGS / "ray_nested_task_error.log").root
    assert rc is not None and (rc.type, rc.pid, rc.node) == ("KeyError", 6302, "10.68.23.157")
    assert "pid=6302" in (rc.rank or "")


def test_worker_pool_labels_keep_their_pid() -> None:
    text = "\n".join([
        "(VllmWorkerProcess pid=2231) ERROR 07-28 15:07:00 [multiproc_worker_utils.py:233] Traceback (most recent call last):",
        '(VllmWorkerProcess pid=2231) ERROR 07-28 15:07:00 [multiproc_worker_utils.py:233]   File "/x/vllm/w.py", line 3, in run',
        "(VllmWorkerProcess pid=2231) ERROR 07-28 15:07:00 [multiproc_worker_utils.py:233]     go()",
        "(VllmWorkerProcess pid=2231) ERROR 07-28 15:07:00 [multiproc_worker_utils.py:233] OSError: disk full",
    ])
    rc = root_of_text(text)
    assert (rc["rank"], rc["pid"], rc["node"]) == ("VllmWorkerProcess pid=2231", 2231, None)


def test_keyword_in_prose_is_never_the_root_when_an_exception_line_exists() -> None:
    rc = root_of_text("\n".join([
        "If you see CUDA error: out of memory, lower --gpu-memory-utilization.",
        "OSError: [Errno 28] No space left on device: '/root/.cache/huggingface'",
    ]))
    assert rc["type"] == "OSError" and "No space left" in rc["message"]


# ---- no crash on any input ---------------------------------------------------------------
def _answers(path: Path) -> None:
    by_file = diagnose.analyse_file(path, package="vllm")
    json.dumps(by_file.to_json())
    by_file.summary()
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        json.dumps(diagnose.analyse_lines(fh, package="vllm").to_json())


def test_random_bytes_never_crash(tmp_path: Path) -> None:
    rng = random.Random(17)
    alphabet = (b"Traceback (most recent call last):\n", b'  File "/x/vllm/a.py", line 3, in f\n', b"E   ",
                b"ValueError: x\n", b"\r", b"\n", b"[1;36m", b"\x1b[0m", b"ray::A.f() (pid=1, ip=1.2.3.4)",
                b"RayTaskError(KeyError): ", b"---> 15 ", b'{"MESSAGE": "', b"| ", b"[pod/a/b] ", b"0: ",
                b"    +---------------- 1 ----------------\n", b"\xff\xfe", b"During handling of the above exception, "
                b"another exception occurred:\n", b"    ^^^^\n", b"Cell In[3], line 5\n", b"tests/x.py:3: Error\n")
    for i in range(60):
        parts = [rng.choice(alphabet) if rng.random() < 0.7 else bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
                 for _ in range(rng.randrange(1, 200))]
        p = tmp_path / f"r{i}.log"
        p.write_bytes(b"".join(parts))
        _answers(p)


@pytest.mark.parametrize("name", sorted(p.stem for p in LOGS.glob("*.log")))
def test_every_truncation_of_a_corpus_log_is_answered(name: str, tmp_path: Path) -> None:
    data = (LOGS / f"{name}.log").read_bytes()
    # cut anywhere (mid-line, mid-character) and at line ends, spread over the whole log
    ends = [i + 1 for i in range(len(data)) if data[i:i + 1] == b"\n"]
    cuts = sorted({0, len(data)} | set(range(0, len(data), max(1, len(data) // 24)))
                  | set(ends[::max(1, len(ends) // 24)]))
    p = tmp_path / "cut.log"
    for cut in cuts:
        for piece in (data[:cut], data[cut:]):
            p.write_bytes(piece)
            _answers(p)


def test_a_loggers_timestamped_line_is_not_a_journal_line() -> None:
    # Python logging / Ray: "DATE TIME,ms LEVEL file:line -- message" has no host in it
    rc = root_of_text("2025-08-12 07:37:57,002 ERROR worker.py:21 -- RuntimeError: CUDA error: unspecified launch failure")
    assert rc["node"] is None and rc["pid"] is None
    assert "RuntimeError: CUDA error: unspecified launch failure" in rc["message"]


LEAD_RE = re.compile(r"^((?:\([^)]*\) )?(?:(?:INFO|WARNING|ERROR) \S+ \S+ \[[^\]]*\] )?)\s+")


@pytest.mark.parametrize("name", ["story_worker_crash_plain", "chained_direct_cause", "kv_cache_too_small",
                                  "ray_nested_task_error", "sglang_scheduler_exception", "cuda_oom_worker_journald",
                                  "exception_group_taskgroup", "pytest_failure", "srun_ranks"])
def test_a_paste_that_lost_its_indentation_gives_the_same_answer(name: str) -> None:
    # frames, their (multi-line) source lines and carets at column 0, after any prefix
    text = (LOGS / f"{name}.log").read_text()
    flat = "\n".join(LEAD_RE.sub(r"\1", ln) for ln in text.splitlines())
    assert flat != text
    exp, got = expected(name), root_of_text(flat)
    for key in ("type", "rank", "kind", "log_line"):
        assert got[key] == exp[key], (key, got[key])
    assert got["message"].split("\n")[0] == exp["message"].split("\n")[0]
    fr, efr = got["frame"] or {}, exp["frame"] or {}
    assert (fr.get("file"), fr.get("line"), fr.get("function")) == (efr.get("file"), efr.get("line"), efr.get("function"))


def test_tab_indented_frames() -> None:
    rc = root_of_text("Traceback (most recent call last):\n\tFile \"/x/vllm/a.py\", line 3, in f\n\t\tg()\nKeyError: 7")
    assert (rc["type"], rc["message"], rc["frame"]["line"], rc["frame"]["source"]) == ("KeyError", "7", 3, "g()")


def test_a_paste_that_kept_html_escapes() -> None:
    rc = root_of_text("Traceback (most recent call last):\n  File &quot;/work/app.py&quot;, line 3, in &lt;module&gt;\n"
                      "    main()\nValueError: can&#39;t parse &lt;config&gt;")
    assert (rc["type"], rc["message"], rc["frame"]["file"], rc["frame"]["function"]) == \
        ("ValueError", "can't parse <config>", "/work/app.py", "<module>")


# ("120: ..." is `srun -l`'s task number, not learnt)
@pytest.mark.parametrize("wrap", [lambda n, ln: f"{n}:{ln}", lambda n, ln: f"  {n} | {ln}",
                                  lambda n, ln: f"node-{n % 3}: {ln}"])
def test_a_wrapper_nobody_listed_is_learnt(wrap) -> None:
    # `grep -n` output, a viewer's line numbers, a launcher's host names: text before the
    # traceback that begins every following line too
    text = ["loading", "Traceback (most recent call last):", '  File "/work/app.py", line 3, in f', "    main()",
            "KeyError: 7"]
    rc = root_of_text("\n".join(wrap(n, ln) for n, ln in enumerate(text, 120)))
    assert (rc["type"], rc["message"], rc["frame"]["line"], rc["frame"]["source"]) == ("KeyError", "7", 3, "main()")


def test_loguru_records_name_no_node_and_its_traceback_is_read() -> None:
    # loguru: "DATE TIME.ms | LEVEL    | module:function:line - message", then its annotated
    # traceback ("> File" marks the frame that raised, "└ ..." the values)
    rc = root_of_text("\n".join([
        "2024-05-01 10:00:00.000 | INFO     | app.server:load:40 - loading model",
        "2024-05-01 10:00:01.123 | ERROR    | app.server:load:52 - An error has been caught in function 'load':",
        "Traceback (most recent call last):", "",
        '  File "/app/server.py", line 52, in load', "    model = build(cfg)", "    └ <function build at 0x7f>", "",
        '> File "/app/build.py", line 7, in build', '    raise ValueError("bad cfg")', "",
        "ValueError: bad cfg"]))
    assert (rc["type"], rc["message"], rc["node"], rc["frame"]["file"]) == ("ValueError", "bad cfg", None, "/app/build.py")
    rc = root_of_text("2024-05-01 10:00:01.123 | ERROR    | app.server:load:52 - RuntimeError: CUDA error: misaligned address")
    assert (rc["type"], rc["node"]) == ("RuntimeError", None)


def test_sglang_ranks_failing_together_interleave_into_one_traceback() -> None:
    # two TP ranks' records began at once; their unprefixed lines alternate
    frames = ['  File "/sgl/scheduler.py", line 2015, in run_scheduler_process', "    scheduler.event_loop_normal()",
              '  File "/sgl/batch.py", line 1138, in prepare', "    write()",
              "RuntimeError: CUDA error: an illegal memory access was encountered"]
    lines = ["[2025-04-23 21:31:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
             "[2025-04-23 21:31:41 TP1] Scheduler hit an exception: Traceback (most recent call last):"]
    for ln in frames:
        lines += [ln, ln]
    rc = root_of_text("\n".join(lines + ["", "[2025-04-23 21:31:42] Received sigquit from a child process."]))
    assert (rc["type"], rc["message"], rc["rank"], rc["frame"]["line"], rc["log_line"]) == \
        ("RuntimeError", "CUDA error: an illegal memory access was encountered", "TP0", 1138, 1)


@pytest.mark.parametrize("width", [70, 90, 110, 120])
def test_a_frame_line_a_terminal_copy_hard_wrapped_is_joined(width: int) -> None:
    sp = "/home/user/miniconda3/envs/serve/lib/python3.11/site-packages"
    tb = ["Traceback (most recent call last):",
          f'  File "{sp}/vllm/v1/executor/multiproc_executor.py", line 596, in worker_busy_loop',
          "    output = func(*args, **kwargs)",
          f'  File "{sp}/vllm/v1/worker/gpu_model_runner.py", line 1513, in execute_model',
          "    sampler_output = self.sampler(",
          "RuntimeError: CUDA error: an illegal memory access was encountered"]
    lines = [ln[i:i + width] for ln in tb for i in range(0, len(ln), width)]
    rc = root_of_text("\n".join(lines))
    assert rc["type"] == "RuntimeError"
    assert (rc["frame"]["file"], rc["frame"]["line"]) == (f"{sp}/vllm/v1/worker/gpu_model_runner.py", 1513)
