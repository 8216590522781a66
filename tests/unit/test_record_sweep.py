"""Every record rewheel reads from disk, mutated (issue 45, item 8): a property-based sweep
(Hypothesis) over each reader — a field's type and value replaced (None, bools, huge and
negative ints, nan, inf, 1e300, strings, lists, objects), a field dropped or added, the whole
document replaced, nesting thousands deep, bytes flipped, truncated, counts made huge. Each
reader either reads a record it can use — and what its readers then ask of it works — or
refuses it with rewheel's own error (exit 2 or 3), never another exception (exit 5).

The records: a run's journal (every event type), the service's `service.json`, a prepared
upgrade's `prepared.json`, a snapshot's `meta.json`, its binary manifest (`manifest.bin`,
`manifest_codec.decode`), the lock file's records, a `--lock` pylock.toml, a recipe, and a
state folder's `env.json`. (tests/test_record_mutation.py runs a sample of the same mutations
through the real CLI.) Counts: `EXAMPLES` per reader (REWHEEL_RECORD_EXAMPLES overrides)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewheel.errors import EXIT_UNRESTORED, EXIT_USAGE, RewheelError

EXAMPLES = int(os.environ.get("REWHEEL_RECORD_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def deep(n: int, leaf: Any = 0) -> Any:
    """A list nested n deep (built without recursion)."""
    out: Any = leaf
    for _ in range(n):
        out = [out]
    return out


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                    st.sampled_from([0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64, 1e300, -1e300, 1e30]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
class _Deep:
    """Stands for a value nested 100,000 deep, written as text (too deep for Hypothesis to
    hold as an object)."""

    def __repr__(self) -> str:
        return "<nested 100,000 deep>"


DEEP = _Deep()
HOSTILE = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS, max_size=3),
                    st.integers(1, 300).map(deep), st.just(DEEP), st.just({"pid": 0}), st.just([[1]]))


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> Any:
    """`valid` with one mutation: a field's value replaced (an existing key or a new one), a
    field dropped, nested values replaced one level down, or the whole document replaced."""
    doc = json.loads(json.dumps(valid))
    how = draw(st.sampled_from(["replace", "replace", "replace", "drop", "nested", "whole", "add"]))
    keys = sorted(doc)
    if how == "whole":
        return draw(HOSTILE)
    if how == "drop" and keys:
        doc.pop(draw(st.sampled_from(keys)))
        return doc
    if how == "add":
        doc[draw(st.text(max_size=8))] = draw(HOSTILE)
        return doc
    if how == "nested":
        inner = [k for k in keys if isinstance(doc[k], (dict, list)) and doc[k]]
        if inner:
            k = draw(st.sampled_from(inner))
            if isinstance(doc[k], dict):
                doc[k][draw(st.sampled_from(sorted(doc[k])))] = draw(HOSTILE)
            else:
                doc[k][draw(st.integers(0, len(doc[k]) - 1))] = draw(HOSTILE)
            return doc
    doc[draw(st.sampled_from(keys))] = draw(HOSTILE)
    return doc


DEEP_TEXT = "[" * 100_000 + "]" * 100_000


def _text(doc: Any) -> str:
    """JSON text of `doc`, a DEEP anywhere in it written 100,000 deep."""
    return json.dumps(doc, allow_nan=True, default=lambda _o: "\0DEEP\0").replace('"\\u0000DEEP\\u0000"', DEEP_TEXT)


def refused_as(exc: BaseException, *allowed: type[RewheelError]) -> None:
    """The exception is one of rewheel's own, of the kinds allowed here, with exit 2 or 3."""
    assert isinstance(exc, allowed), f"{type(exc).__name__}: {exc}"
    assert exc.exit_code in (EXIT_USAGE, EXIT_UNRESTORED), exc


# -- service.json ---------------------------------------------------------------------------
SERVICE = {"pid": 4242, "start_ticks": 1000, "boot_id": "b", "starting": "ab", "argv": ["x"],
           "started_at": 1.7e9, "log_offset": 0, "stopped": False, "returncode": None}


