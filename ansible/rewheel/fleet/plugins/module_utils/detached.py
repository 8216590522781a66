# Copyright: rewheel contributors
# Apache License 2.0 (see the repository's pyproject.toml)
"""A command that outlives the SSH connection which started it, and the record that lets a
later connection find it again.

The `rewheel.fleet.rewheel` module starts `rewheel run` through here: in a session of its own
(`setsid`: no controlling terminal, so the hang-up of a dropped SSH session never reaches it),
stdin from /dev/null, stdout and stderr into files beside the record (so no write ever meets a
closed pipe), its working folder `/` (Ansible removes its own temporary folder). The record,
one JSON file per recipe in the module's `runs_dir`, names the process (pid, start time since
boot and the boot's id: a pid alone may be reused), the lock it installs and the files its
answer goes to; it is written atomically before the module waits, and marked `reported` just
before the module hands the outcome to the controller. A record not marked is an outcome the
controller never got: the next module call on that recipe reattaches to it.

Why not Ansible's `async`/`poll`: its job id lives in the controller's memory of one play, so
a second play (or a controller started again) cannot find the job; and its wrapper would detach
the whole module, the dry run and the version check included. Why not `systemd-run`: it needs
systemd and root on the host, and moves rewheel out of the environment (PATH, HOME,
REWHEEL_HOME) the play gave it; a session of its own needs neither."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import time

POLL_S = 0.25  # how often a waiting module looks at the process and at its controller


def sha256_of(path):
    if not path:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _start_ticks(pid):
    """(start time in clock ticks since boot, state letter) of a process, or (None, None)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]), fields[0]  # field 22 (starttime) and field 3 (state)
    except (OSError, ValueError, IndexError):
        return None, None


def alive(record):
    """Whether the process a record names still runs: the same pid, start time and boot (a
    zombie has ended)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("boot_id") != _boot_id():
        return False
    ticks, state = _start_ticks(pid)
    return ticks is not None and ticks == record.get("start_ticks") and state not in ("Z", "X")


def started_at(record):
    """When the record's process started (epoch seconds; 0 for a record without a number there)."""
    value = record.get("started")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def controller_gone():
    """Whether the connection the module answers on is gone (a pty hung up, a pipe whose
    reader closed): the module then has nobody to tell and leaves its record unreported."""
    try:
        p = select.poll()
        p.register(1, 0)  # POLLHUP and POLLERR are always reported
        return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _fd, ev in p.poll(0))
    except (OSError, ValueError):
        return False


class DetachedRuns(object):
    """The records of one recipe's detached runs, in `folder` (created 0700)."""

    def __init__(self, folder, recipe):
        self.folder = os.path.abspath(os.path.expanduser(folder))
        key = hashlib.sha256(os.path.realpath(recipe).encode()).hexdigest()[:16]
        self.path = os.path.join(self.folder, "run-%s.json" % key)
        self.stdout = os.path.join(self.folder, "run-%s.out.json" % key)
        self.stderr = os.path.join(self.folder, "run-%s.err.log" % key)

    def load(self):
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def save(self, record):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def unreported(self):
        rec = self.load()
        return rec if rec is not None and not rec.get("reported") else None

    def mark(self, record, how):
        """Mark the record reported (`how`); None, or why it could not be (a full disk: the
        outcome is still handed over, and the next call reports it once more)."""
        record["reported"] = how
        record["reported_at"] = time.time()
        try:
            self.save(record)
        except OSError as exc:
            return "could not mark %s reported: %s" % (self.path, exc.strerror or exc)
        return None

    def start(self, argv, env, **about):
        """Start `argv` detached; its record saved (with `about`) before this returns."""
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd="/",
                                    env=env, close_fds=True, start_new_session=True)
        ticks, _state = _start_ticks(proc.pid)
        record = dict(about, argv=argv, pid=proc.pid, start_ticks=ticks, boot_id=_boot_id(),
                      started=time.time(), stdout=self.stdout, stderr=self.stderr, reported=False)
        self.save(record)
        return proc, record

    def wait(self, record, proc=None):
        """Until the process ends (the parent reaps it; another module call watches /proc).
        A module whose controller went away exits here, leaving the record for the next one."""
        while (proc.poll() is None) if proc is not None else alive(record):
            if controller_gone():
                os._exit(0)
            time.sleep(POLL_S)

    # (the record names its files for a person to find; they are read from where this module
    # puts them, never from a path a record that anyone may have edited names)
    def answer(self, record):
        """The JSON document the run printed (None: it printed none, e.g. it was killed)."""
        try:
            with open(self.stdout) as f:
                text = f.read()
            doc = json.loads(text) if text.strip() else None
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def stderr_tail(self, record, limit=2000):
        try:
            with open(self.stderr, errors="replace") as f:
                return f.read()[-limit:]
        except OSError:
            return ""
