"""The patch scan on what real environments hold that a single wheel never does: a path two
distributions ship (the one installed later overwrote it), and a wheel whose own RECORD
disagrees with the bytes it ships. Neither is a patch; a real edit on top of either is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support_env import make_venv, pip_venv, uv_install
from rewheel import patches
from rewheel.patches import hashes as patch_hashes
from rewheel.environment import Environment
from devtools.localindex import serve_index
from devtools.wheelbuild import build_wheel
from support_diff import edit_by_replace, edit_in_place, site_packages
from support_patches import build_lying_wheel
import support_cli


@pytest.fixture(autouse=True)
def own_uv_cache(_uv_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Patching in place writes through uv's hard links into its cache: keep it private.
    cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    return cache


def scan(py: Path, **kw) -> patches.PatchScan:
    return patches.scan(Environment.inspect(py), **kw)


# --------------------------------------------------------------------------------------
# A path two distributions ship
# --------------------------------------------------------------------------------------
# "bindings" once came inside a metapackage (oldmeta) and is now split out (newsplit); both
# also ship a top-level helper module. Each ships its own bytes at the shared paths.
SHARED = {
    "oldmeta": {"oldmeta/__init__.py": "OLD = 1\n",
                "bindings/__init__.py": "from bindings._impl import run\n",
                "bindings/_impl.py": "def run():\n    return 'old implementation'\n",
                "bindings/same_size.py": "FLAVOUR = 'a'\n",
                "build_helper.py": "def helper():\n    return 1\n"},
    "newsplit": {"newsplit/__init__.py": "NEW = 1\n",
                 "bindings/__init__.py": "from bindings._impl import run, run_fast\n",
                 "bindings/_impl.py": "def run():\n    return 'new'\n\n\ndef run_fast():\n    return run()\n",
                 "bindings/same_size.py": "FLAVOUR = 'b'\n",  # same size, other bytes
                 "build_helper.py": "def helper():\n    return 2  # newer\n"},
}
VERSIONS = {"oldmeta": "1.0", "newsplit": "2.0"}


@pytest.fixture
def shared_wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    for name, files in SHARED.items():
        build_wheel(folder, name, VERSIONS[name], files)
    return folder


@pytest.mark.parametrize("order", [("oldmeta", "newsplit"), ("newsplit", "oldmeta")],
                         ids=["meta-first", "split-first"])
def test_path_two_distributions_ship_is_not_a_patch(tmp_path: Path, shared_wheels: Path,
                                                    order: tuple[str, str]) -> None:
    py = make_venv(tmp_path / "env")
    for name in order:  # two installs: the later one overwrites the shared files
        uv_install(py, name, find_links=shared_wheels)
    sp = site_packages(py)
    last = order[-1]
    for rel in ("bindings/_impl.py", "bindings/same_size.py", "build_helper.py"):
        assert (sp / rel).read_text() == SHARED[last][rel]
    for thorough in (False, True):
        res = scan(py, thorough=thorough)
        assert res.patches == [], [(p.path, p.distribution) for p in res.patches]
        assert res.record_inconsistent == [] and res.missing == []
        assert res.stats["shared_paths"] == 4
    # Asked about the distribution whose files were overwritten only: still nothing.
    assert scan(py, dists=[order[0]], thorough=True).patches == []

    # A real edit of a shared file is a patch, on the distribution whose bytes were there,
    # diffed against them.
    edit_by_replace(sp / "build_helper.py", "return", "return -1 or")
    edit_by_replace(sp / "bindings" / "same_size.py", "FLAVOUR", "FLAVOUR = 'c'  #")
    res = scan(py)
    assert [(p.path, p.distribution, p.kind) for p in res.patches] == [
        ("bindings/same_size.py", last, "modified"), ("build_helper.py", last, "modified")]
    helper = res.patches[1]
    assert helper.pristine_source == "uv-cache" and helper.pristine_note is None
    assert helper.added_lines == helper.removed_lines == 1
    assert f"-{SHARED[last]['build_helper.py'].splitlines()[1]}" in helper.diff
    assert res.record_inconsistent == []
    # Listed by both, gone: reported once.
    (sp / "bindings" / "_impl.py").unlink()
    res = scan(py, with_diffs=False)
    assert res.missing == [{"path": "bindings/_impl.py", "distribution": last}]


def test_shared_path_edited_in_place_is_a_patch(tmp_path: Path, shared_wheels: Path) -> None:
    py = make_venv(tmp_path / "env")
    for name in ("oldmeta", "newsplit"):
        uv_install(py, name, find_links=shared_wheels)
    edit_in_place(site_packages(py) / "bindings" / "_impl.py", "'new'", "'patched'")
    res = scan(py)
    assert [(p.path, p.distribution) for p in res.patches] == [("bindings/_impl.py", "newsplit")]
    assert res.patches[0].shares_uv_cache_inode
    assert res.record_inconsistent == []


# --------------------------------------------------------------------------------------
# A wheel whose RECORD disagrees with the bytes it ships
# --------------------------------------------------------------------------------------
EXT = b"\x7fELF" + bytes(range(256)) * 8  # what the wheel ships (after "stripping")
EXT_RECORDED = b"\x7fELF" + bytes(range(256)) * 9  # what its RECORD describes
TABLE = "ROWS = [1, 2, 3]\n"
TABLE_RECORDED = "ROWS = [1, 2, 4]\n"  # same size, another hash
MODEL = "def forward(x):\n    return x * 2\n"


def liar_files(version: int) -> dict[str, str | bytes]:
    return {"liar/__init__.py": f"VERSION = {version}\n", "liar/_ext.so": EXT + bytes([version]),
            "liar/table.py": TABLE, "liar/model.py": MODEL}


def liar_wheel(folder: Path, version: int) -> Path:
    return build_lying_wheel(folder, "liar", f"{version}.0", liar_files(version),
                             {"liar/_ext.so": EXT_RECORDED, "liar/table.py": TABLE_RECORDED.encode()})


@pytest.fixture
def liar_wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "liar-wheels"
    liar_wheel(folder, 1)
    liar_wheel(folder, 2)
    return folder


@pytest.fixture
def liar_env(tmp_path: Path, liar_wheels: Path) -> Path:
    py = make_venv(tmp_path / "env")
    uv_install(py, "liar==1.0", find_links=liar_wheels)
    return py


def test_record_inconsistent_wheel_is_not_a_patch(liar_env: Path) -> None:
    res = scan(liar_env)
    assert res.patches == []
    assert res.record_inconsistent == [{
        "path": "liar/_ext.so", "distribution": "liar",
        "reason": f"RECORD inconsistent, matches its wheel (uv's cache): its RECORD lists size "
                  f"{len(EXT_RECORDED)}, the wheel ships {len(EXT) + 1} bytes"}]
    assert res.stats["record_inconsistent"] == 1
    assert res.to_json()["record_inconsistent"] == res.record_inconsistent
    # The same-size one passes the fast path; hashing everything finds it and knows it too.
    res = scan(liar_env, thorough=True)
    assert res.patches == []
    assert [(r["path"], r["reason"].split(":")[1].strip()) for r in res.record_inconsistent] == [
        ("liar/_ext.so", f"its RECORD lists size {len(EXT_RECORDED)}, the wheel ships {len(EXT) + 1} bytes"),
        ("liar/table.py", "its RECORD lists another hash for the bytes the wheel ships")]


def test_real_edit_on_a_record_inconsistent_file_is_a_patch(liar_env: Path) -> None:
    sp = site_packages(liar_env)
    edit_by_replace(sp / "liar" / "table.py", "3]", "3, 5]")  # a new inode: uv's cache intact
    (sp / "liar" / "_ext.so").unlink()
    (sp / "liar" / "_ext.so").write_bytes(EXT + b"\x01patched")
    res = scan(liar_env)
    assert res.record_inconsistent == []
    assert [(p.path, p.kind) for p in res.patches] == [("liar/_ext.so", "modified"),
                                                       ("liar/table.py", "modified")]
    ext, table = res.patches
    # No bytes anywhere have the RECORD's hash: the diff is against what the wheel ships.
    assert table.pristine_source == "uv-cache"
    assert table.pristine_note == ("diffed against the bytes its wheel ships (its RECORD's hash "
                                   "does not match them)")
    assert table.diff == ("--- a/liar/table.py\n+++ b/liar/table.py\n@@ -1 +1 @@\n"
                          "-ROWS = [1, 2, 3]\n+ROWS = [1, 2, 3, 5]\n")
    assert table.pristine_bytes == TABLE.encode()
    assert ext.binary and ext.pristine_bytes == EXT + b"\x01"


def test_record_inconsistent_file_edited_in_place_is_a_patch(liar_env: Path, own_uv_cache: Path) -> None:
    # Written through uv's hard link: the cached copy changed too, so it no longer tells
    # what the wheel ships (it was written after uv unpacked the archive).
    sp = site_packages(liar_env)
    edit_in_place(sp / "liar" / "table.py", "3]", "3, 5]")
    for _ in range(2):
        res = scan(liar_env)
        assert [p.path for p in res.patches] == ["liar/table.py"]
        assert [r["path"] for r in res.record_inconsistent] == ["liar/_ext.so"]  # untouched
        table = res.patches[0]
        assert table.shares_uv_cache_inode and table.diff is None
        assert table.pristine_note.endswith("; its RECORD could not be cross-checked against the "
                                            "bytes its wheel ships")
        # Something touches the archives' folders afterwards (a chmod -R of the cache): the
        # file is still one written after its install, through the cached copy.
        for archive in (own_uv_cache / "archive-v0").iterdir():
            os.chmod(archive, archive.stat().st_mode & 0o7777)


def _pip_env(tmp_path: Path, wheels: Path) -> Path:
    return pip_venv(tmp_path / "pipenv", "--no-index", "--find-links", str(wheels), "liar==1.0")


def test_record_inconsistent_checked_against_the_index(tmp_path: Path, liar_wheels: Path) -> None:
    # pip copies files and leaves uv's cache empty: only the index can tell.
    py = _pip_env(tmp_path, liar_wheels)
    offline = scan(py)
    assert [p.path for p in offline.patches] == ["liar/_ext.so"]
    assert offline.patches[0].pristine_note.endswith("its RECORD could not be cross-checked against "
                                                     "the bytes its wheel ships")
    with serve_index(liar_wheels) as index:
        fetcher = patches.UvIndexFetcher(python=str(py), index_url=index.url)
        try:
            res = scan(py, fetcher=fetcher)
        finally:
            fetcher.close()
    assert res.patches == []
    assert [(r["path"], r["reason"].split(":")[0]) for r in res.record_inconsistent] == [
        ("liar/_ext.so", "RECORD inconsistent, matches its wheel (the index)")]


def test_reapply_never_writes_a_record_inconsistent_file(liar_env: Path, liar_wheels: Path,
                                                         tmp_path: Path) -> None:
    sp = site_packages(liar_env)
    edit_by_replace(sp / "liar" / "model.py", "x * 2", "x * 3")
    res = scan(liar_env, thorough=True)
    assert [p.path for p in res.patches] == ["liar/model.py"]
    assert [r["path"] for r in res.record_inconsistent] == ["liar/_ext.so", "liar/table.py"]
    patches.save_patches(res, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "patches" / "patches.json").read_text())
    assert [r["path"] for r in saved["record_inconsistent"]] == ["liar/_ext.so", "liar/table.py"]
    uv_install(liar_env, "liar==2.0", find_links=liar_wheels, extra=("--reinstall",))
    results = patches.reapply(res, Environment.inspect(liar_env), tmp_path / "run")
    assert [(r.path, r.status) for r in results] == [("liar/model.py", "clean")]
    assert (sp / "liar" / "_ext.so").read_bytes() == EXT + b"\x02"  # 2.0's, as installed
    assert (sp / "liar" / "model.py").read_text() == MODEL.replace("x * 2", "x * 3")


def test_reapply_skips_a_patch_listed_as_record_inconsistent(tmp_path: Path) -> None:
    # Unit level: whatever list a file arrives in, one its wheel ships is never written back.
    target = tmp_path / "site" / "liar" / "_ext.so"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"new version")
    p = patches.Patch("liar/_ext.so", str(target), "liar", "1.0", "modified",
                      patch_hashes._sha256(b"old shipped"), 11, 0o644, record_sha256="0" * 64,
                      patched_bytes=b"old shipped")
    scan_ = patches.PatchScan(str(tmp_path), [p], record_inconsistent=[
        {"path": "liar/_ext.so", "distribution": "liar", "reason": "RECORD inconsistent, matches its wheel"}])
    assert patches.reapply(scan_) == []
    assert target.read_bytes() == b"new version"


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def test_cli_reports_record_inconsistent_files_apart(liar_env: Path) -> None:
    rw = ["patches", "--python", str(liar_env), "--offline"]
    cp = support_cli.rewheel(*rw, "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["patches"] == []
    assert [(r["path"], r["distribution"]) for r in doc["record_inconsistent"]] == [("liar/_ext.so", "liar")]
    cp = support_cli.rewheel(*rw, env={**os.environ, "COLUMNS": "300"})
    assert cp.returncode == 0, cp.stderr
    assert "no local patches" in cp.stdout
    assert ("1 file(s) match no RECORD but are exactly what their wheel ships (RECORD inconsistent, "
            "matches its wheel; not patches, never reapplied): liar/_ext.so (liar)") in cp.stdout


@pytest.mark.parametrize("order", [("oldmeta", "newsplit"), ("newsplit", "oldmeta"), ("oldmeta newsplit",)],
                         ids=["meta-first", "split-first", "one-uv-run"])
def test_snapshot_shares_a_path_two_distributions_ship(tmp_path: Path, shared_wheels: Path,
                                                       order: tuple[str, ...],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot proves a shared path by the owner whose RECORD it matches — in one uv
    run the two install in parallel, and the newest RECORD need not be the last writer's:
    linked, not copied, and its recorded sha256 is the bytes' own."""
    import hashlib

    from rewheel.snapshot import Manifest, Store, take_snapshot
    from rewheel.snapshot import ingest

    py = make_venv(tmp_path / "env")
    for names in order:
        uv_install(py, *names.split(), find_links=shared_wheels)
    env = Environment.inspect(py)
    # The copy rule for hand-editable files set aside: what proves a file shows as its link.
    monkeypatch.setattr(ingest, "hand_editable", lambda name, size: False)
    snap = take_snapshot(env, Store(env.prefix)).meta
    man = Manifest.load(snap)
    sp = str(site_packages(py).relative_to(env.prefix))
    by_path = {e[1]: e for e in man.entries}
    for rel in ("bindings/_impl.py", "bindings/same_size.py", "build_helper.py", "bindings/__init__.py"):
        e = by_path[f"{sp}/{rel}"]
        assert e[7] == "link", (rel, e[7])
        assert e[6] == hashlib.sha256((site_packages(py) / rel).read_bytes()).hexdigest(), rel
