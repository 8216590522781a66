"""`trash.discard_displaced` where no process can be started: what the restore moved out is
deleted here, and an undo snapshot's taken-over objects are settled here — the one fallback for
both the detached `rm -rf` and the detached `privatize`."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewheel import proc
from rewheel.errors import RewheelError
from rewheel.snapshot import privatize, trash
from rewheel.snapshot.restore import RestoreResult


def _displaced(tmp_path: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        d = tmp_path / "env" / f"gone-{i}"
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.py").write_text("x = 1\n")
        out.append(str(d))
    return out


@pytest.mark.parametrize("pending", [False, True])
@pytest.mark.parametrize("error", [OSError("no fork"), RewheelError("no rm")])
def test_no_process_to_start_deletes_and_settles_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      pending: bool, error: Exception) -> None:
    started: list[list[str]] = []

    def detach(argv: list[str]) -> None:
        started.append(list(argv))
        raise error

    settled: list[Path] = []
    monkeypatch.setattr(proc, "detach", detach)
    monkeypatch.setattr(privatize, "pending", lambda env_dir: [env_dir / "taken-over"] if pending else [])
    monkeypatch.setattr(privatize, "settle", lambda env_dir: settled.append(env_dir))
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    res = RestoreResult(snapshot_id="s1", written=0, deleted=0, chmodded=0, unchanged=0, verified=0, seconds=0.0,
                        displaced=_displaced(tmp_path, 3))
    trash.discard_displaced(res, home, settle=tmp_path / "store")
    assert len(started) == 1  # one process tried: privatize (with the trash) or rm, never both
    assert (started[0][1:3] == ["-m", "rewheel.snapshot.privatize"]) is pending
    assert res.displaced == [] and not list((tmp_path / "env").iterdir())
    assert not [p for p in (home / trash.TRASH).rglob("*") if p.is_file()]  # the trash emptied here
    assert settled == ([tmp_path / "store"] if pending else [])