def test_service_records(tmp_path: Path) -> None:
    from rewheel.errors import ServiceRecordDamaged
    from rewheel.service import CommandManager

    m = CommandManager(["/bin/true"], [], tmp_path)

    @SETTINGS
    @given(mutated(SERVICE))
    def one(doc: Any) -> None:
        (tmp_path / "service.json").write_text(_text(doc))
        try:
            m.check_record()
            st_ = m.status()
        except ServiceRecordDamaged as exc:
            refused_as(exc, ServiceRecordDamaged)
            return
        assert isinstance(st_.main_pid, int) and st_.main_pid != os.getpid()
        assert list(m.log_lines(0)) == []

    one()


# -- prepared.json ------------------------------------------------------------------------------
PREPARED = {"created": 1.7e9, "recipe": "r.toml", "recipe_sha256": "a" * 64, "env_fingerprint": "b" * 64,
            "uv_settings": "c", "uv_version": "uv 0.9", "source": "resolved", "lock": "/x/pylock.toml",
            "reinstall": "named", "before": {"toypkg": "1.0.0"}, "after": {"toypkg": "2.0.0"},
            "checks": [{"name": "build", "ok": True, "seconds": 1.0, "detail": "", "log": None}],
            "folder": "/x", "package": "toypkg", "ok": True}


def test_prepared_records(tmp_path: Path) -> None:
    from rewheel import staging
    from rewheel.errors import PreparedStale

    env_dir = tmp_path / "state"
    staging.folder(env_dir).mkdir(parents=True)

    @SETTINGS
    @given(mutated(PREPARED))
    def one(doc: Any) -> None:
        (staging.folder(env_dir) / "prepared.json").write_text(_text(doc))
        try:
            p = staging.load(env_dir)
        except PreparedStale as exc:
            refused_as(exc, PreparedStale)
            return
        assert p is not None
        p.created_iso, p.to_json(), dict(p.before), dict(p.after)  # noqa: B018 - what readers use
        assert all(isinstance(v, str) for v in [*p.after.values(), *p.before.values(), p.lock, p.source])
        assert all(isinstance(c.name, str) and isinstance(c.ok, bool) for c in p.checks)

    one()


# -- a run's journal, every event type ----------------------------------------------------------
JOURNAL = [
    {"event": "started", "time": 1.0, "kind": "run", "recipe": "r", "before": {"toypkg": "1.0.0"}, "lock": "/l",
     "plan": {"argv": []}, "staged": True, "snapshot_id": "abc"},
    {"event": "step", "time": 2.0, "name": "stop", "served": False, "packages": ["a"], "install_ns": 5},
    {"event": "note", "time": 3.0, "service_was_active": True, "undo_snapshot_id": "u", "damaged_lines": [1]},
    {"event": "snapshot", "time": 4.0, "snapshot_id": "abc"},
    {"event": "failed-snapshot", "time": 4.5, "failed_snapshot_id": "def"},
    {"event": "installed", "time": 5.0, "versions": {"toypkg": "2.0.0"}, "install_ns": 7},
    {"event": "child", "time": 5.5, "pid": 4242, "pgid": 4242, "start": 9, "name": "uv", "boot": "b"},
    {"event": "healthy", "time": 6.0, "detail": "ok"},
    {"event": "finished", "time": 7.0, "status": "reverted", "before": {"toypkg": "1.0.0"},
     "after": {"toypkg": "1.0.0"}, "downtime": {"seconds": 1.0}, "root_cause": {"type": "X"}, "by_run": "r2"},
]


