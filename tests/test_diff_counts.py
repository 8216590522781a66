"""Line counts in linear time, unified diffs only for what is shown (issue 13, item 2)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from support_env import make_venv, uv_install
from rewheel import diff as diffmod
# The thresholds and the halves a diff shares are read in `trees`: tests replace them there.
from rewheel.diff import sides, trees
from rewheel.texts import count_changed_lines, count_lines, splits_like_bytes, unified_diff
from rewheel.recipe import Recipe
from rewheel.commands import open_target, snapshot_now
from support_diff import fails_in_a_forked_child, site_packages
import support_cli


def by_diff(old: str | None, new: str | None) -> tuple[int, int]:
    """(added, removed) as difflib's unified diff counts them."""
    return count_lines(unified_diff(old, new, "p", "p"))


def by_difflib(old: str | None, new: str | None) -> str:
    """The unified diff straight from difflib (no fast path), in rewheel's format."""
    a, b = (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True)
    la = "a/p" if old is not None else "/dev/null"
    lb = "b/p" if new is not None else "/dev/null"
    return "".join(x if x.endswith("\n") else x + "\n\\ No newline at end of file\n"
                   for x in difflib.unified_diff(a, b, la, lb, lineterm="\n"))


BASE = "".join(f"line {i}\n" for i in range(40))


@pytest.mark.parametrize("old,new", [
    (None, "a\nb\nc\n"),                                  # added file
    ("a\nb\nc\n", None),                                  # removed file
    (None, "one line, no newline"),
    ("x\n", None),
    ("", "a\n"), ("a\n", ""), (None, ""), ("", None), ("same\n", "same\n"),
    (BASE, BASE.replace("line 7\n", "line 7\nnew a\nnew b\n")),       # insertion
    (BASE, "new first\n" + BASE + "new last\n"),                      # at both ends
    (BASE, BASE.replace("line 3\nline 4\n", "").replace("line 30\n", "")),  # deletions
    (BASE, BASE.replace("line 12\n", "line twelve\n")),               # an edit
    (BASE, BASE.replace("line 12\nline 13\n", "x\ny\nz\n")),           # 2 lines → 3
    ("a\nb\n", "a\nb"),                                   # the last newline dropped
    ("a\nb", "a\nb\nc\n"),                                # ... and added back, with a line
    ("a\r\nb\r\n", "a\r\nc\r\n"),                         # CRLF
    ("a\n\n\nb\n", "a\n\n\n\nb\n"),                        # one more blank line
    ("x\nx\nx\n", "x\nx\n"),                              # repeated lines
    ("a\rb\rc\r", "a\rB\rc\r"),                           # old Mac line ends: splitlines splits them too
    ("a\x0cb\nc\n", "a\x0cb\nd\n"),                        # a form feed: str.splitlines splits there
    ("é\u2028x\n", "é\u2028y\n"), ("ü\nß\n", "ü\nß\nñ"),
])
def test_counts_equal_the_diffs_for_additions_deletions_and_edits(old: str | None, new: str | None) -> None:
    assert count_changed_lines(old, new) == by_diff(old, new)
    # The UTF-8 bytes give the same counts wherever they split the same lines.
    if all(t is None or splits_like_bytes(t) for t in (old, new)):
        enc = [None if t is None else t.encode() for t in (old, new)]
        assert count_changed_lines(*enc) == by_diff(old, new)
    else:
        assert "\x0c" in (old or "") + (new or "") or "\u2028" in (old or "") + (new or "")


def test_counts_equal_difflib_on_random_edits() -> None:
    rnd = random.Random(13)
    for _ in range(300):
        # Lines with repeats (blank lines, `)`), as source files have.
        base = [rnd.choice(["\n", "    )\n", "    pass\n"]) if rnd.random() < 0.2 else f"l{i}\n"
                for i in range(rnd.randint(0, 120))]
        new = list(base)
        for _ in range(rnd.randint(1, 6)):
            op, at = rnd.choice("idr"), rnd.randint(0, len(new))
            if op == "i":
                new[at:at] = [f"new{rnd.random()}\n" for _ in range(rnd.randint(1, 5))]
            elif op == "d":
                del new[at:at + rnd.randint(1, 5)]
            else:
                new[at:at + rnd.randint(1, 3)] = [f"edit{rnd.random()}\n" for _ in range(rnd.randint(1, 3))]
        old_t, new_t = "".join(base), "".join(new)
        assert count_changed_lines(old_t, new_t) == by_diff(old_t, new_t), (base, new)


