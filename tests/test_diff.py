"""Version and source-tree diffs on real uv-built environments and real wheels."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support_env import make_venv, uv, uv_install
from rewheel import diff as diffmod
from rewheel import versions
from rewheel.recipe import Recipe
from rewheel.commands import open_target, snapshot_now
from support_diff import (DS_NEW, DS_OLD, NEW_SET, NEW_VLLM, OLD_SET, OLD_VLLM, VLLM_URLS,
                          edit_by_replace, edit_in_place, site_packages, story_wheels)
import support_cli


@pytest.fixture(autouse=True)
def own_uv_cache(_uv_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # These tests install same-named wheels with different bytes; keep uv's cache private.
    cache = tmp_path / "uv-cache"
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    return cache


# --------------------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------------------
def test_parse_nightly_version() -> None:
    v = versions.parse("0.16.0rc2.dev313+g5719a4e4e")
    assert (str(v.public), v.dev, v.sha, v.variant) == ("0.16.0rc2.dev313", 313, "5719a4e4e", None)
    v = versions.parse("0.16.0rc2.dev313+g5719a4e4e.cu130")
    assert (v.sha, v.variant) == ("5719a4e4e", "cu130")
    v = versions.parse("2.9.0+cu130")
    assert (str(v.public), v.sha, v.variant) == ("2.9.0", None, "cu130")
    v = versions.parse("1.2.3.dev4+g0123abc.d20260330")
    assert (v.sha, v.variant) == ("0123abc", "d20260330")
    assert versions.parse("not a version").version is None


def test_dev_distance() -> None:
    p = versions.parse
    assert versions.dev_distance(p(OLD_VLLM), p(NEW_VLLM)) == 31
    assert versions.dev_distance(p("0.16.0rc2.dev344"), p("0.16.0rc2.dev313")) == -31
    # Different pre-releases or a release: not comparable as a build count.
    assert versions.dev_distance(p("0.16.0rc1.dev5"), p("0.16.0rc2.dev9")) is None
    assert versions.dev_distance(p("0.6.3"), p("0.6.4")) is None


def test_compare_url_from_project_urls() -> None:
    assert versions.compare_url(VLLM_URLS, "5719a4e4e", "1a2b3c4d5") == \
        "https://github.com/vllm-project/vllm/compare/5719a4e4e...1a2b3c4d5"
    urls = {"Documentation": "https://github.com/org/docs-site", "Source": "https://github.com/org/proj.git"}
    assert versions.repository_url(urls) == "https://github.com/org/proj"
    assert versions.repository_url({"Source Code": "https://gitlab.com/g/p/-/tree/main"}) == "https://gitlab.com/g/p"
    assert versions.compare_url({"Repository": "https://gitlab.com/g/p"}, "aaaaaaa", "bbbbbbb") == \
        "https://gitlab.com/g/p/-/compare/aaaaaaa...bbbbbbb"
    assert versions.compare_url({"Homepage": "https://example.invalid/p"}, "aaaaaaa", "bbbbbbb") is None
    assert versions.compare_url(VLLM_URLS, None, "1a2b3c4d5") is None


def test_diff_versions_classifies() -> None:
    old = [{"name": "vllm", "version": OLD_VLLM, "project_urls": VLLM_URLS},
           {"name": "flashinfer-python", "version": "0.6.3"},
           {"name": "torch", "version": "2.9.0+cu128"}, {"name": "gone", "version": "1"},
           {"name": "Same_Name", "version": "1.0"}, {"name": "weird", "version": "abc"}]
    new = [{"name": "vllm", "version": NEW_VLLM, "project_urls": VLLM_URLS},
           {"name": "flashinfer-python", "version": "0.6.4"},
           {"name": "torch", "version": "2.9.0+cu130"}, {"name": "fresh", "version": "2"},
           {"name": "same-name", "version": "1.0"}, {"name": "weird", "version": "abd"}]
    got = {c.name: c for c in diffmod.diff_versions(old, new)}
    assert {n: c.change for n, c in got.items()} == {
        "vllm": "upgraded", "flashinfer-python": "upgraded", "torch": "reinstalled",
        "gone": "removed", "fresh": "added", "weird": "changed"}
    v = got["vllm"]
    assert (v.dev_distance, v.old_sha, v.new_sha) == (31, "5719a4e4e", "1a2b3c4d5")
    assert v.compare_url == "https://github.com/vllm-project/vllm/compare/5719a4e4e...1a2b3c4d5"
    assert got["torch"].variant == "cu128 → cu130"
    assert got["torch"].to_json()["old"] == "2.9.0+cu128"
    # Same version, bytes known to differ: reinstalled; and downgrades.
    got = diffmod.diff_versions({"a": "1.0", "b": "2.0"}, {"a": "1.0", "b": "1.9"}, changed_files={"a": 3})
    assert [(c.name, c.change, c.files_changed) for c in got] == [("a", "reinstalled", 3), ("b", "downgraded", 0)]


# --------------------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------------------
@pytest.fixture
def upgraded(tmp_path: Path) -> dict:
    """An environment snapshotted on the old set, then force-reinstalled to the new one."""
    old, new = story_wheels(tmp_path / "wheels")
    py = make_venv(tmp_path / "env")
    uv_install(py, *OLD_SET, find_links=old)
    t = open_target(Recipe.for_python(py))
    before = snapshot_now(t, label="before").result.meta
    uv("pip", "uninstall", "-q", "--python", str(py), "olddep")
    uv_install(py, *NEW_SET, find_links=new, extra=("--reinstall",))
    subprocess.run([str(py), "-c", "import minivllm, toyflash, rebuilt"], check=True)  # __pycache__
    return {"py": py, "before": before, "target": open_target(Recipe.for_python(py))}


# (In a unified diff the path is relative to the environment's prefix, its one base:
# `lib/python3.X/site-packages/minivllm/...`; `ds_diff` puts it in.)
EXPECTED_DS_DIFF = """--- a/{site}/minivllm/models/deepseek_v2.py
+++ b/{site}/minivllm/models/deepseek_v2.py
@@ -4,5 +4,6 @@
 class DeepseekV2DecoderLayer:
     def __init__(self, config, attn_cls):
         self.hidden_size = config.hidden_size