@pytest.mark.parametrize("valid", JOURNAL, ids=[r["event"] for r in JOURNAL])
def test_journal_records(tmp_path: Path, valid: dict[str, Any]) -> None:
    from rewheel import proc, records
    from rewheel.journal import RunJournal, list_runs

    run = tmp_path / "runs" / "20250101-000000-0000"
    run.mkdir(parents=True)
    others = [r for r in JOURNAL if r is not valid]

    @SETTINGS
    @given(mutated(valid))
    def one(doc: Any) -> None:
        rec = records.from_json(doc)
        assert rec is None or isinstance(rec, (records.Record, records.Unrecognised))
        if isinstance(rec, records.ChildStarted):
            c = proc.Child.from_json(rec.to_json(), rec.time)
            assert c is None or (proc.valid_pid(c.pid) and proc.valid_pid(c.pgid))
        lines = [_text(x) for x in others[:3]] + [_text(doc)] + [_text(x) for x in others[3:]]
        (run / "journal.jsonl").write_text("\n".join(lines) + "\n")
        j = RunJournal.load(run)
        j.summary(), j.status, j.kind, j.last_step, j.snapshot_id, j.finished  # noqa: B018
        [r.to_json() for r in j.records]  # noqa: B018
        assert [x.id for x in list_runs(tmp_path)] == [j.id]

    one()


# -- meta.json ----------------------------------------------------------------------------------
META = {"id": "abcd1234", "label": "l", "status": "manual", "created": 1.7e9, "prefix": "/env", "python": "/env/bin/python",
        "kind": "venv", "versions": {"toypkg": "1.0.0"}, "distributions": [], "files": 3, "bytes_total": 10,
        "bytes_copied": 1, "bytes_linked": 2, "link_mode": "copy", "run_id": None, "cleanup": [], "extra": {}}


def test_snapshot_meta_records(tmp_path: Path) -> None:
    from rewheel.errors import SnapshotDamaged
    from rewheel.snapshot import SnapshotMeta

    snap = tmp_path / "snapshots" / "abcd1234"
    snap.mkdir(parents=True)
    found: dict[str, int] = {}

    @SETTINGS
    @given(mutated(META))
    def one(doc: Any) -> None:
        (snap / "meta.json").write_text(_text(doc))
        try:
            m = SnapshotMeta.load(snap, tmp_path)
        except SnapshotDamaged as exc:
            refused_as(exc, SnapshotDamaged)
            return
        for what in ("to_json", "created_iso", "pinned", "failed_build"):
            try:
                getattr(m, what)() if what == "to_json" else getattr(m, what)
            except Exception as exc:  # noqa: BLE001 - counted: see the closing note of issue 45
                found[f"{what}: {type(exc).__name__}"] = found.get(f"{what}: {type(exc).__name__}", 0) + 1

    one()
    # A meta.json that loads but whose `created` is out of the clock's range (1e300, inf, nan
    # pass the type check) fails `created_iso` (history, board, pin's question) — snapshot/
    # store.py, the store's rewrite's (left to it; see the note of issue 45).
    assert set(found) <= {f"{w}: {e}" for w in ("created_iso", "to_json")
                          for e in ("OverflowError", "ValueError", "OSError")}, found


# -- manifest.bin (the binary version 3 manifest) -------------------------------------------------
def _manifest_bytes() -> bytes:
    from rewheel.snapshot import manifest_codec

    class F:
        names = ["a.py", "b", "link"]
        types = "fdl"
        stored = "C-L"
        modes = [0o100644, 0o40755, 0o120777]
        sizes = [3, 0, 4]
        mtimes = [1, 2, 3]
        inos = [10, 11, 12]
        ctimes = [4, 5, 6]

        def sha_bytes(self) -> bytes:
            return bytes(range(32)) + bytes(64)

        def link_targets(self) -> list[str | None]:
            return [None, None, "a.py"]

    return manifest_codec.encode({"roots": [{"path": "/env", "whole": True}], "real_roots": ["/env"], "exclude": []},
                                 [(0, "", F()), (0, "sub", F())])


@st.composite
def mutated_bytes(draw: st.DrawFn, raw: bytes) -> bytes:
    """Bytes flipped, cut, spliced, or the header's numbers replaced (huge counts, negatives)."""
    how = draw(st.sampled_from(["flip", "truncate", "header", "splice", "deep-header"]))
    data = bytearray(raw)
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "truncate":
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    if how == "splice":
        i = draw(st.integers(0, len(data)))
        return bytes(data[:i]) + draw(st.binary(max_size=64)) + bytes(data[i:])
    from rewheel.snapshot.manifest_codec import MAGIC

    at = len(MAGIC)
    hl = int.from_bytes(raw[at:at + 4], "little")
    head = json.loads(raw[at + 4:at + 4 + hl])
    if how == "deep-header":
        new = ("[" * 100_000 + "]" * 100_000).encode()
    else:
        key = draw(st.sampled_from(sorted(head)))
        head[key] = draw(st.one_of(HOSTILE, st.sampled_from([2 ** 62, -5, [2 ** 62] * 13, [0] * 13])))
        new = _text(head).encode()
    return MAGIC + len(new).to_bytes(4, "little") + new + raw[at + 4 + hl:]


