"""`rewheel why` on crash logs as people posted them, scored against a hand-made truth.

The logs and their truth live outside the project, next to the repository
(`../shared/real-logs/truth.json`); users do not have them, so the test skips without them.
Each log is one case, scored on what an operator needs from the answer: the exception type,
its message, the failing process and the innermost frame of the root exception. The truth
records the judgement calls (which rank, which frame counts) in its `notes`; `frame_alt` and
`any_rank` list the alternatives it also accepts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rewheel import diagnose

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real-logs"
TRUTH = REAL / "truth.json"


def _cases() -> list[dict[str, Any]]:
    if not TRUTH.is_file():
        return []
    return json.loads(TRUTH.read_text(encoding="utf-8"))


CASES = _cases()


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path)[-1]


def score(rc: dict[str, Any] | None, truth: dict[str, Any]) -> list[str]:
    """What is wrong with `rc` against `truth` (empty: fully right)."""
    if rc is None:
        return ["no root cause"]
    wrong: list[str] = []
    type_ = rc["type"] or ""
    if type_.rsplit(".", 1)[-1] != truth["type"].rsplit(".", 1)[-1]:
        wrong.append(f"type {type_!r} != {truth['type']!r}")
    if truth["message_contains"] not in (rc["message"] or ""):
        wrong.append(f"message {rc['message'][:200]!r} lacks {truth['message_contains']!r}")
    if truth.get("rank") is None:
        if rc["rank"] is not None:
            wrong.append(f"rank {rc['rank']!r} where the log names none")
    else:
        wants = [truth["rank"], *truth.get("any_rank", [])]
        if not rc["rank"] or not any(w in rc["rank"] for w in wants):
            wrong.append(f"rank {rc['rank']!r} not one of {wants!r}")
    frame = rc["frame"] or {}
    got = (_basename(frame.get("file") or ""), frame.get("function"))
    accepted = [(truth["frame_file"], truth["frame_function"]), *map(tuple, truth.get("frame_alt", []))]
    if got not in accepted:
        wrong.append(f"frame {got!r} not one of {accepted!r}")
    return wrong


@pytest.mark.skipif(not CASES, reason="no ../shared/real-logs next to the repository")
@pytest.mark.parametrize("truth", CASES, ids=[c["file"].split("-", 1)[0] for c in CASES])
def test_real_log(truth: dict[str, Any]) -> None:
    path = REAL / truth["file"]
    by_file = diagnose.analyse_file(path).to_json()
    assert score(by_file["root_cause"], truth) == []
    # stdin and journals take the line-by-line path: the same answer
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        assert diagnose.analyse_lines(fh).to_json() == by_file


# The same logs as other collectors and pastes would have given them: the answer must not move.
WRAPPERS = {
    "docker-compose": lambda ln: f"vllm-1  | {ln}",
    "kubectl-prefix": lambda ln: f"[pod/vllm-0/vllm] {ln}",
    "ci-timestamps": lambda ln: f"2025-07-28T15:07:00.9685040Z {ln}",
    "journald": lambda ln: f"Jul 28 15:07:00 gpu-07 vllm[4700]: {ln}",
    "quoted-reply": lambda ln: f"> {ln}",
    "crlf": lambda ln: ln + "\r",
    "right-padded": lambda ln: ln + " " * 50,
    "lost-indentation": lambda ln: ln.lstrip(" "),
}


@pytest.mark.skipif(not CASES, reason="no ../shared/real-logs next to the repository")
@pytest.mark.parametrize("wrap", list(WRAPPERS))
def test_real_logs_rewrapped(wrap: str) -> None:
    wrong = {}
    for truth in CASES:
        text = (REAL / truth["file"]).read_text(encoding="utf-8", errors="replace")
        rc = diagnose.analyse_lines([WRAPPERS[wrap](ln) for ln in text.split("\n")]).to_json()["root_cause"]
        if score(rc, truth):
            wrong[truth["file"]] = score(rc, truth)
    assert wrong == {}


@pytest.mark.skipif(not CASES, reason="no ../shared/real-logs next to the repository")
def test_real_logs_cut_anywhere_are_answered(tmp_path: Path) -> None:
    p = tmp_path / "cut.log"
    for truth in CASES:
        data = (REAL / truth["file"]).read_bytes()
        for cut in range(0, len(data), max(1, len(data) // 12)):
            for piece in (data[:cut], data[cut:]):
                p.write_bytes(piece)
                json.dumps(diagnose.analyse_file(p).to_json())