-        self.self_attn = attn_cls(config)
+        self.self_attn = attn_cls(config, prefix="self_attn")
         self.mlp = None
+        self.use_mla = config.use_mla
"""


def ds_diff(py: Path, expected: str = EXPECTED_DS_DIFF) -> str:
    return expected.replace("{site}", str(site_packages(py).relative_to(py.parent.parent)))


def test_snapshot_vs_live_after_upgrade(upgraded: dict) -> None:
    t = upgraded["target"]
    res = diffmod.diff_trees(t.env, upgraded["before"], None, skip={str(t.store.home)})
    pk = {p.name: p for p in res.packages}
    assert {n: p.change for n, p in pk.items()} == {
        "minivllm": "upgraded", "toyflash": "upgraded", "downgrader": "downgraded",
        "newdep": "added", "olddep": "removed", "rebuilt": "reinstalled", "torchlike": "reinstalled"}
    assert res.unchanged_packages == 1  # steady: reinstalled, same bytes
    mv = pk["minivllm"]
    assert (mv.old, mv.new, mv.dev_distance, mv.old_sha, mv.new_sha) == (OLD_VLLM, NEW_VLLM, 31, "5719a4e4e", "1a2b3c4d5")
    assert mv.compare_url == "https://github.com/vllm-project/vllm/compare/5719a4e4e...1a2b3c4d5"
    assert pk["rebuilt"].files_changed == 1
    assert pk["torchlike"].variant == "cu128 → cu130" and pk["torchlike"].files_changed == 0

    files = {f.path: f for f in res.files}
    assert set(files) == {"minivllm/__init__.py", "minivllm/models/deepseek_v2.py",
                          "minivllm/old_only.py", "minivllm/new_only.py", "toyflash/__init__.py",
                          "downgrader/__init__.py", "olddep/__init__.py", "newdep/__init__.py",
                          "rebuilt/__init__.py"}
    ds = files["minivllm/models/deepseek_v2.py"]
    assert (ds.change, ds.added_lines, ds.removed_lines, ds.distribution) == ("changed", 2, 1, "minivllm")
    assert ds.diff is None  # only on request
    assert (files["minivllm/old_only.py"].change, files["minivllm/old_only.py"].removed_lines) == ("removed", 1)
    assert (files["minivllm/new_only.py"].change, files["minivllm/new_only.py"].added_lines) == ("added", 2)
    assert files["olddep/__init__.py"].distribution == "olddep"
    # The 8 MiB payload both versions ship was proven unchanged by RECORD: never read.
    assert res.stats["by_record"] > 0
    assert res.stats["hashed_bytes"] < 1 << 20

    doc = res.to_json()
    assert set(doc) >= {"packages", "files"}
    assert {"name", "old", "new", "change"} <= set(doc["packages"][0])
    assert {"path", "change", "added_lines", "removed_lines"} <= set(doc["files"][0])
    json.dumps(doc)


def test_unified_diff_on_request_and_filters(upgraded: dict) -> None:
    t = upgraded["target"]
    res = diffmod.diff_target(t.env, t.store, upgraded["before"].id, path_glob="*deepseek*", with_diffs=True)
    assert [f.path for f in res.files] == ["minivllm/models/deepseek_v2.py"]
    assert res.files[0].diff == ds_diff(upgraded["py"])
    assert res.patch_base == str(upgraded["py"].parent.parent)
    res = diffmod.diff_target(t.env, t.store, upgraded["before"].id, package="MiniVLLM")
    assert {f.path for f in res.files} == {"minivllm/__init__.py", "minivllm/models/deepseek_v2.py",
                                           "minivllm/old_only.py", "minivllm/new_only.py"}
    # `--package` narrows the package table too; a path glob does not.
    assert [p.name for p in res.packages] == ["minivllm"]
    res = diffmod.diff_target(t.env, t.store, upgraded["before"].id, path_glob="*deepseek*")
    assert len(res.packages) == 7


def test_snapshot_vs_snapshot_equals_snapshot_vs_live(upgraded: dict) -> None:
    t = upgraded["target"]
    after = snapshot_now(t, label="after").result.meta
    live = diffmod.diff_trees(t.env, upgraded["before"], None, with_diffs=True, skip={str(t.store.home)}).to_json()
    snaps = diffmod.diff_trees(t.env, upgraded["before"], after, with_diffs=True).to_json()
    for doc in (live, snaps):
        doc.pop("stats"), doc.pop("new")
    assert snaps == live
    # The newest snapshot against the live environment: nothing changed since.
    res = diffmod.diff_target(t.env, t.store)
    assert (res.old, res.new, res.packages, res.files) == (after.id, "live", [], [])


def test_diff_without_a_snapshot_skips_a_failed_build(upgraded: dict) -> None:
    """After a revert the newest snapshot is the failed build the revert kept; `diff TARGET`
    compares with the newest snapshot that is not one (else everything reads "downgraded")."""
    from rewheel.snapshot import take_snapshot

    t = upgraded["target"]
    failed = take_snapshot(t.env, t.store, label="failed upgrade", status="failed-upgrade").meta
    assert t.store.list()[0].id == failed.id
    res = diffmod.diff_target(t.env, t.store)
    assert res.old == upgraded["before"].id
    assert {p.name: p.change for p in res.packages}["minivllm"] == "upgraded"
    # Only failed builds: the newest of them.
    assert diffmod.default_base([failed]).id == failed.id


def test_hand_edits_and_binary_changes_are_found(upgraded: dict) -> None:
    t = upgraded["target"]
    now = snapshot_now(t).result.meta
    sp = site_packages(upgraded["py"])
    edit_by_replace(sp / "minivllm" / "models" / "deepseek_v2.py", 'prefix="self_attn"', 'prefix="attn"')
    # Edited through the live file's inode: a source is never one inode with the snapshot
    # (`hand_editable`), so the stored copy still holds the old bytes to diff against.
    edit_in_place(sp / "minivllm" / "__init__.py", "__version__", "__version__ = 'hacked'\n__old__")
    big = sp / "minivllm" / "_C.bin"
    data = bytearray(big.read_bytes())
    data[100] ^= 1
    big.unlink()  # a new inode: the snapshot's hard-linked copy must stay as it was
    big.write_bytes(bytes(data))
    res = diffmod.diff_target(t.env, t.store, now.id, with_diffs=True)
    files = {f.path: f for f in res.files}
    assert set(files) == {"minivllm/models/deepseek_v2.py", "minivllm/_C.bin", "minivllm/__init__.py"}
    assert files["minivllm/_C.bin"].binary and files["minivllm/_C.bin"].change == "changed"
    assert files["minivllm/_C.bin"].note == "large file: contents not compared line by line"
    assert files["minivllm/models/deepseek_v2.py"].diff == ds_diff(upgraded["py"], (
        "--- a/{site}/minivllm/models/deepseek_v2.py\n+++ b/{site}/minivllm/models/deepseek_v2.py\n"
        "@@ -4,6 +4,6 @@\n class DeepseekV2DecoderLayer:\n     def __init__(self, config, attn_cls):\n"
        "         self.hidden_size = config.hidden_size\n"
        '-        self.self_attn = attn_cls(config, prefix="self_attn")\n'
        '+        self.self_attn = attn_cls(config, prefix="attn")\n'
        "         self.mlp = None\n         self.use_mla = config.use_mla\n"))
    init = files["minivllm/__init__.py"]
    assert init.change == "changed" and init.diff is not None
    assert "+__version__ = 'hacked'" in init.diff and "-__version__" in init.diff
    # Same version, same RECORD, other bytes: edited by hand, not reinstalled.
    assert [(p.name, p.change, p.files_changed) for p in res.packages] == [("minivllm", "modified", 3)]


def test_cli_diff(upgraded: dict) -> None:
    py = upgraded["py"]
    snap = upgraded["before"].id
    rw = ["diff", "--python", str(py)]
    cp = support_cli.rewheel(*rw, snap, "--json", "--path", "*deepseek*")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [f["path"] for f in doc["files"]] == ["minivllm/models/deepseek_v2.py"]
    assert doc["files"][0]["diff"] == ds_diff(py)
    assert {p["name"]: p["change"] for p in doc["packages"]}["minivllm"] == "upgraded"
    cp = support_cli.rewheel(*rw, snap, "--stat")
    assert cp.returncode == 0, cp.stderr
    assert "minivllm/models/deepseek_v2.py" in cp.stdout and "+2 -1" in cp.stdout
    assert "compare/5719a4e4e...1a2b3c4d5" in cp.stdout
    assert "@@" not in cp.stdout  # --stat: no diffs
    cp = support_cli.rewheel(*rw, snap, "--package", "minivllm")
    assert cp.returncode == 0, cp.stderr
    assert "+        self.use_mla = config.use_mla" in cp.stdout
    cp = support_cli.rewheel(*rw, "nope", "--json")
    assert cp.returncode == 2 and "no snapshot 'nope'" in cp.stderr
    # A misspelt package is an error, not "nothing changed"; other spellings of a name work.
    cp = support_cli.rewheel(*rw, snap, "--package", "minivlm", "--json")
    assert cp.returncode == 2
    assert json.loads(cp.stdout)["error"] == "UsageError"
    assert "did you mean minivllm" in cp.stderr
    cp = support_cli.rewheel(*rw, snap, "--package", "MiniVLLM", "--stat")
    assert cp.returncode == 0 and "deepseek_v2.py" in cp.stdout


def test_cli_diff_without_snapshots_is_a_usage_error(tmp_path: Path) -> None:
    py = make_venv(tmp_path / "bare")
    cp = support_cli.rewheel("diff", "--python", str(py))
    assert cp.returncode == 2
    assert "no snapshots exist" in cp.stderr


def test_unified_diff_format() -> None:
    assert diffmod.unified_diff("a\nb\n", "a\nc", "p.py", "p.py") == (
        "--- a/p.py\n+++ b/p.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n")
    assert diffmod.unified_diff(None, "x\n", None, "n.py") == "--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x\n"
    assert diffmod.unified_diff("same\n", "same\n", "p", "p") == ""
    assert DS_OLD != DS_NEW


def test_diff_through_a_symlinked_prefix_sees_the_same_files(tmp_path: Path, wheelhouse: Path) -> None:
    from support_env import uv_install

    py = make_venv(tmp_path / "real-env")
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    link = tmp_path / "env-link"
    link.symlink_to(tmp_path / "real-env")
    snap = json.loads(support_cli.rewheel("snapshot", "--python", str(link / "bin" / "python"), "--json",
                                          check=True).stdout)["id"]
    core = next((tmp_path / "real-env" / "lib").glob("python3*/site-packages")) / "toypkg" / "core.py"
    core.write_text(core.read_text() + "# edited\n")
    cp = support_cli.rewheel("diff", "--python", str(py), snap, "--json")
    assert cp.returncode == 0, cp.stderr
    files = json.loads(cp.stdout)["files"]
    assert [(f["path"], f["change"]) for f in files] == [("toypkg/core.py", "changed")]