def test_manifest_bytes() -> None:
    from rewheel.snapshot import manifest_codec

    raw = _manifest_bytes()
    head, items = manifest_codec.decode(raw)
    assert len(items) == 2 and head["entries"] == 6

    @SETTINGS
    @given(mutated_bytes(raw))
    def one(data: bytes) -> None:
        try:
            manifest_codec.decode(data)
        except ValueError:
            return  # refused: a damaged manifest (SnapshotDamaged, exit 3, where it is loaded)

    one()


# -- aliases.bin ----------------------------------------------------------------------------------
def _aliases_bytes() -> bytes:
    from rewheel.snapshot.store import Aliases, Found

    found = Found()
    for i in range(3):
        found.add(f"0/toypkg/f{i}.py", 100 + i, 10 ** 18 + i, 3, "ab" * 32)
    return Aliases(["/env"], [], __import__("array").array("Q"), __import__("array").array("q"),
                   __import__("array").array("q"), b"").merged(found).to_bytes()


def test_aliases_bytes(tmp_path: Path) -> None:
    """A damaged aliases file only costs relinks: it reads as empty, never raises."""
    from rewheel.snapshot.store import ALIASES, read_alias_file

    raw = _aliases_bytes()
    path = tmp_path / ALIASES
    path.write_bytes(raw)
    assert len(read_alias_file(path)[1]) == 3

    @SETTINGS
    @given(st.sampled_from(["flip", "truncate", "splice"]).flatmap(
        lambda how: st.tuples(st.just(how), st.integers(0, len(raw) - 1), st.binary(max_size=16))))
    def one(m: tuple[str, int, bytes]) -> None:
        how, i, junk = m
        data = (raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:] if how == "flip" else raw[:i] if how == "truncate"
                else raw[:i] + junk + raw[i:])
        path.write_bytes(data)
        roots, found = read_alias_file(path)
        assert isinstance(roots, list) and len(found) >= 0

    one()


@pytest.mark.xfail(strict=True, raises=RecursionError,
                   reason="snapshot/store.py: read_alias_file lets a header nested thousands deep raise "
                          "RecursionError (aliases.bin and aliases.json) — the store's rewrite's to fix")
@pytest.mark.parametrize("which", ["aliases.bin", "aliases.json"])
def test_aliases_nested_too_deeply(tmp_path: Path, which: str) -> None:
    from rewheel.snapshot.store import ALIASES, _MAGIC, read_alias_file

    deep_ = b"[" * 100_000 + b"]" * 100_000
    if which == "aliases.bin":
        (tmp_path / ALIASES).write_bytes(_MAGIC + len(deep_).to_bytes(4, "little") + deep_)
    else:
        (tmp_path / "aliases.json").write_bytes(deep_)
    assert read_alias_file(tmp_path / ALIASES) is not None


# -- the lock file's records ----------------------------------------------------------------------
def test_lock_file_records(tmp_path: Path) -> None:
    from rewheel.journal import EnvLock

    env_dir = tmp_path / "state"
    env_dir.mkdir()
    lock = EnvLock(env_dir, "test", prefix=tmp_path)
    holder = {"pid": 1, "start": 5, "purpose": "run", "prefix": "/p", "state": "/s"}

    @SETTINGS
    @given(mutated(holder), mutated({"child": {"pid": 4242, "pgid": 4242, "start": 9, "name": "uv", "boot": "b"}}))
    def one(doc: Any, child: Any) -> None:
        path = tmp_path / "lockfile"
        path.write_text(_text(doc) + "\n" + _text(child) + "\n")
        fd = os.open(path, os.O_RDONLY)
        try:
            recs = EnvLock._records(fd)
        finally:
            os.close(fd)
        assert all(isinstance(r, dict) for r in recs)
        EnvLock._holder_alive(EnvLock._holder(recs))
        kids = lock._recorded_children(recs)
        assert all(c.live_members() == [] or c.pid != os.getpid() for c in kids)

    one()


