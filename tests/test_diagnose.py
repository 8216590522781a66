"""`rewheel why`: the root cause of a crash from its log.

The corpus in tests/logs was written from vLLM's real output formats (see build_corpus.py);
each *.expected.json states the root cause by hand. Property tests re-dress the same logs
(journald prefixes on/off, ANSI colours, CRLF, another interleaving of the ranks, raw
instead of logger-prefixed tracebacks) and require the same answer.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rewheel import diagnose
from devtools.bench_logs import generate_log
from rewheel.errors import CommandNotFound, UsageError
import support_cli

LOGS = Path(__file__).parent / "logs"
CORPUS = sorted(p.stem for p in LOGS.glob("*.log"))
FIELDS = ("type", "message", "rank", "frame", "kind", "count", "restarts", "log_line")
JOURNAL_RE = re.compile(r"^(?P<ts>[A-Z][a-z]{2} \d\d \d\d:\d\d:\d\d) (?P<host>\S+) (?P<ident>[^\[\s]+)\[(?P<pid>\d+)\]: (?P<msg>.*)$")
PREFIX_RE = re.compile(r"^\((?P<label>[^()]*?) pid=(?P<pid>\d+)\) ")


def expected(name: str) -> dict | None:
    return json.loads((LOGS / f"{name}.expected.json").read_text())["root_cause"]


def check(got: dict | None, exp: dict | None, fields: tuple[str, ...] = FIELDS) -> None:
    if exp is None:
        assert got is None, f"expected no root cause, got {got}"
        return
    assert got is not None, "no root cause found"
    for key in fields:
        if key == "secondary":
            continue
        assert got[key] == exp[key], f"{key}: expected {exp[key]!r}, got {got[key]!r}"
    if "secondary" in fields and exp.get("secondary_types") is not None:
        assert [s["type"] for s in got["secondary"]] == exp["secondary_types"]


def root_of(text: str) -> dict | None:
    return diagnose.analyse_lines(text.splitlines(), package="vllm").to_json()["root_cause"]


# ---- the corpus ---------------------------------------------------------------------
def test_corpus_is_complete() -> None:
    # the cases the issue asks for, each with a hand-written expectation
    for name in ("story_worker_crash_journald", "engine_core_failure_ansi", "kv_cache_too_small",
                 "cuda_oom_worker_journald", "unsupported_gpu_arch", "import_undefined_symbol_restarts",
                 "config_validation_error", "nccl_error_interleaved", "nccl_abort_no_traceback",
                 "chained_during_handling", "chained_direct_cause", "truncated_end", "truncated_start",
                 "empty", "healthy_no_errors", "host_oom_killer", "exception_group_taskgroup"):
        assert name in CORPUS
        assert (LOGS / f"{name}.expected.json").is_file()


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_file(name: str) -> None:
    got = diagnose.analyse_file(LOGS / f"{name}.log", package="vllm").to_json()["root_cause"]
    check(got, expected(name), FIELDS + ("secondary",))


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_lines_match_file(name: str) -> None:
    """The line-by-line path (stdin, journals) and the fast file path agree exactly."""
    # lines end at "\n" only, as in the file (a `\r` progress bar is not a line of its own)
    with open(LOGS / f"{name}.log", encoding="utf-8", newline="\n") as fh:
        by_lines = diagnose.analyse_lines(fh, package="vllm").to_json()
    by_file = diagnose.analyse_file(LOGS / f"{name}.log", package="vllm").to_json()
    assert by_lines == by_file
    check(by_lines["root_cause"], expected(name))


def test_json_shape_is_exact() -> None:
    doc = diagnose.analyse_file(LOGS / "story_worker_crash_journald.log", package="vllm").to_json()
    assert set(doc) == {"root_cause"}
    rc = doc["root_cause"]
    assert set(rc) == {"type", "message", "rank", "frame", "log_line", "kind", "count", "restarts", "secondary",
                       "pid", "node", "suspects", "rank_source", "evidence"}
    assert rc["suspects"] == []  # `why` on a log alone: no upgrade to compare the frames with
    assert (rc["pid"], rc["node"]) == (216070, "llm-two")  # Worker_TP4's pid, the journal's host
    # what named the process: its own lines' prefix, the evidence for it first
    assert rc["rank_source"] == "prefix"
    assert rc["evidence"][0] == {"source": "prefix", "rank": "Worker_TP4", "pid": 216070, "node": "llm-two",
                                 "log_line": rc["log_line"]}
    assert set(rc["frame"]) == {"file", "line", "function", "source"}
    assert rc["secondary"] and all(s["relation"] == "cascade" for s in rc["secondary"])
    assert set(rc["secondary"][0]) == {"type", "message", "rank", "log_line", "count", "relation"}
    json.dumps(doc)
    assert diagnose.analyse_lines([]).to_json() == {"root_cause": None}


def test_story_summary_names_what_the_operator_grepped_for() -> None:
    d = diagnose.analyse_file(LOGS / "story_worker_crash_journald.log", package="vllm")
    s = d.summary()
    assert "TypeError" in s and "Worker_TP4" in s and "deepseek_v2.py:998" in s and "3 restarts" in s
    assert "no error found" in diagnose.analyse_lines(["INFO all good"]).summary()


def test_package_decides_the_frame() -> None:
    # deepest frame overall is in torch; deepest inside vllm is the fused-MoE line
    path = LOGS / "cuda_oom_worker_journald.log"
    assert diagnose.analyse_file(path, package="vllm").root.frame.file.endswith("fused_moe/fused_moe.py")
    assert diagnose.analyse_file(path, package="torch").root.frame.file.endswith("torch/_ops.py")
    assert diagnose.analyse_file(path).root.frame.file.endswith("torch/_ops.py")  # no package: deepest
    # a package that is nowhere in the traceback falls back to the deepest frame
    assert diagnose.analyse_file(path, package="sglang").root.frame.line == 1243


# ---- the same log, dressed differently ----------------------------------------------
def strip_journald(text: str) -> str:
    return "\n".join(JOURNAL_RE.sub(r"\g<msg>", ln) for ln in text.splitlines()) + "\n"


def add_journald(text: str, pid: int = 4242) -> str:
    return "".join(f"Feb 20 23:31:36 llm-two vllm-kimi[{pid}]: {ln}\n" for ln in text.splitlines())


def colour(text: str) -> str:
    out = []
    for ln in text.splitlines():
        ln = PREFIX_RE.sub(lambda m: f"\x1b[1;36m{m.group(0)[:-1]}\x1b[0;0m ", ln)
        ln = re.sub(r"\b(INFO|WARNING|ERROR)\b(?= \d\d-\d\d)", lambda m: f"\x1b[1;31m{m.group(1)}\x1b[0m", ln)
        out.append(ln)
    return "\n".join(out) + "\n"


def deinterleave(text: str) -> str:
    """Another legal interleaving: each process's lines in their own order, processes one
    after another, in order of their first line (what a different scheduling could print)."""
    blocks: dict[str, list[str]] = {}
    for ln in text.splitlines():
        m = PREFIX_RE.match(JOURNAL_RE.sub(r"\g<msg>", ln))
        blocks.setdefault(m.group(0) if m else "", []).append(ln)
    return "".join(ln + "\n" for block in blocks.values() for ln in block)


@pytest.mark.parametrize("name", ["story_worker_crash_journald", "cuda_oom_worker_journald",
                                  "nccl_error_interleaved", "import_undefined_symbol_restarts",
                                  "host_oom_killer"])
def test_without_journald_prefixes_same_root(name: str) -> None:
    text = (LOGS / f"{name}.log").read_text()
    check(root_of(strip_journald(text)), expected(name))


@pytest.mark.parametrize("name", ["story_worker_crash_plain", "kv_cache_too_small", "unsupported_gpu_arch",
                                  "config_validation_error", "chained_during_handling", "chained_direct_cause",
                                  "truncated_end", "engine_core_failure_ansi"])
def test_with_journald_prefixes_and_colour_same_root(name: str) -> None:
    text = (LOGS / f"{name}.log").read_text()
    check(root_of(add_journald(text)), expected(name))
    check(root_of(colour(text)), expected(name))
    check(root_of(add_journald(colour(text))), expected(name))
    check(root_of(text.replace("\n", "\r\n")), expected(name))


@pytest.mark.parametrize("name", ["story_worker_crash_plain", "nccl_error_interleaved", "unsupported_gpu_arch",
                                  "cuda_oom_worker_journald"])
def test_other_interleaving_same_error(name: str) -> None:
    text = (LOGS / f"{name}.log").read_text()
    exp = expected(name)
    # which rank printed first may change; the error, its frame and its spread may not
    check(root_of(deinterleave(text)), exp, ("type", "message", "frame", "kind", "count", "restarts"))


def test_tracebacks_without_logger_headers_same_root() -> None:
    text = (LOGS / "story_worker_crash_plain.log").read_text()
    raw = re.sub(r"(?m)(\) )(?:INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ", r"\1", text)
    assert raw != text
    check(root_of(raw), expected("story_worker_crash_plain"))


def test_restarts_are_counted_without_journald() -> None:
    # three crash-loop starts as plain output: new pids per start, no systemd lines
    text = strip_journald((LOGS / "story_worker_crash_journald.log").read_text())
    rc = root_of(text)
    assert (rc["count"], rc["restarts"], rc["log_line"]) == (5, 3, 35)


def test_root_is_the_first_crash_not_a_later_one() -> None:
    first = (LOGS / "kv_cache_too_small.log").read_text()
    later = (LOGS / "story_worker_crash_plain.log").read_text()
    rc = root_of(add_journald(first, 100) + add_journald(later, 200))
    assert rc["type"] == "ValueError" and rc["restarts"] == 1
    rc = root_of(add_journald(later, 100) + add_journald(first, 200))
    assert rc["type"] == "TypeError"


# ---- edge cases, robustness, bounded memory ------------------------------------------
def test_warning_level_traceback_alone_is_reported_when_nothing_else() -> None:
    text = "\n".join([
        "WARNING 02-20 23:31:36 [registry.py:612] Unable to load fused kernel:",
        "WARNING 02-20 23:31:36 [registry.py:612] Traceback (most recent call last):",
        'WARNING 02-20 23:31:36 [registry.py:612]   File "/x/vllm/ops.py", line 4, in <module>',
        "WARNING 02-20 23:31:36 [registry.py:612]     import fast_ext",
        "WARNING 02-20 23:31:36 [registry.py:612] ModuleNotFoundError: No module named 'fast_ext'",
    ])
    rc = root_of(text)
    assert rc["type"] == "ModuleNotFoundError" and rc["frame"]["source"] == "import fast_ext"


def test_only_cascades_are_still_reported() -> None:
    lines = [ln for ln in (LOGS / "story_worker_crash_plain.log").read_text().splitlines()
             if not ln.startswith(("(Worker_TP4", "(Worker_TP1"))]
    rc = root_of("\n".join(lines))
    assert rc["type"] == "Exception" and "WorkerProc initialization failed" in rc["message"]


def test_chain_of_cascades_picks_last_and_lists_chain() -> None:
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/x/vllm/a.py", line 1, in f',
        "    g()",
        "EOFError",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/x/vllm/b.py", line 2, in h',
        "    raise RuntimeError('bad config value 7')",
        "RuntimeError: bad config value 7",
    ])
    rc = root_of(text)
    assert (rc["type"], rc["message"], rc["frame"]["line"]) == ("RuntimeError", "bad config value 7", 2)
    assert [(s["type"], s["relation"]) for s in rc["secondary"]] == [("EOFError", "chained")]


def test_deep_recursion_and_huge_messages_are_capped() -> None:
    lines = ["Traceback (most recent call last):"]
    for i in range(50000):
        lines += [f'  File "/x/vllm/rec.py", line {i + 1}, in f', "    return f(n - 1)"]
    lines += ["  [Previous line repeated 996 more times]", "RecursionError: maximum recursion depth exceeded"]
    lines += ["x" * 200] * 10000  # a message that never ends
    rc = root_of("\n".join(lines))
    assert rc["type"] == "RecursionError" and rc["frame"]["line"] == 50000
    assert len(rc["message"]) <= diagnose.MAX_MESSAGE_CHARS + 400


def test_never_finished_traceback_is_closed_and_later_root_still_found(tmp_path: Path) -> None:
    # a worker killed in the middle of printing: its traceback never ends
    head = ["(Worker_TP1 pid=11) Traceback (most recent call last):",
            '(Worker_TP1 pid=11)   File "/x/vllm/w.py", line 9, in run']
    noise = [f"(APIServer pid=10) INFO 02-20 23:31:36 [loggers.py:1] tick {i}" for i in range(5000)]
    tail = ["(Worker_TP2 pid=12) Traceback (most recent call last):",
            '(Worker_TP2 pid=12)   File "/x/vllm/y.py", line 3, in load',
            "(Worker_TP2 pid=12)     open(path)",
            "(Worker_TP2 pid=12) FileNotFoundError: [Errno 2] No such file or directory: '/models/x'"]
    p = tmp_path / "x.log"
    p.write_text("\n".join(head + noise + tail) + "\n")
    rc = diagnose.analyse_file(p, package="vllm").to_json()["root_cause"]
    # the cut-off one came first, and it is what the log shows first
    assert (rc["type"], rc["rank"], rc["log_line"]) == (None, "Worker_TP1", 1)
    assert [s["type"] for s in rc["secondary"]] == ["FileNotFoundError"]


def test_monster_line_and_binary_garbage(tmp_path: Path) -> None:
    p = tmp_path / "g.log"
    p.write_bytes(b"\xff\xfe garbage\n" + b"A" * (3 << 20) + b"\n" +
                  (LOGS / "config_validation_error.log").read_bytes())
    rc = diagnose.analyse_file(p, package="vllm").to_json()["root_cause"]
    assert rc["type"] == "pydantic_core._pydantic_core.ValidationError"
    assert rc["log_line"] == expected("config_validation_error")["log_line"] + 2


def test_no_trailing_newline(tmp_path: Path) -> None:
    p = tmp_path / "n.log"
    p.write_text((LOGS / "chained_during_handling.log").read_text().rstrip("\n"))
    check(diagnose.analyse_file(p, package="vllm").to_json()["root_cause"], expected("chained_during_handling"))


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="nope.log"):
        diagnose.analyse_file(tmp_path / "nope.log")


def test_generated_large_log_is_understood(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    info = generate_log(p, 3_000_000)
    assert 2_900_000 <= p.stat().st_size <= 3_300_000
    rc = diagnose.analyse_file(p, package="vllm").to_json()["root_cause"]
    assert rc["type"] == info["root_type"] and rc["rank"] == info["root_rank"]
    assert rc["log_line"] == info["root_line"] and rc["restarts"] == info["restarts"]
    assert rc["frame"]["line"] == info["root_frame_line"]
    with open(p, encoding="utf-8") as fh:
        assert diagnose.analyse_lines(fh, package="vllm").to_json() == {"root_cause": rc}


# ---- the journal ----------------------------------------------------------------------
def journal_records(text: str, unit: str, t0: int) -> list[dict]:
    recs = []
    for i, ln in enumerate(text.splitlines()):
        m = JOURNAL_RE.match(ln)
        assert m, ln
        ts = str((t0 + i) * 1_000_000 // 1000 * 1000 + i)
        if m.group("ident") == "systemd":
            recs.append({"MESSAGE": m.group("msg"), "_PID": "1", "__REALTIME_TIMESTAMP": ts,
                         "UNIT": f"{unit}.service", "SYSLOG_IDENTIFIER": "systemd"})
        else:
            recs.append({"MESSAGE": m.group("msg"), "_PID": m.group("pid"), "__REALTIME_TIMESTAMP": ts,
                         "_SYSTEMD_UNIT": f"{unit}.service", "SYSLOG_IDENTIFIER": m.group("ident")})
    return recs


def write_journal(fake_host, unit: str, name: str, t0: int = 1_771_630_000) -> list[dict]:
    recs = journal_records((LOGS / f"{name}.log").read_text(), unit, t0)
    path = fake_host.root / "journal" / f"{unit}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")
    return recs


def test_analyse_journal_matches_the_file(fake_host) -> None:
    write_journal(fake_host, "vllm-kimi-k25", "story_worker_crash_journald")
    d = diagnose.analyse_journal("vllm-kimi-k25", "@1771630000", package="vllm")
    check(d.to_json()["root_cause"], expected("story_worker_crash_journald"), FIELDS + ("secondary",))
    call = fake_host.calls("journalctl")[-1]
    assert call[:1] == ["journalctl"] or call[0].endswith("journalctl")
    assert "-u" in call and "vllm-kimi-k25" in call and "--since" in call and "@1771630000" in call
    assert "json" in call and "--no-pager" in call


def test_analyse_journal_since_excludes_older_crashes(fake_host) -> None:
    t0 = 1_771_630_000
    old = write_journal(fake_host, "svc", "cuda_oom_worker_journald", t0)
    write_journal(fake_host, "svc", "import_undefined_symbol_restarts", t0 + 10_000)
    rc = diagnose.analyse_journal("svc", f"@{t0 + 5000}", package="vllm").to_json()["root_cause"]
    assert rc["type"] == "ImportError" and rc["restarts"] == 5
    rc_all = diagnose.analyse_journal("svc", None, package="vllm").to_json()["root_cause"]
    assert rc_all["type"] == "torch.OutOfMemoryError" and len(old) > 0


def test_analyse_journal_errors(fake_host) -> None:
    with pytest.raises(UsageError, match="svc"):
        diagnose.analyse_journal("svc", "not a time", package="vllm")
    fake_host.hide("journalctl")
    with pytest.raises(CommandNotFound, match="journalctl"):
        diagnose.analyse_journal("svc", None)


# ---- the command line -------------------------------------------------------------------
def rewheel(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    return support_cli.rewheel(*args, input=stdin, env={**os.environ, **(env or {})}, timeout=120)


def test_cli_why_json_and_human() -> None:
    path = str(LOGS / "story_worker_crash_journald.log")
    cp = rewheel("why", path, "--package", "vllm", "--json")
    assert cp.returncode == 0, cp.stderr
    check(json.loads(cp.stdout)["root_cause"], expected("story_worker_crash_journald"))
    cp = rewheel("why", path, "--package", "vllm")
    assert cp.returncode == 0
    out = " ".join(cp.stdout.split())
    for needle in ("TypeError", "topk_indices_buffer", "Worker_TP4", "deepseek_v2.py:998",
                   "self.self_attn = attn_cls(", "log line 35", "5 processes", "3 restarts", "secondary",
                   "Engine core initialization failed"):
        assert needle in out, needle


def test_cli_why_reads_stdin_as_a_log_file_whatever_the_terminal_encoding() -> None:
    """A log piped in is bytes from elsewhere: read as a file is (UTF-8, a bad byte replaced),
    not in PYTHONIOENCODING's codec — with ascii:strict, `why -` used to stop with an internal
    error (exit 5) at the first non-ASCII byte."""
    import os
    log = b"Traceback (most recent call last):\nRuntimeError: caf\xc3\xa9 \xff CUDA error: out of memory\n"
    cp = support_cli.rewheel("why", "-", input=log, text=False, timeout=120,
                             env={**os.environ, "PYTHONIOENCODING": "ascii:strict"})
    assert cp.returncode == 0, cp.stderr
    assert b"caf\\xe9 \\ufffd CUDA error: out of memory" in cp.stdout


def test_cli_why_stdin_nothing_found_and_usage_errors(tmp_path: Path) -> None:
    cp = rewheel("why", "-", "--json", stdin=(LOGS / "host_oom_killer.log").read_text())
    assert cp.returncode == 0 and json.loads(cp.stdout)["root_cause"]["kind"] == "error-line"
    cp = rewheel("why", "--json", stdin=(LOGS / "healthy_no_errors.log").read_text())
    assert cp.returncode == 0 and json.loads(cp.stdout) == {"root_cause": None}
    cp = rewheel("why", stdin=(LOGS / "healthy_no_errors.log").read_text())
    assert cp.returncode == 0 and "no error found" in cp.stdout
    cp = rewheel("why", str(tmp_path / "missing.log"))
    assert cp.returncode == 2 and "missing.log" in "".join(cp.stderr.split())
    cp = rewheel("why", str(LOGS / "empty.log"), "--unit", "x")
    assert cp.returncode == 2
    cp = rewheel("why", str(LOGS / "empty.log"), "--since", "1 min ago")
    assert cp.returncode == 2 and "--unit" in cp.stderr


def test_cli_why_unit(fake_host) -> None:
    write_journal(fake_host, "vllm-kimi-k25", "story_worker_crash_journald")
    cp = rewheel("why", "--unit", "vllm-kimi-k25", "--since", "@1771630000", "--package", "vllm", "--json")
    assert cp.returncode == 0, cp.stderr
    check(json.loads(cp.stdout)["root_cause"], expected("story_worker_crash_journald"))


@pytest.mark.parametrize("chunk", [61, 4096])
def test_chunk_boundaries_do_not_matter(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # lines straddle chunks (61 bytes is shorter than most lines): same answers everywhere
    names = ["story_worker_crash_journald", "truncated_start", "nccl_error_interleaved", "unsupported_gpu_arch",
             "engine_core_failure_ansi"]
    want = {n: diagnose.analyse_file(LOGS / f"{n}.log", package="vllm").to_json() for n in names}
    monkeypatch.setattr(diagnose.readers, "CHUNK", chunk)
    for n in names:
        assert diagnose.analyse_file(LOGS / f"{n}.log", package="vllm").to_json() == want[n], n


def test_next_logger_record_is_not_part_of_the_message() -> None:
    p = "(APIServer pid=5) "
    text = "\n".join([
        p + "WARNING 02-20 23:31:36 [serving_chat.py:1201] Traceback (most recent call last):",
        p + 'WARNING 02-20 23:31:36 [serving_chat.py:1201]   File "/x/vllm/chat_utils.py", line 14, in apply',
        p + "WARNING 02-20 23:31:36 [serving_chat.py:1201]     return render()",
        p + "WARNING 02-20 23:31:36 [serving_chat.py:1201] jinja2.exceptions.TemplateError: roles must alternate",
        p + "INFO 02-20 23:31:37 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s",
        p + "INFO 02-20 23:31:47 [loggers.py:123] Engine 000: Avg prompt throughput: 2.0 tokens/s",
    ])
    rc = root_of(text)
    assert rc["message"] == "roles must alternate"
