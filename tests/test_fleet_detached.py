"""The fleet module's detached run (ansible/rewheel/fleet/plugins/module_utils/detached.py), on its
own: a command started through it outlives the process that started it, in a session of its own,
and another process finds it again by its record — alive while it runs (and not when only its pid
was reused), waited for, its answer read. (The same over SSH, with Ansible and rewheel:
tests/test_fleet_ssh.py.) And the record itself, swept (Hypothesis): any bytes in that file are a
record (a JSON object) or nothing, and whatever it holds, the questions the module asks of it (is
its process alive, when did it start, what did it answer) answer without raising."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from support_json import JSON


DETACHED = Path(__file__).resolve().parents[1] / "ansible" / "rewheel" / "fleet" / "plugins" / "module_utils" / \
    "detached.py"
_spec = importlib.util.spec_from_file_location("rewheel_fleet_detached", DETACHED)
assert _spec is not None and _spec.loader is not None
detached = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detached)

# The starter: what the module does, then it dies at once (as a module whose connection dropped).
STARTER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("d", sys.argv[1]); d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d)
d.DetachedRuns(sys.argv[2], sys.argv[3]).start(sys.argv[4:], None, lock_sha256="abc")
"""


def test_a_detached_command_outlives_its_starter_and_is_found_again(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f"import json, os, pathlib, time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)\n" \
             "print(json.dumps({'status': 'upgraded', 'sid': os.getsid(0), 'pid': os.getpid()}))"
    starter = subprocess.run([sys.executable, "-c", STARTER, str(DETACHED), str(tmp_path / "runs"),
                              str(tmp_path / "toy.toml"), sys.executable, "-c", script], timeout=60)
    assert starter.returncode == 0

    runs = detached.DetachedRuns(str(tmp_path / "runs"), str(tmp_path / "toy.toml"))
    record = runs.unreported()
    assert record is not None and record["lock_sha256"] == "abc" and record["reported"] is False
    assert detached.alive(record), "the command died with the process that started it"
    assert detached.alive({**record, "start_ticks": record["start_ticks"] + 1}) is False  # a reused pid
    assert detached.alive({**record, "boot_id": "another boot"}) is False

    t0 = time.monotonic()
    gate.write_text("")
    runs.wait(record)
    assert time.monotonic() - t0 < 30 and not detached.alive(record)
    answer = runs.answer(record)
    assert answer is not None and answer["status"] == "upgraded"
    assert answer["sid"] == answer["pid"] == record["pid"]  # a session of its own, led by it

    runs.mark(record, "reattached")
    assert runs.unreported() is None
    assert json.loads(Path(runs.path).read_text())["reported"] == "reattached"


FOLDER = tempfile.TemporaryDirectory(prefix="rewheel-fleet-records-")  # (removed at exit)


CONTENT = st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()) | st.builds(
    lambda rec: json.dumps(rec).encode(),
    st.dictionaries(st.sampled_from(["pid", "start_ticks", "boot_id", "started", "reported", "lock_sha256",
                                     "stdout", "stderr", "argv"]), JSON, max_size=9))


@settings(max_examples=200, deadline=None)
@given(CONTENT)
def test_any_record_file_is_a_record_or_nothing(content: bytes) -> None:
    runs = detached.DetachedRuns(FOLDER.name, str(Path(FOLDER.name) / "toy.toml"))
    Path(runs.path).write_bytes(content)
    record = runs.unreported()
    assert record is None or isinstance(record, dict)
    if record is not None:
        assert detached.alive(record) in (True, False)
        assert isinstance(detached.started_at(record), float)
        assert runs.answer(record) is None or isinstance(runs.answer(record), dict)
        assert isinstance(runs.stderr_tail(record), str)
