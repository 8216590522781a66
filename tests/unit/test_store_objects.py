"""The object store (`snapshot.objects`) and uv's cache as a place to take a file back from
(`snapshot.cachelinks`), on real files: names, whole and half-made objects, links of live
binaries, the sweep, and the very inode a file had."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from rewheel.errors import SnapshotError
from rewheel.snapshot.cachelinks import CacheInodes, uv_cache_dir
from rewheel.snapshot.objects import OBJECT_MTIME_NS, Objects, object_name, private_ok, valid_sha


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("bad", ["", "ab", "AB" * 32, "g" * 64, "../" + "a" * 61, "a" * 63 + "/", None, 5])
def test_an_object_name_is_made_of_a_sha256_only(bad: object) -> None:
    assert not valid_sha(bad)
    with pytest.raises(ValueError):
        object_name(bad, "C", 0)  # type: ignore[arg-type]


def test_names_of_private_and_linked_objects() -> None:
    h = "0f" * 32
    assert object_name(h, "C", 5) == object_name(h, "R", 6) == f"0f/{'0f' * 31}"
    assert object_name(h, "L", 5) == f"0f/{'0f' * 31}-5"


def test_a_private_copy_is_whole_once_and_only_once(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()  # an environment's state folder
    src = tmp_path / "core.py"
    src.write_bytes(b"print('hi')\n" * 1000)
    h = sha(src.read_bytes())
    with Objects(tmp_path / "env") as objs:
        assert objs.copy_in(str(src), h, src.stat().st_size) is True
        assert objs.copy_in(str(src), h, src.stat().st_size) is False  # the store holds it
    with Objects(tmp_path / "env") as objs:  # a new instance asks the disk
        assert objs.has_private(h, src.stat().st_size)
        assert objs.copy_in(str(src), h, src.stat().st_size) is False
        st = objs.lstat(object_name(h, "C", 0))
    assert st is not None and st.st_ino != src.stat().st_ino and st.st_mtime_ns == OBJECT_MTIME_NS
    assert Path(tmp_path / "env" / "objects" / object_name(h, "C", 0)).read_bytes() == src.read_bytes()


def test_a_half_made_object_is_made_again(tmp_path: Path) -> None:
    """What a copy killed midway leaves under the object's name (its completion mark never
    set) is not believed: the next copy replaces it."""
    src = tmp_path / "layers.py"
    src.write_bytes(os.urandom(5000))
    h = sha(src.read_bytes())
    half = tmp_path / "env" / "objects" / h[:2] / h[2:]
    half.parent.mkdir(parents=True)
    half.write_bytes(src.read_bytes()[:100])
    with Objects(tmp_path / "env") as objs:
        assert not objs.has_private(h, 5000)
        assert objs.copy_in(str(src), h, 5000) is True
        assert objs.has_private(h, 5000)
    assert half.read_bytes() == src.read_bytes()


def test_a_copy_hashed_in_names_the_object_by_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()  # an environment's state folder
    src = tmp_path / "dump.pt"
    with open(src, "wb") as f:  # sparse: a hole, then data
        f.truncate(1 << 20)
        f.seek(1 << 19)
        f.write(b"data")
    with Objects(tmp_path / "env") as objs:
        h, size, new = objs.copy_hashed_in(str(src))
        assert (h, size, new) == (sha(src.read_bytes()), 1 << 20, True)
        assert objs.copy_hashed_in(str(src))[2] is False
    stored = tmp_path / "env" / "objects" / object_name(h, "C", 0)
    assert stored.read_bytes() == src.read_bytes() and stored.stat().st_blocks * 512 < 1 << 19


def test_a_linked_object_is_the_live_inode(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()  # an environment's state folder
    src = tmp_path / "_ops.so"
    src.write_bytes(os.urandom(9000))
    st = src.stat()
    h = sha(src.read_bytes())
    with Objects(tmp_path / "env") as objs:
        got = objs.link_in(str(src), h, st)
        assert got is not None and got.st_ino == st.st_ino
        again = objs.link_in(str(src), h, st)  # already there: the same inode
        assert again is not None and again.st_ino == st.st_ino
        # Another inode with the same bytes and mtime shares the object; a damaged one under
        # that name (another size) is replaced by this inode.
        twin = tmp_path / "twin.so"
        twin.write_bytes(src.read_bytes())
        os.utime(twin, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert objs.link_in(str(twin), h, twin.stat()).st_ino == st.st_ino  # type: ignore[union-attr]
        name = object_name(h, "L", st.st_mtime_ns)
        path = tmp_path / "env" / "objects" / name
        path.unlink()
        path.write_bytes(b"short")
        assert objs.link_in(str(twin), h, twin.stat()).st_ino == twin.stat().st_ino  # type: ignore[union-attr]


def test_the_sweep_keeps_what_is_named_and_removes_the_rest(tmp_path: Path) -> None:
    (tmp_path / "env").mkdir()  # an environment's state folder
    keep, drop = tmp_path / "keep.py", tmp_path / "drop.py"
    keep.write_text("keep\n")
    drop.write_text("drop\n")
    with Objects(tmp_path / "env") as objs:
        objs.copy_in(str(keep), sha(b"keep\n"), 5)
        objs.copy_in(str(drop), sha(b"drop\n"), 5)
        dead = _a_dead_pid()
        (tmp_path / "env" / "objects" / f".tmp-{dead}-1").write_text("left by a killed copy")
        # A process still running writes its own (the detached settling of an undo snapshot):
        # not a leftover. (Process 1 is always running.)
        (tmp_path / "env" / "objects" / ".tmp-1-1").write_text("being written")
        n, size = objs.collect({object_name(sha(b"keep\n"), "C", 0)})
    assert (n, size) == (1, 5)
    left = sorted(str(p.relative_to(tmp_path / "env" / "objects")) for p in (tmp_path / "env" / "objects").rglob("*")
                  if p.is_file())
    assert left == [".tmp-1-1", object_name(sha(b"keep\n"), "C", 0)]


def _a_dead_pid() -> int:
    """A pid no process has now: one past the highest running, checked."""
    pid = max(int(n) for n in os.listdir("/proc") if n.isdigit()) + 1000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


def test_a_link_where_a_folder_of_the_store_belongs_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "objects").symlink_to(outside)
    src = tmp_path / "a.py"
    src.write_text("a\n")
    with Objects(tmp_path / "env") as objs, pytest.raises(SnapshotError, match="not a folder of the store"):
        objs.copy_in(str(src), sha(b"a\n"), 2)
    assert list(outside.iterdir()) == []


def test_private_ok_wants_the_size_and_the_completion_mark(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"1234")
    assert not private_ok(p.stat(), 4)
    os.utime(p, ns=(0, OBJECT_MTIME_NS))
    assert private_ok(p.stat(), 4) and not private_ok(p.stat(), 5) and not private_ok(None, 4)


def make_cache(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A uv cache holding one unpacked wheel, and an environment whose file is linked to it."""
    cache = tmp_path / "uv-cache"
    archive = cache / "archive-v0" / "abc123"
    (archive / "toypkg").mkdir(parents=True)
    cached = archive / "toypkg" / "core.py"
    cached.write_text("VALUE = 1\n")
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    (site / "toypkg").mkdir(parents=True)
    live = site / "toypkg" / "core.py"
    os.link(cached, live)
    return cache, cached, live


