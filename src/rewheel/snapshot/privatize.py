"""Files a rollback's undo snapshot took over rather than copied, made the store's own after.

Owns: a snapshot's `taken-over` record, `settle` (in this process) and `settle_detached`
(after the command has exited, with the trash's deletion first), and this module's `main`
(what the detached process runs).

A rollback's undo snapshot holds the build the rollback is about to replace. Its files whose
bytes the store lacks are the ones that build added — exactly what the restore then writes
over or moves out, since the snapshot it restores lacks them too. Copying them (a byte copy of
every such file a person may edit, so that an edit never reaches the snapshot) was most of the
undo snapshot's cost. Instead the snapshot links each one's live inode into the store (an `L`
object) and lists it here. Once the restore has replaced it, the environment no longer reaches
that inode: an edit there cannot change it. `settle` then looks at each object:
- the store holds its only link (a file the build wrote itself, as a run's copy-mode install
  does): nothing to do, nothing copied;
- it has another link — uv's cache (`uv pip install`'s hard links), which a later install
  could link into an environment again, or the environment itself (the restore never came):
  replaced by a copy of its bytes, checked against its name, under the same name;
- its bytes are not those its name says (edited while the environment still reached it, as
  after a rollback killed before its restore): removed. The snapshot then names that file as
  missing, and no snapshot keeps the edit.
A record is settled after every rollback (detached), on a rollback that stops before its
restore (here), and at the start of the store's next snapshot, restore or prune.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rewheel import proc
from rewheel.errors import RewheelError
from rewheel.paths import fsync_dir
from rewheel.snapshot.objects import Objects, object_name

TAKEN_OVER = "taken-over"


@dataclass
class Settled:
    """What `settle` found, by outcome (see `Objects.privatize`)."""
    counts: dict[str, int] = field(default_factory=dict)
    records: int = 0
    seconds: float = 0.0

    @property
    def copied(self) -> int:
        return self.counts.get("copied", 0)


def write_record(folder: Path, taken: list[tuple[str, str, int]]) -> None:
    """The list of objects a snapshot took over, in its folder (before the snapshot is
    committed: a snapshot that names them is never without it)."""
    data = json.dumps({"objects": [list(t) for t in taken]}).encode()
    fd = os.open(folder / TAKEN_OVER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def pending(env_dir: Path) -> list[Path]:
    """The records not yet settled, of the store of one environment."""
    snaps = Path(env_dir) / "snapshots"
    try:
        names = os.listdir(snaps)
    except OSError:
        return []
    return [snaps / n / TAKEN_OVER for n in sorted(names)
            if not n.startswith(".") and os.path.isfile(snaps / n / TAKEN_OVER)]


def _entries(record: Path) -> list[tuple[str, int]]:
    """(object name, inode) of each entry of a record; what is not one is passed over (an
    object name is rebuilt from its parts, so a tampered record names nothing outside)."""
    try:
        doc = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return []
    out = []
    for item in doc.get("objects", []) if isinstance(doc, dict) else []:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and type(item[2]) is int):
            continue
        head, _, mtime = item[0].rpartition("-")
        sha = head.replace("/", "", 1)
        try:
            name = object_name(sha, "L", int(mtime))
        except ValueError:
            continue
        if name == item[0]:
            out.append((name, item[2]))
    return out


def settle(env_dir: Path) -> Settled:
    """Settle every pending record of the store of `env_dir` (see the module's docstring). A
    record whose objects could not all be looked at (an error) stays, for the next time."""
    t0 = time.monotonic()
    done = Settled()
    records = pending(env_dir)
    if not records:
        return done
    with Objects(env_dir, create=False) as objs:
        for record in records:
            ok = True
            for name, ino in _entries(record):
                try:
                    how = objs.privatize(name, ino)
                except OSError:
                    ok = False
                    continue
                done.counts[how] = done.counts.get(how, 0) + 1
            if ok:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(record)
                    fsync_dir(record.parent)
                done.records += 1
    done.seconds = time.monotonic() - t0
    return done


def settle_detached(env_dir: Path, remove_first: list[str] | None = None) -> bool:
    """Settle the pending records after this command has exited, in a process of its own;
    `remove_first`: folders of the store's trash deleted before (what the restore moved out
    still links some of the objects, which then need no copy). False where no process could
    be started (the caller settles here)."""
    argv = [sys.executable, "-m", "rewheel.snapshot.privatize", str(env_dir), *(remove_first or [])]
    try:
        proc.detach(argv)
    except (OSError, RewheelError):
        return False
    return True


def main(argv: list[str]) -> int:
    """`python -m rewheel.snapshot.privatize ENV_DIR [TRASH_FOLDER...]`: what a rollback
    leaves running when it exits."""
    if not argv:
        return 2
    if argv[1:]:
        try:
            proc.run(["rm", "-rf", "--", *argv[1:]])
        except (OSError, RewheelError):
            for p in argv[1:]:
                shutil.rmtree(p, ignore_errors=True)
    settle(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
