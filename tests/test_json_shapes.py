"""The `--json` outputs users script against keep their shape: the exact key set of every
object, recursively, of `run` (kept and reverted), `rollback`, `history`, `snapshot`,
`diff`, `patches`, `why`, `ci`, `bisect`, `resume` and `fleet-report`, produced by the real commands on a real
venv, a real index and a real service.

The expected shapes are in `json_shapes.json` beside this file, captured from the outputs
as they were before the reports became typed objects. Values are not compared (other tests
do), only keys: a scalar is "*", a list is the merged shape of its items, and the maps whose
keys are data (package names, log names) are "{map}". After a deliberate change of a JSON
shape, regenerate with REWHEEL_UPDATE_SHAPES=1 and say so in the change log.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devtools.localindex import serve_index
from support_nightly import (build_toypkg, fake_sha, json_of, nightly_version, rewheel, smoke_script,
                             write_recipe)
from support_run import make_host

GOLDEN = Path(__file__).parent / "json_shapes.json"
# Objects keyed by data, not by a fixed vocabulary: only their being an object is the shape.
DATA_MAPS = {"before", "after", "attempted", "versions", "logs", "upgraded_to", "new_versions",
             "old_versions", "installed", "extra", "counts"}


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in sorted(a.keys() | b.keys())}
    if isinstance(a, list) and isinstance(b, list):
        return a or b
    return a if a != "*" else b


def shape(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        if key in DATA_MAPS:
            return "{map}"
        return {k: shape(v, k) for k, v in sorted(value.items()) if k != "_stderr"}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            s = shape(item, key)
            merged = s if merged is None else _merge(merged, s)
        return [] if merged is None else [merged]
    return "*"


def check(name: str, doc: dict[str, Any]) -> None:
    got = shape(doc)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("REWHEEL_UPDATE_SHAPES"):
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    assert name in golden, f"no recorded shape for {name}"
    assert got == golden[name], f"`{name} --json` changed shape"


def _json(cp: subprocess.CompletedProcess, code: int) -> dict[str, Any]:
    assert cp.returncode == code, cp.stderr
    return json.loads(cp.stdout)


CRASH = """INFO starting
Traceback (most recent call last):
  File "/env/lib/python3.12/site-packages/toypkg/core.py", line 3, in init_model
    return build()
RuntimeError: CUDA error: no kernel image is available for execution on the device
"""


def test_shapes_of_snapshot_run_history_diff_patches_why_rollback(tmp_path: Path) -> None:
    h = make_host(tmp_path, "2.0.0", "good")
    try:
        h.start_service()
        r = str(h.recipe)
        check("snapshot", _json(h.rewheel("snapshot", r, "--label", "manual", "--json"), 0))
        code, rep = h.run_json()
        assert code == 0, rep["_stderr"]
        check("run-kept", rep)
        check("history", _json(h.rewheel("history", r, "--json"), 0))
        check("diff", _json(h.rewheel("diff", r, rep["snapshot_id"], "--json"), 0))
        check("patches", _json(h.rewheel("patches", r, "--offline", "--json"), 0))
        log = tmp_path / "crash.log"
        log.write_text(CRASH)
        check("why", _json(h.rewheel("why", str(log), "--package", "toypkg", "--json"), 0))
        check("rollback", _json(h.rewheel("rollback", r, rep["snapshot_id"], "--yes", "--json"), 0))
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


def test_shapes_of_a_reverted_run_and_resume(tmp_path: Path) -> None:
    h = make_host(tmp_path, "3.0.0", "smoke-fails")
    try:
        h.start_service()
        code, rep = h.run_json()
        assert code == 1, rep["_stderr"]
        check("run-reverted", rep)
        report = tmp_path / "gpu-01.json"
        report.write_text(json.dumps({k: v for k, v in rep.items() if k != "_stderr"}))
        check("fleet-report", _json(h.rewheel("fleet-report", str(report), "--expect", "gpu-01,gpu-02", "--json"), 1))
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:smoke"})
        assert cp.returncode == -9, cp.stderr
        check("resume", _json(h.rewheel("resume", str(h.recipe), "--yes", "--json"), 0))
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


def test_shapes_of_ci_and_bisect(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    versions = [nightly_version(300 + i, fake_sha(i)) for i in range(4)]
    for i, v in enumerate(versions):
        build_toypkg(wheels, v, bad=i >= 2)
    script, count = smoke_script(tmp_path)
    with serve_index(wheels) as index:
        recipe = write_recipe(tmp_path / "toy.toml", install={"index_url": index.url}, script=script, count=count)
        cp = rewheel("ci", str(recipe), "--packages-only", "--json", "-q")
        assert cp.returncode == 1, cp.stderr  # the newest nightly is bad
        check("ci", json_of(cp))
        cp = rewheel("bisect", str(recipe), "--good", versions[0], "--bad", versions[-1], "--json", "-q")
        assert cp.returncode == 0, cp.stderr
        check("bisect", json_of(cp))


@pytest.mark.parametrize("name", ["snapshot", "run-kept", "run-reverted", "history", "diff", "patches",
                                  "why", "rollback", "resume", "ci", "bisect", "fleet-report"])
def test_every_shape_is_recorded(name: str) -> None:
    assert isinstance(json.loads(GOLDEN.read_text()).get(name), dict)


def test_shape_of_verify_with_a_damaged_snapshot(tmp_path: Path) -> None:
    """`verify --json` with a stored file an edit in place damaged (so that the damage list
    has its item shape), and the shape is recorded."""
    h = make_host(tmp_path, "2.0.0", "good", binary=True)
    try:
        r = str(h.recipe)
        _json(h.rewheel("snapshot", r, "--json"), 0)
        # A binary (shared by a hard link); a source is a copy an edit cannot reach.
        core = next(h.prefix.glob("lib/python3*/site-packages/toypkg/_ops.so"))
        with open(core, "a") as f:
            f.write("# edited in place\n")
        check("verify", _json(h.rewheel("verify", r, "--json"), 3))
    finally:
        h._index.stop()  # type: ignore[attr-defined]
    assert isinstance(json.loads(GOLDEN.read_text()).get("verify"), dict)
