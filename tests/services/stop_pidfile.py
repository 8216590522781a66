#!/usr/bin/env python3
"""A `[service] stop` command for a daemonized server: SIGTERM the pid in PIDFILE (if it
still runs) and remove the file; exit 0 when there is nothing to stop. Usage:
stop_pidfile.py PIDFILE. Only the standard library is used."""

from __future__ import annotations

import os
import signal
import sys


def main() -> int:
    pidfile = sys.argv[1]
    try:
        pid = int(open(pidfile).read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    os.remove(pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