def test_the_very_inode_is_found_in_uv_s_cache(tmp_path: Path) -> None:
    cache, cached, live = make_cache(tmp_path)
    st = live.stat()
    ci = CacheInodes(cache, {0: ["lib/python3.11/site-packages"]})
    folder = "lib/python3.11/site-packages/toypkg"
    args = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode & 0o7777)
    assert ci.find(0, folder, "core.py", *args) == str(cached)
    # Anything else is not it: another inode, size, mtime or mode, a script, no inode recorded.
    assert ci.find(0, folder, "core.py", st.st_ino + 1, *args[1:]) is None
    assert ci.find(0, folder, "core.py", st.st_ino, st.st_size + 1, *args[2:]) is None
    assert ci.find(0, folder, "core.py", *args[:2], st.st_mtime_ns + 1, args[3]) is None
    assert ci.find(0, folder, "core.py", *args[:3], 0o600) is None
    assert ci.find(0, "bin", "core.py", *args) is None
    assert ci.find(0, folder, "core.py", None, *args[1:]) is None


def test_uv_s_cache_folder_is_found_without_starting_uv(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    assert uv_cache_dir({"UV_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    assert uv_cache_dir({"UV_CACHE_DIR": str(tmp_path / "c"), "UV_NO_CACHE": "1"}) is None
    (tmp_path / "x" / "uv").mkdir(parents=True)
    assert uv_cache_dir({"XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "uv"
    assert uv_cache_dir({"HOME": str(tmp_path / "nohome")}) is None


def test_a_taken_over_object_is_settled_by_what_else_links_it(tmp_path: Path) -> None:
    """`Objects.privatize`: each outcome, on real links (what `privatize.settle` does to each
    object a rollback's undo snapshot took over)."""
    from rewheel.snapshot import privatize

    env = tmp_path / "env"
    env.mkdir()
    live = {n: tmp_path / f"{n}.py" for n in ("alone", "cached", "edited", "moved")}
    for n, p in live.items():
        p.write_bytes(f"# {n}\n".encode() * 100)
    with Objects(env) as objs:
        taken = []
        for p in live.values():
            st = p.stat()
            assert objs.link_in(str(p), sha(p.read_bytes()), st) is not None
            taken.append((object_name(sha(p.read_bytes()), "L", st.st_mtime_ns), str(p), st.st_ino))
    names = {n: t[0] for n, t in zip(live, taken, strict=True)}
    inos = {n: t[2] for n, t in zip(live, taken, strict=True)}
    obj = {n: env / "objects" / names[n] for n in live}
    # The restore replaced "alone": the store's link is its only one.
    live["alone"].unlink()
    # "cached": uv's cache still links it (a second name elsewhere).
    cache_name = tmp_path / "cache-entry"
    os.link(live["cached"], cache_name)
    live["cached"].unlink()
    # "edited": still the environment's, edited in place.
    with open(live["edited"], "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"# an edit\n")
    # "moved": settled already by another process (a copy renamed over it).
    copy = tmp_path / "copy"
    copy.write_bytes(obj["moved"].read_bytes())
    os.utime(copy, ns=(0, obj["moved"].stat().st_mtime_ns))
    os.replace(copy, obj["moved"])
    snap = env / "snapshots" / "0a1b2c3d"
    snap.mkdir(parents=True)
    privatize.write_record(snap, taken)
    assert privatize.pending(env) == [snap / privatize.TAKEN_OVER]
    done = privatize.settle(env)
    assert done.counts == {"alone": 1, "copied": 1, "changed": 1, "gone": 1} and done.records == 1
    assert privatize.pending(env) == []
    assert obj["alone"].stat().st_ino == inos["alone"] and obj["alone"].stat().st_nlink == 1
    st = obj["cached"].stat()
    assert st.st_ino != inos["cached"] and st.st_nlink == 1 and st.st_mode & 0o777 == 0o400
    assert obj["cached"].read_bytes() == cache_name.read_bytes()
    assert st.st_mtime_ns == cache_name.stat().st_mtime_ns  # its name's mtime, still
    assert not obj["edited"].exists() and live["edited"].read_bytes().endswith(b"# an edit\n")
    # Settling again finds nothing to do; a record tampered with names nothing outside.
    assert privatize.settle(env).counts == {}
    privatize.write_record(snap, [("../../x-1", str(live["edited"]), 1), ["ab", "c"], (names["alone"], "", "7")])
    assert privatize.settle(env).counts == {}
