"""Scoring `rewheel why`'s answer against a hand-made truth (`truth.json` next to a set of
logs: `../shared/real-logs`, `tests/logs/heldout`): what an operator needs from the answer —
the exception type, its message, the failing process and the innermost frame of the root
exception. Each truth records its judgement calls in `notes`; `any_rank` and `frame_alt` list
the alternatives it also accepts, `message_lacks` text the message must not hold."""

from __future__ import annotations

import re
from typing import Any


def _basename(path: str) -> str:
    return re.split(r"[\\/]", path)[-1]


def score(rc: dict[str, Any] | None, truth: dict[str, Any]) -> list[str]:
    """What is wrong with `rc` against `truth` (empty: fully right)."""
    if rc is None:
        return ["no root cause"]
    wrong: list[str] = []
    type_ = rc["type"] or ""
    if type_.rsplit(".", 1)[-1] != (truth["type"] or "").rsplit(".", 1)[-1]:
        wrong.append(f"type {type_!r} != {truth['type']!r}")
    message = rc["message"] or ""
    if truth["message_contains"] not in message:
        wrong.append(f"message {message[:200]!r} lacks {truth['message_contains']!r}")
    if truth.get("message_lacks") and truth["message_lacks"] in message:
        wrong.append(f"message holds {truth['message_lacks']!r}")
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


def aspects(rc: dict[str, Any] | None, truth: dict[str, Any]) -> dict[str, bool]:
    """Which of type, message, process and frame are right (for the counts of a closing note)."""
    wrong = " ".join(score(rc, truth))
    return {k: rc is not None and k not in wrong for k in ("type", "message", "rank", "frame")}
