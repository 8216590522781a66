#!/usr/bin/env python3
"""A start command that daemonizes, like a systemd `Type=forking` service: it double-forks
(leaving its session and process group), writes the server's pid to PIDFILE, execs the
server in the grandchild, and exits 0 at once. Usage: daemonize.py PIDFILE ARGV...

With `--fail` instead of a PIDFILE it prints a complaint and exits 3 without forking (a
start command that fails). Only the standard library is used."""

from __future__ import annotations

import os
import sys


def main() -> int:
    if sys.argv[1] == "--fail":
        print("daemonize: cannot start: config file /etc/toy.conf not found", flush=True)
        return 3
    pidfile, argv = sys.argv[1], sys.argv[2:]
    if os.fork() > 0:
        return 0  # the start command: done at once
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(pidfile + ".tmp", pidfile)
    os.execv(argv[0], argv)
    return 1


if __name__ == "__main__":
    sys.exit(main())