def test_counts_are_the_multiset_difference_of_the_lines() -> None:
    rnd = random.Random(2)
    for _ in range(3000):
        x = "".join(rnd.choice(["a", "b", "\n", "\r", "\r\n", "é"]) for _ in range(rnd.randint(0, 40)))
        y = "".join(rnd.choice(["a", "b", "\n", "\r", "\r\n", "é"]) for _ in range(rnd.randint(0, 40)))
        if rnd.random() < 0.6:  # mostly a shared beginning and end
            y = x[:rnd.randint(0, len(x))] + y[:4] + x[rnd.randint(0, len(x)):]
        ca, cb = Counter(x.splitlines(True)), Counter(y.splitlines(True))
        want = (sum((cb - ca).values()), sum((ca - cb).values()))
        assert count_changed_lines(x, y) == want, (x, y)
        assert count_changed_lines(x.encode(), y.encode()) == want, (x, y)


def test_moved_lines_are_counted_once_where_a_diff_counts_them_twice() -> None:
    old = "def a():\n    pass\n\n\ndef b():\n    return 1\n"
    new = "def b():\n    return 1\n\n\ndef a():\n    pass\n"
    # Two functions swapped: a line diff removes one and adds it again elsewhere.
    assert by_diff(old, new) == (4, 4)
    assert count_changed_lines(old, new) == (0, 0)
    # Moved and edited: only the edit counts.
    assert count_changed_lines(old, new.replace("return 1", "return 2")) == (1, 1)


@pytest.mark.parametrize("old,new", [
    (None, "a\nb\n"), (None, "a"), (None, "a\nb"), ("a\nb\n", None), ("a", None), ("a\r\nb", None),
    ("", "x\ny\n"), ("x\n", ""), ("one\n", None), (None, "\n"),
])
def test_whole_file_diffs_are_difflibs(old: str | None, new: str | None) -> None:
    assert unified_diff(old, new, "p", "p") == by_difflib(old, new)


def test_large_added_file_counts_and_diff_fast() -> None:
    text = "".join(f"x = {i}\n" for i in range(200_000))
    assert count_changed_lines(None, text) == (200_000, 0)
    assert count_changed_lines(text, None) == (0, 200_000)
    d = unified_diff(None, text, None, "big.py")
    assert d.startswith("--- /dev/null\n+++ b/big.py\n@@ -0,0 +1,200000 @@\n+x = 0\n")
    assert count_lines(d) == (200_000, 0)


def test_a_nul_in_the_head_is_binary_without_reading_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "lib.so"
    f.write_bytes(b"\x7fELF\0" + b"a" * 100_000)
    assert sides._read_bytes(str(f), "not this hash") is sides.BINARY
    t = tmp_path / "t.py"
    t.write_bytes(b"x = 1\n")
    assert sides._read_bytes(str(t), None) == b"x = 1\n"
    assert sides._read_bytes(str(t), "0" * 64) is None  # not the bytes the manifest names
    assert sides._read_bytes(str(tmp_path / "gone"), None) is None


# --------------------------------------------------------------------------------------
# On an environment: counts without diffs unless files are shown
# --------------------------------------------------------------------------------------
MOD_OLD = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(30))


@pytest.fixture
def edited(tmp_path: Path, wheelhouse: Path) -> dict:
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    sp = site_packages(py)
    (sp / "toypkg" / "mod.py").write_text(MOD_OLD)
    (sp / "toypkg" / "blob.bin").write_bytes(b"\0\1\2" * 1000)
    (sp / "toypkg" / "gone.py").write_text("a = 1\nb = 2\n")
    (sp / "toypkg" / "ff.py").write_text("x\x0cy\n")  # a form feed, a line break to str.splitlines
    t = open_target(Recipe.for_python(py))
    snap = snapshot_now(t).result.meta
    # New inodes (the snapshot shares the old ones by hard link).
    for name in ("mod.py", "blob.bin", "gone.py", "ff.py"):
        (sp / "toypkg" / name).unlink()
    (sp / "toypkg" / "ff.py").write_text("x\x0cz\ny\n")
    new = MOD_OLD.replace("    return 7\n", "    return 7  # edited\n") + "def g():\n    pass\n"
    (sp / "toypkg" / "mod.py").write_text(new)
    (sp / "toypkg" / "blob.bin").write_bytes(b"\0\1\3" * 1000)
    (sp / "toypkg" / "added.py").write_text("x = 1\ny = 2\nz = 3")
    return {"py": py, "snap": snap, "target": open_target(Recipe.for_python(py)), "mod_new": new}


