"""The records rewheel reads from disk, mutated, through the real CLI (issue 45, item 8): each
record type's fields × hostile values (wrong types, 0, -1, 1e300, NaN, a string, a list, an
object, nesting 100,000 deep), written where rewheel reads it, then the commands that read it.
Every one ends with rewheel's own answer — exit 2 or 3 for a record it refuses, or the
command's ordinary code where the record is one it may skip (a journal's line, the lock file's
records) — never exit 5, never a traceback, and the environment unchanged byte for byte.

The property-based sweep of the same readers is tests/unit/test_record_sweep.py (thousands of
mutations in milliseconds each); this is its end-to-end sample: `PER_RECORD` cells a record
type a session, a new spread each session (REWHEEL_FAULT_SEED), every cell with
REWHEEL_KILLPOINTS=all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support_env import tree_state
from support_killpoints import mode, rng
from support_run import Host, make_host

pytestmark = pytest.mark.slow

PER_RECORD = 5
DEEP = "[" * 100_000 + "]" * 100_000
# JSON text of each hostile value (NaN as Python's json writes it).
VALUES = ["null", "true", "0", "-1", "1e300", "NaN", '"abc"', "[1]", '{"a": 1}', DEEP, "2147483648"]


def _with(doc: dict[str, Any], key: str, value: str) -> str:
    """`doc` as JSON text with `key`'s value replaced by the JSON text `value`."""
    marker = "\0HOSTILE\0"
    return json.dumps({**doc, key: marker}).replace(json.dumps(marker), value)


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.h: Host = make_host(tmp, "2.0.0", "good")
        self.h.write_recipe(service__health_url=None, service__probe=None, smoke=None, install__staged=False,
                            snapshots={"keep": 100})
        self.env = {**os.environ, "REWHEEL_HOME": str(tmp / "home"), "REWHEEL_LOCK_DIR": str(tmp / "locks")}
        (tmp / "locks").mkdir(mode=0o1777)
        cp = self.cli("snapshot", "--label", "base", "--json")
        assert cp.returncode == 0, cp.stderr
        self.snap = json.loads(cp.stdout)["id"]
        from rewheel.paths import env_key

        self.state = tmp / "home" / "envs" / env_key(self.h.prefix)
        self.snap_dir = self.state / "snapshots" / self.snap
        self.pristine = tmp / "pristine-state"
        shutil.copytree(self.state, self.pristine, symlinks=True)
        self.counts: dict[str, dict[int, int]] = {}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        import support_cli

        return support_cli.rewheel(args[0], str(self.h.recipe), *args[1:], env=self.env, stdin=subprocess.DEVNULL,
                                   timeout=180)

    def reset(self) -> None:
        shutil.rmtree(self.state)
        shutil.copytree(self.pristine, self.state, symlinks=True)
        for d in Path(self.env["REWHEEL_LOCK_DIR"]).iterdir():
            shutil.rmtree(d)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    b = Bench(tmp_path_factory.mktemp("records"))
    yield b
    b.h._index.stop()  # type: ignore[attr-defined]


# Each record: (fields, how to write a mutation of one field, [(command, allowed exit codes)]).
SERVICE = {"pid": 4242, "start_ticks": 1, "boot_id": "b", "argv": ["x"], "started_at": 1.7e9, "log_offset": 0,
           "stopped": False}
PREPARED = {"created": 1.7e9, "recipe": "r", "recipe_sha256": "a", "env_fingerprint": "b", "uv_settings": "c",
            "uv_version": "d", "source": "resolved", "lock": "/x", "reinstall": "named", "before": {}, "after": {},
            "checks": [], "folder": "/x", "ok": True}
STARTED = {"event": "started", "time": 1.0, "kind": "run", "recipe": "r", "before": {"toypkg": "1.0.0"}}
FINISHED = {"event": "finished", "time": 2.0, "status": "reverted", "before": {"toypkg": "1.0.0"},
            "after": {"toypkg": "1.0.0"}, "downtime": {"seconds": 1}, "root_cause": {"type": "X"}}
HOLDER = {"pid": 1, "start": 1, "purpose": "run", "prefix": "/p", "state": "/s"}


def _write_service(b: Bench, key: str, value: str) -> None:
    (b.state / "service.json").write_text(_with(SERVICE, key, value))


def _write_prepared(b: Bench, key: str, value: str) -> None:
    d = b.state / "prepared"
    d.mkdir(exist_ok=True)
    (d / "prepared.json").write_text(_with(PREPARED, key, value))


def _write_journal(b: Bench, key: str, value: str) -> None:
    d = b.state / "runs" / "20250101-000000-abcd"
    d.mkdir(parents=True, exist_ok=True)
    started, finished = (_with(STARTED, key, value), json.dumps(FINISHED)) if key in STARTED else \
        (json.dumps(STARTED), _with(FINISHED, key, value))
    (d / "journal.jsonl").write_text(started + "\n" + finished + "\n")


def _write_meta(b: Bench, key: str, value: str) -> None:
    doc = json.loads((b.snap_dir / "meta.json").read_text())
    (b.snap_dir / "meta.json").write_text(_with(doc, key, value))


def _write_manifest(b: Bench, key: str, value: str) -> None:
    from rewheel.snapshot.manifest_codec import MAGIC

    raw = (b.snap_dir / "manifest.bin").read_bytes()
    at = len(MAGIC)
    hl = int.from_bytes(raw[at:at + 4], "little")
    head = json.loads(raw[at + 4:at + 4 + hl])
    new = _with(head, key, value).encode()
    (b.snap_dir / "manifest.bin").write_bytes(MAGIC + len(new).to_bytes(4, "little") + new + raw[at + 4 + hl:])