# -- a --lock pylock.toml, a recipe ---------------------------------------------------------------
PYLOCK = {"lock-version": "1.0", "created-by": "uv",
          "packages": [{"name": "toypkg", "version": "2.0.0",
                        "wheels": [{"url": "https://example.invalid/toypkg-2.0.0-py3-none-any.whl"}]}]}


def _toml(doc: Any) -> str:
    import tomli_w

    if not isinstance(doc, dict):
        doc = {"x": doc}
    try:
        text = tomli_w.dumps(_tomlable(doc))
    except (TypeError, ValueError):
        return "a = " + "[" * 200_000 + "]" * 200_000
    return text.replace('"\0DEEP\0"', "[" * 200_000 + "]" * 200_000).replace('"\\u0000DEEP\\u0000"', "[" * 200_000 + "]" * 200_000)


def _tomlable(x: Any) -> Any:
    if x is None:
        return "null"
    if x is DEEP:
        return "\0DEEP\0"
    if isinstance(x, dict):
        return {str(k): _tomlable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_tomlable(v) for v in x]
    if isinstance(x, int) and not isinstance(x, bool) and not -(2 ** 63) <= x < 2 ** 63:
        return str(x)
    return x


def test_lock_files(tmp_path: Path) -> None:
    from rewheel.errors import ResolutionRefused, UsageError
    from rewheel.installer import freeze_lock

    path = tmp_path / "pylock.toml"
    path.write_text("lock-version = \"1.0\"\nx = " + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(UsageError, match="nested too deeply"):  # the 200,000-deep case
        freeze_lock(path, tmp_path / "copy")

    @SETTINGS
    @given(mutated(PYLOCK))
    def one(doc: Any) -> None:
        path.write_text(_toml(doc))
        try:
            frozen = freeze_lock(path, tmp_path / "copy")
        except (UsageError, ResolutionRefused) as exc:
            refused_as(exc, UsageError, ResolutionRefused)
            return
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in frozen.versions.items())

    one()


RECIPE = {"name": "toy", "environment": {"python": "/usr/bin/python3"},
          "service": {"manager": "command", "start": ["x"], "health_url": "http://127.0.0.1:8000/health",
                      "ready_timeout_s": 30},
          "install": {"packages": ["toypkg"], "reinstall": "named", "staged": False},
          "smoke": {"command": ["{python}", "-c", "1"], "timeout_s": 30, "gpus": 0},
          "patches": {"policy": "report"}, "cleanup": {"paths": ["/tmp/x/*.pt"]}, "snapshots": {"keep": 3}}


def test_recipes(tmp_path: Path) -> None:
    from rewheel.errors import RecipeError
    from rewheel.recipe import load_recipe

    path = tmp_path / "r.toml"

    @SETTINGS
    @given(mutated(RECIPE))
    def one(doc: Any) -> None:
        path.write_text(_toml(doc))
        try:
            r = load_recipe(path, check_interpreter=False)
        except RecipeError as exc:
            refused_as(exc, RecipeError)
            return
        assert r.keep >= 1 and all(isinstance(p, str) for p in r.install.packages)
        assert r.service is None or isinstance(r.service.ready_timeout_s, (int, float)) and math.isfinite(
            r.service.ready_timeout_s)

    one()


# -- env.json -------------------------------------------------------------------------------------
def test_env_json(tmp_path: Path) -> None:
    from rewheel.journal import _prefix_of

    @SETTINGS
    @given(mutated({"prefix": str(tmp_path)}))
    def one(doc: Any) -> None:
        (tmp_path / "env.json").write_text(_text(doc))
        assert isinstance(_prefix_of(tmp_path), Path)

    one()
