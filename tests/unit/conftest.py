"""The unit layer: logic and branches with in-memory fakes, no process started. A test that
starts one (through `subprocess`, `os.fork`, `os.posix_spawn` or an exec) fails, naming the
command: what needs a real process belongs to the end-to-end tests beside this folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


class ProcessStarted(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(what: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            shown = args[0] if args else kwargs.get("args", "")
            raise ProcessStarted(f"a unit test started a process ({what}: {shown!r}); fake it, or move "
                                 "the test to the end-to-end layer")
        return fail

    class NoPopen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            refuse("subprocess.Popen")(args)

    def detach(argv: Any) -> None:
        # The store's trash is deleted by a detached `rm -rf -- PATHS` on a host, and what an
        # undo snapshot took over settled by `python -m rewheel.snapshot.privatize`: here, inline.
        argv = list(argv)
        if argv[1:3] == ["-m", "rewheel.snapshot.privatize"]:
            from rewheel.snapshot import privatize

            for path in argv[4:]:
                shutil.rmtree(path, ignore_errors=True)
            privatize.settle(Path(argv[3]))
            return
        if argv[:3] != ["rm", "-rf", "--"]:
            refuse("proc.detach")(argv)
        for path in argv[3:]:
            shutil.rmtree(path, ignore_errors=True)

    from rewheel import proc

    monkeypatch.setattr(proc, "detach", detach)
    monkeypatch.setattr(subprocess, "Popen", NoPopen)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp", "execvpe",
                 "system", "popen"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
