#!/usr/bin/env python3
"""Drive rewheel's SystemdManager step by step where systemd runs (inside the test container,
so that MainPID and ControlGroup mean what they mean on a host), and print what each step gave
as one JSON list.

    manager_steps.py UNIT '[["check"], ["start"], ["wait_ready", {spec}], ["status"], ...]'

Steps: check, start, stop [timeout_s], status, wait_ready {ServiceSpec fields; probe as
{"url", "expect"}}, log_lines (since the last start), log_location, until {status fields}
[timeout_s] (poll the status until it has those values), alive [pids] (those still running),
sleep S. Each result is
{"ok": true, "value": ...} or {"ok": false, "error", "message", "hint"}; a failed step does not
stop the next ones.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rewheel.errors import RewheelError
from rewheel.recipe import Probe, ServiceSpec
from rewheel.service import SystemdManager, wait_ready
from rewheel.service.common import _alive


def main(unit: str, steps: list[list[Any]]) -> list[dict[str, Any]]:
    m = SystemdManager(unit)
    started = time.time()
    out: list[dict[str, Any]] = []

    def step(name: str, *args: Any) -> Any:
        nonlocal started
        if name == "check":
            return m.check()
        if name == "start":
            started = time.time()
            return m.start()
        if name == "stop":
            return m.stop(float(args[0]) if args else 30.0)
        if name == "status":
            return m.status().to_json()
        if name == "wait_ready":
            fields = dict(args[0])
            if fields.get("probe"):
                fields["probe"] = Probe(**fields["probe"])
            return wait_ready(m, ServiceSpec(**fields), started_at=started).to_json()
        if name == "log_lines":
            return list(m.log_lines(started))
        if name == "log_location":
            return m.log_location(started)
        if name == "until":
            want, deadline = args[0], time.monotonic() + (float(args[1]) if len(args) > 1 else 30.0)
            while True:
                st = m.status().to_json()
                if all(st.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
                    return st
                time.sleep(0.05)
        if name == "alive":
            return [pid for pid in args[0] if _alive(int(pid))]
        if name == "sleep":
            return time.sleep(float(args[0]))
        raise SystemExit(f"unknown step {name!r}")

    for name, *args in steps:
        try:
            out.append({"ok": True, "value": step(name, *args)})
        except RewheelError as exc:
            out.append({"ok": False, "error": type(exc).__name__, "message": exc.message,
                        "hint": exc.hint})
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