def _write_lock_records(b: Bench, key: str, value: str) -> None:
    from rewheel.paths import lock_dir

    os.environ["REWHEEL_LOCK_DIR"] = b.env["REWHEEL_LOCK_DIR"]
    try:
        st = os.stat(b.h.prefix)
        path = lock_dir(st.st_uid) / f"env-{st.st_dev:x}-{st.st_ino}.lock"
    finally:
        del os.environ["REWHEEL_LOCK_DIR"]
    child = {"child": {"pid": 4242, "pgid": 4242, "start": 1, "name": "uv", "boot": "b"}}
    path.write_text(_with(HOLDER, key, value) + "\n" + json.dumps(child) + "\n")


def _write_lock_toml(b: Bench, key: str, value: str) -> None:
    lock = {"lock-version": "1.0", "packages": [{"name": "toypkg", "version": "2.0.0",
                                                 "wheels": [{"url": "https://example.invalid/t.whl"}]}]}
    if value == DEEP:
        text = f'lock-version = "1.0"\n{key} = ' + "[" * 200_000 + "]" * 200_000 + "\n"
    else:
        import tomli_w

        v = json.loads(value) if value != "NaN" else float("nan")
        lock[key] = "null" if v is None else v
        text = tomli_w.dumps(lock)
    (b.h.tmp / "pylock.toml").write_text(text)


RECORDS: dict[str, tuple[list[str], Callable[[Bench, str, str], None], list[tuple[tuple[str, ...], set[int]]]]] = {
    "service.json": (list(SERVICE), _write_service,
                     [(("status", "--json"), {0}), (("check",), {0, 2, 3}), (("run", "--yes"), {0, 3})]),
    "prepared.json": (list(PREPARED), _write_prepared, [(("run", "--prepared", "--yes"), {2})]),
    "journal": (sorted(set(STARTED) | set(FINISHED)), _write_journal,
                [(("history", "--json"), {0, 4}), (("status",), {0, 4}), (("board", "--out", "{tmp}/board"), {0})]),
    "meta.json": (["id", "created", "versions", "distributions", "files", "cleanup", "extra", "run_id", "label"],
                  _write_meta, [(("history",), {0, 3}), (("verify",), {0, 3}), (("rollback", "{snap}", "--yes"), {0, 2, 3})]),
    "manifest.bin": (["roots", "folders", "entries", "links", "parts", "exclude", "real_roots"], _write_manifest,
                     [(("verify", "--full"), {0, 3}), (("rollback", "{snap}", "--yes"), {0, 2, 3})]),
    "lock file": (list(HOLDER), _write_lock_records, [(("snapshot",), {0, 4}), (("status",), {0})]),
    "--lock TOML": (["lock-version", "packages", "created-by"], _write_lock_toml,
                    [(("run", "--lock", "{tmp}/pylock.toml", "--dry-run"), {0, 2})]),
}


# Known, and left to the store's rewrite (src/rewheel/snapshot/store.py, not this issue's): a
# meta.json whose `created` is a number no clock has passes SnapshotMeta.load's type check and
# fails later (history, board: exit 5). Kept out of the sample, and proven still there below.
KNOWN = {("meta.json", "created", "1e300"), ("meta.json", "created", "NaN")}


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_a_mutated_record_is_refused_or_skipped_never_a_crash(bench: Bench, record: str) -> None:
    fields, write, commands = RECORDS[record]
    cells = [(f, v) for f in fields for v in VALUES if (record, f, v) not in KNOWN]
    picked = cells if mode() == "all" else rng(f"records-{record}").sample(cells, min(PER_RECORD, len(cells)))
    env_before = tree_state(bench.h.prefix)
    counts: dict[int, int] = {}
    for key, value in picked:
        bench.reset()
        write(bench, key, value)
        for args, allowed in commands:
            args = tuple(a.replace("{snap}", bench.snap).replace("{tmp}", str(bench.h.tmp)) for a in args)
            cp = bench.cli(*args)
            out = cp.stdout + cp.stderr
            shown = value if len(value) < 40 else value[:20] + "…"
            assert "Traceback" not in out, f"{record} {key}={shown} {args}: {out[-2000:]}"
            assert cp.returncode in allowed, f"{record} {key}={shown} {args}: rc={cp.returncode}\n{out[-2000:]}"
            counts[cp.returncode] = counts.get(cp.returncode, 0) + 1
            assert tree_state(bench.h.prefix) == env_before or (args[0] == "run" and cp.returncode == 0), \
                f"{record} {key}={shown} {args}: the environment changed"
            if args[0] == "run" and cp.returncode == 0:
                bench.cli("rollback", bench.snap, "--yes")  # (a run that went on: put back for the next cell)
    print(f"{record}: {len(picked)} of {len(cells)} mutations, exit codes {counts}")


@pytest.mark.xfail(strict=True, reason="snapshot/store.py: SnapshotMeta.load accepts a `created` no clock has "
                                       "(1e300, NaN); history then fails with exit 5 — the store's rewrite's to fix")
@pytest.mark.parametrize("value", ["1e300", "NaN"])
def test_a_meta_json_created_out_of_the_clocks_range(bench: Bench, value: str) -> None:
    bench.reset()
    _write_meta(bench, "created", value)
    cp = bench.cli("history")
    assert cp.returncode in (0, 3), cp.stderr
