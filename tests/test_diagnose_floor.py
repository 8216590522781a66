"""`rewheel why` is never worse than grep: the floor under the parser.

The naive answer to "what crashed?" is the first `SomethingError:` anywhere in the log. On every
log of the corpus (tests/logs) and of the real logs next to the repository, the tool's exception
type must match that baseline's whenever the baseline is right. Where no traceback is
understood, the answer comes from the best-scored `Type: message` line and the process from the
prefixes around it; the unit tests below pin those rules down.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rewheel import diagnose

LOGS = Path(__file__).parent / "logs"
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "real-logs"
BASELINE_RE = re.compile(r"([A-Za-z_][\w.]*Error):")


def baseline_type(path: Path) -> str | None:
    """The naive answer: the first `SomethingError:` anywhere in a line."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = BASELINE_RE.search(line)
            if m:
                return m.group(1)
    return None


def _base(type_: str | None) -> str | None:
    return type_.rsplit(".", 1)[-1] if type_ else None


def _cases() -> list[tuple[str, Path, str | None]]:
    cases = []
    for p in sorted(LOGS.glob("*.log")):
        rc = json.loads(p.with_suffix(".expected.json").read_text())["root_cause"]
        cases.append((p.stem, p, rc["type"] if rc else None))
    truth = REAL / "truth.json"
    if truth.is_file():
        for c in json.loads(truth.read_text(encoding="utf-8")):
            cases.append(("real-" + c["file"].split("-", 1)[0], REAL / c["file"], c["type"]))
    return cases


CASES = _cases()


@pytest.mark.parametrize(("name", "path", "truth"), CASES, ids=[c[0] for c in CASES])
def test_type_matches_or_beats_the_naive_baseline(name: str, path: Path, truth: str | None) -> None:
    rc = diagnose.analyse_file(path, package="vllm").root
    got = rc.type if rc else None
    naive = baseline_type(path)
    if _base(naive) == _base(truth):
        assert _base(got) == _base(truth), f"baseline says {naive!r} (right), the tool {got!r}"


def test_the_baseline_comparison_covers_both_sets() -> None:
    # the corpus, and (where present) the real logs; the counts are the closing note's numbers
    tool = sum(_base((diagnose.analyse_file(p, package="vllm").root or _NoRoot).type) == _base(t) for _, p, t in CASES)
    naive = sum(_base(baseline_type(p)) == _base(t) for _, p, t in CASES)
    assert tool >= naive and tool == len(CASES)


class _NoRoot:
    type = None


def root(lines: list[str]) -> dict | None:
    return diagnose.analyse_lines(lines, package="vllm").to_json()["root_cause"]


def test_the_cleanest_type_line_beats_the_first_one() -> None:
    rc = root(["RuntimeErrorRuntimeError: : CUDA error: an illegal memory access was encountered",
               "Exception: something went wrong",
               "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert rc["type"] == "RuntimeError" and rc["log_line"] == 3 and rc["kind"] == "error-line"


def test_a_type_in_the_middle_of_a_line_beats_a_keyword() -> None:
    # no traceback; the only exception type is inside a logger's sentence
    rc = root(["INFO loading model",
               "worker 3 crashed with CUDA error: an illegal memory access was encountered",
               "Error in worker loop: ValueError: tensor shapes [4, 8] and [4, 9] do not match"])
    assert rc["type"] == "ValueError" and "do not match" in rc["message"]


def test_a_type_line_at_the_start_beats_one_in_prose() -> None:
    rc = root(["the docs say ValueError: is raised for bad shapes",
               "KeyError: 'lm_head.weight'"])
    assert rc["type"] == "KeyError"


def test_an_unprefixed_error_line_takes_the_rank_its_text_names() -> None:
    rc = root(["terminate called after throwing an instance of 'c10::DistBackendError'",
               "  what():  [PG 0 (default_pg) Rank 3] Process group watchdog thread terminated with exception: "
               "NCCL error: unhandled system error"])
    assert (rc["type"], rc["rank"]) == ("c10::DistBackendError", "rank3")


def test_an_unprefixed_error_line_takes_the_process_of_the_record_before_it() -> None:
    rc = root(["(Worker_TP6 pid=801) ERROR 07-28 15:07:00 [pynccl.py:90] NCCL all_reduce failed",
               "RuntimeError: NCCL error: remote process exited or there was a network error"])
    assert (rc["rank"], rc["pid"]) == ("Worker_TP6", 801)
    # ... but not across processes of the journal, nor from far away
    rc = root(["Jul 28 15:07:00 gpu-07 vllm[4700]: (Worker_TP6 pid=801) ERROR 07-28 15:07:00 [x.py:9] failed",
               "Jul 28 15:07:00 gpu-07 python3[5100]: RuntimeError: NCCL error: remote process exited"])
    assert rc["rank"] is None
    far = ["(Worker_TP6 pid=801) ERROR 07-28 15:07:00 [x.py:9] failed"] + \
          [f"WARNING something else {i} failed" for i in range(30)] + ["RuntimeError: NCCL error: x"]
    assert root(far)["rank"] is None


def test_a_traceback_without_its_exception_line_takes_the_type_from_the_best_line() -> None:
    # the process died while printing; the same error was logged on one line elsewhere
    rc = root(["(Worker_TP1 pid=11) ERROR 07-28 15:07:00 [w.py:1] RuntimeError: CUDA error: misaligned address",
               "(Worker_TP1 pid=11) Traceback (most recent call last):",
               '(Worker_TP1 pid=11)   File "/x/vllm/w.py", line 9, in run'])
    assert (rc["type"], rc["rank"]) == ("RuntimeError", "Worker_TP1")
    assert rc["frame"]["file"] == "/x/vllm/w.py"


def test_file_and_lines_agree_when_the_floor_decides(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text("\n".join(["Traceback (most recent call last):", '  File "/x/a.py", line 3, in f'] +
                           ["noise"] * 2000 + ["Error in worker: ValueError: bad shape"]) + "\n")
    by_file = diagnose.analyse_file(p).to_json()
    with open(p, encoding="utf-8", newline="\n") as fh:
        assert diagnose.analyse_lines(fh).to_json() == by_file
    assert by_file["root_cause"]["type"] == "ValueError"


def test_a_sentence_where_the_exception_line_should_be_is_not_one() -> None:
    # the worker died mid-traceback; the launcher's sentence is not its exception line, and the
    # type comes from the error line the worker's logger wrote
    rc = root(["(WorkerDict pid=7) ERROR worker.py:12 -- RuntimeError: CUDA error: an illegal memory access",
               "Traceback (most recent call last):",
               '  File "/x/verl/workers/fsdp_workers.py", line 40, in generate',
               "    out = self.rollout.generate(batch)",
               "Error executing job with overrides: ['trainer.n_gpus_per_node=8']"])
    assert rc["type"] == "RuntimeError" and "illegal memory access" in rc["message"]
