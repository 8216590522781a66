"""Work shared with a forked second process: a read-only scan (`diff`'s line counts, the
folder walk of `patches`) whose two halves need no lock between them.

Owns `share`: this process does its half while a forked one does the other and sends back
what it found; a second process that dies, raises or stays silent long after this half is
done is killed, and the caller does that half itself — the answer never depends on the fork.
`worth_sharing` is the one rule for when a fork pays. The fork and the messages are those of
the restore's second lane (`rewheel.snapshot.lanes`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from rewheel.snapshot.lanes import fork_child, recv_msg, send_msg


def worth_sharing(items: int, least: int) -> bool:
    """Whether `items` units of work are enough (`least`) to pay for a fork, on a machine
    with a second CPU to run it (Linux: a fork beside a progress display's thread is safe
    there, see `fork_child`)."""
    return items >= least and sys.platform.startswith("linux") and (os.cpu_count() or 1) >= 2


def share(mine: Callable[[], None], theirs: Callable[[], tuple[Any, ...]], *,
          wait_min: float) -> tuple[Any, ...] | None:
    """Run `theirs` in a forked process and `mine` here, at the same time; what `theirs`
    returned (a tuple `marshal` can carry), or None when the other process did not deliver
    it: the system refused the fork (no memory, a process limit), it raised or died, or it
    was still silent `wait_min` seconds (at least three times as long as `mine` took) after
    `mine` returned — stuck on a lock a thread of this process held at the fork — and was
    killed. The caller then does that half itself."""
    r, w = os.pipe()

    def body() -> None:
        os.close(r)
        send_msg(w, ("done", theirs()))

    try:
        pid = fork_child(body)
    except OSError:
        os.close(r)
        os.close(w)
        mine()
        return None
    os.close(w)
    msg: tuple[Any, ...] | None = None
    try:
        t0 = time.monotonic()
        mine()
        if select.select([r], [], [], max(wait_min, 3 * (time.monotonic() - t0)))[0]:
            with contextlib.suppress(EOFError, OSError, ValueError):
                msg = recv_msg(r)
    finally:
        if msg is None:  # overdue, dead already (a no-op then), or this process is failing
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.close(r)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if msg is None or msg[0] != "done" or not isinstance(msg[1], tuple):
        return None
    return msg[1]