def test_counts_without_diffs_and_diffs_only_when_shown(edited: dict) -> None:
    t, snap = edited["target"], edited["snap"]
    res = diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)})
    files = {f.path: f for f in res.files}
    assert {p: (f.change, f.added_lines, f.removed_lines, f.binary) for p, f in files.items()} == {
        "toypkg/mod.py": ("changed", 3, 1, False),
        "toypkg/blob.bin": ("changed", None, None, True),
        "toypkg/gone.py": ("removed", 0, 2, False),
        "toypkg/added.py": ("added", 3, 0, False),
        "toypkg/ff.py": ("changed", 1, 0, False)}
    assert all(f.diff is None for f in res.files)
    # Shown: the diff, and the same counts.
    res = diffmod.diff_target(t.env, t.store, snap.id, path_glob="*/toypkg/*.py", with_diffs=True)
    shown = {f.path: f for f in res.files}
    assert set(shown) == {"toypkg/mod.py", "toypkg/gone.py", "toypkg/added.py", "toypkg/ff.py"}
    for p, f in shown.items():
        assert (f.added_lines, f.removed_lines) == (files[p].added_lines, files[p].removed_lines)
        assert f.diff and (f.added_lines, f.removed_lines) == count_lines(f.diff)
    # (Named relative to the environment's prefix, the base of every shown diff.)
    named = shown["toypkg/mod.py"].patch_path
    assert named is not None and re.fullmatch(r"lib/python3\.\d+/site-packages/toypkg/mod\.py", named)
    assert shown["toypkg/mod.py"].diff == by_difflib(MOD_OLD, edited["mod_new"]).replace(
        "--- a/p\n", f"--- a/{named}\n").replace("+++ b/p\n", f"+++ b/{named}\n")


