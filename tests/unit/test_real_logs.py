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
from pathlib import Path
from typing import Any

import pytest

from rewheel import diagnose
from support_truth import score

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real-logs"
TRUTH = REAL / "truth.json"


def _cases() -> list[dict[str, Any]]:
    if not TRUTH.is_file():
        return []
    return json.loads(TRUTH.read_text(encoding="utf-8"))


CASES = _cases()


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