def test_cli_json_and_stat_carry_counts_not_diffs(edited: dict) -> None:
    rw = ["diff", "--python", str(edited["py"]), edited["snap"].id]
    cp = support_cli.rewheel(*rw, "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    got = {f["path"]: (f["change"], f["added_lines"], f["removed_lines"], f["diff"]) for f in doc["files"]}
    assert got["toypkg/mod.py"] == ("changed", 3, 1, None)
    assert got["toypkg/added.py"] == ("added", 3, 0, None)
    cp = support_cli.rewheel(*rw, "--stat")
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert " M toypkg/mod.py  +3 -1  toypkg" in lines
    assert " M toypkg/blob.bin  binary  toypkg" in lines
    assert " D toypkg/gone.py  +0 -2  toypkg" in lines
    assert " 5 file(s), +7 -3" in lines
    assert "@@" not in cp.stdout
    cp = support_cli.rewheel(*rw, "--json", "--path", "*mod.py")
    assert cp.returncode == 0, cp.stderr
    [f] = json.loads(cp.stdout)["files"]
    # The diff names the file relative to the environment's prefix, the patch's one base.
    assert f["path"] == "toypkg/mod.py" and re.match(r"--- a/lib/python3\.\d+/site-packages/toypkg/mod\.py\n", f["diff"])


# --------------------------------------------------------------------------------------
# A large diff reads and counts its files in two processes
# --------------------------------------------------------------------------------------
def always_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on every diff that only counts is split, on any machine (as from
    SPLIT_MIN_FILES changed files on, with two CPUs)."""
    monkeypatch.setattr(trees, "SPLIT_MIN_FILES", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def counted(res: diffmod.DiffResult) -> dict[str, tuple]:
    return {f.path: (f.change, f.added_lines, f.removed_lines, f.binary, f.note) for f in res.files}


def test_a_split_diff_counts_what_one_process_counts(edited: dict, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """From SPLIT_MIN_FILES changed files on (here: 1), half the files are read and counted in
    a forked process: every count, binary flag and note is the one a single process finds,
    and both processes really did part of the work."""
    t, snap = edited["target"], edited["snap"]
    one = counted(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)}))
    assert len(one) == 5
    calls = tmp_path / "calls"
    calls.mkdir()
    real_fill = trees._fill_text

    def recording(fc, *args, **kw):  # the pid of each file's reader, one file per file
        (calls / fc.path.replace("/", "_")).write_text(str(os.getpid()))
        return real_fill(fc, *args, **kw)

    monkeypatch.setattr(trees, "_fill_text", recording)
    always_split(monkeypatch)
    two = counted(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)}))
    assert two == one
    pids = {p.read_text() for p in calls.iterdir()}
    assert len(list(calls.iterdir())) == 5 and str(os.getpid()) in pids and len(pids) == 2


def test_a_shown_diff_is_never_split(edited: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unified diffs (`-p`, `--path`, `--package`) are built in this process: only the
    counts travel back from the second one."""
    t, snap = edited["target"], edited["snap"]
    always_split(monkeypatch)
    monkeypatch.setattr(trees, "_fill_split", lambda *a: pytest.fail("a shown diff was split"))
    res = diffmod.diff_target(t.env, t.store, snap.id, path_glob="*/toypkg/*.py", with_diffs=True)
    assert all(f.diff for f in res.files) and len(res.files) == 4


# --------------------------------------------------------------------------------------
# A large diff walks the live environment in a second process (issue 44)
# --------------------------------------------------------------------------------------
def share_every_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on every diff against the live environment walks it in a second process, on
    any machine (as from WALK_SHARE_MIN_FILES files in the snapshot on, with two CPUs)."""
    monkeypatch.setattr(trees, "WALK_SHARE_MIN_FILES", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def whole(res: diffmod.DiffResult) -> dict:
    doc = res.to_json()
    doc["stats"].pop("seconds")
    return doc


def test_a_walk_in_a_second_process_finds_what_one_process_finds(edited: dict, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    t, snap = edited["target"], edited["snap"]
    one = whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)}))
    assert {f["path"] for f in one["files"]} >= {"toypkg/mod.py", "toypkg/added.py", "toypkg/gone.py"}
    walkers = tmp_path / "walkers"
    walkers.mkdir()
    real_walk = trees._walk_live

    def recording(*args, **kw):
        (walkers / str(os.getpid())).touch()
        return real_walk(*args, **kw)

    monkeypatch.setattr(trees, "_walk_live", recording)
    share_every_walk(monkeypatch)
    assert whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)})) == one
    assert [p.name for p in walkers.iterdir()] != [str(os.getpid())] and len(list(walkers.iterdir())) == 1


@pytest.mark.parametrize("fault", ["dies", "hangs"])
@pytest.mark.parametrize("share", ["_fill_text", "_walk_live"])
def test_a_diff_whose_second_process_fails_does_its_share_itself(edited: dict, share: str, fault: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process — counting half the files, or walking the live environment — that
    dies mid-way, or never answers (stuck on a lock a thread held at the fork) and is killed
    once overdue: its share is done here, and the diff is the same."""
    t, snap = edited["target"], edited["snap"]
    one = whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)}))
    monkeypatch.setattr(trees, share, fails_in_a_forked_child(getattr(trees, share), fault))
    monkeypatch.setattr(trees, "SPLIT_WAIT_MIN_S", 0.5)
    always_split(monkeypatch)
    share_every_walk(monkeypatch)
    t0 = time.monotonic()
    assert whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)})) == one
    assert time.monotonic() - t0 < 60  # not the child's 600 s


def test_a_walk_honours_the_snapshots_exclusions_in_either_process(tmp_path: Path, wheelhouse: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What a snapshot left out (`[snapshots] exclude`) is not compared, walked here or there."""
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    cache = py.parent.parent / "cache"
    cache.mkdir()
    (cache / "a.pt").write_bytes(b"1")
    t = open_target(dataclasses.replace(Recipe.for_python(py), snapshot_exclude=("cache",)))
    snap = snapshot_now(t).result.meta
    (cache / "b.pt").write_bytes(b"2")
    (site_packages(py) / "toypkg" / "new.py").write_text("n = 1\n")
    one = whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)}))
    assert [f["path"] for f in one["files"]] == ["toypkg/new.py"]
    share_every_walk(monkeypatch)
    assert whole(diffmod.diff_trees(t.env, snap, None, skip={str(t.store.home)})) == one
