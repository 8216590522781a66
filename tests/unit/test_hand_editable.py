"""The one rule for a file a person may edit by hand (`hand_editable`), and the two places
that act on it: a snapshot copies such a file where it shares a binary by a hard link, and a
restore copies it back; `unshare` (after a staged swap) gives every file linked from uv's
cache an inode of its own, binaries too. End to end (real editors, rollbacks):
tests/test_hand_edits.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rewheel import staging
from rewheel.environment import Environment
from rewheel.snapshot import hand_editable
from rewheel.snapshot.tree import SMALL_TEXT_MAX

MB = 1 << 20


@pytest.mark.parametrize("name,size", [
    ("core.py", 300), ("deepseek_v2.py", 50 * MB), ("__init__.pyi", 10), ("_C.pyx", 10), ("tokenizer.json", 30 * MB),
    ("config.yaml", 10), ("ci.yml", 10), ("pyproject.toml", 10), ("setup.cfg", 10), ("tox.ini", 10),
    ("entry_points.txt", 10), ("run.sh", 10), ("README.md", 10), ("index.rst", 10), ("ops.c", 10), ("ops.h", 10),
    ("gemm.cu", 10), ("gemm.cuh", 10), ("kernel.hpp", 10), ("cacert.pem", 300_000),
    ("distutils-precedence.pth", 152), ("README.MD", 10), ("py.typed", 0),
    # Neither kind of suffix, small: scripts in bin/ (shebang), metadata, licences, dotfiles.
    ("vllm", 250), ("METADATA", 90_000), ("LICENSE", 11_000), ("INSTALLER", 2), (".bashrc", 100),
    ("model.v7", 1000), ("activate", SMALL_TEXT_MAX),
])
def test_what_a_person_edits_is_hand_editable(name: str, size: int) -> None:
    assert hand_editable(name, size) is True


@pytest.mark.parametrize("name,size", [
    ("_C.abi3.so", 400 * MB), ("libcudart.so.12", 700_000), ("libnccl.so.2.21.5", 200 * MB), ("tiny.so", 10),
    ("core.cpython-311.pyc", 20_000),  # Python writes its caches by rename: sharing them is safe
    ("model.safetensors", 10), ("weights.pt", 10), ("libtorch.a", MB), ("_ops.PYD", 10), ("x.whl", 10),
    ("messages.mo", 10), ("logo.png", 10),
    # Neither kind of suffix, large: a compiler a CUDA wheel ships in its bin/.
    ("ptxas", 30 * MB), ("data.v7", SMALL_TEXT_MAX + 1),
])
def test_binaries_and_large_unknown_files_are_not(name: str, size: int) -> None:
    assert hand_editable(name, size) is False


def test_the_rule_reads_the_name_not_a_path() -> None:
    """Callers pass the last component: a folder named like a suffix decides nothing."""
    assert hand_editable("ptxas", 30 * MB) is False
    assert hand_editable("libfoo.so.1.py", 30 * MB) is True  # the last suffix decides


def _env_with_one_distribution(tmp_path: Path, cache: Path) -> tuple[Environment, Path, Path]:
    """A site folder holding one distribution whose files are hard links into a stand-in of
    uv's cache, as a staged swap (`--link-mode hardlink`) leaves them."""
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    cache.mkdir()
    (cache / "mod.py").write_text("VALUE = 1\n")
    (cache / "_ext.so").write_bytes(b"\x7fELF" + bytes(100))
    os.link(cache / "mod.py", site / "pkg" / "mod.py")
    os.link(cache / "_ext.so", site / "pkg" / "_ext.so")
    info = site / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("pkg/mod.py,,\npkg/_ext.so,,\npkg-1.0.dist-info/METADATA,,\n"
                                 "pkg-1.0.dist-info/RECORD,,\n")
    prefix = tmp_path / "env"
    env = Environment(python=prefix / "bin" / "python", prefix=prefix, base_prefix=prefix, version="3.11",
                      site_dirs=[site], scripts_dir=prefix / "bin", kind="venv")
    return env, site / "pkg" / "mod.py", site / "pkg" / "_ext.so"


def test_unshare_gives_every_file_linked_from_uv_cache_its_own_inode(tmp_path: Path) -> None:
    cache = tmp_path / "uv-cache"
    env, mod, ext = _env_with_one_distribution(tmp_path, cache)
    st, st_ext = mod.stat(), ext.stat()
    files, size = staging.unshare(env, since_ns=0)
    assert (files, size) == (2, st.st_size + st_ext.st_size)
    # The source: an inode of its own, same bytes, mode and mtime; an edit in place now
    # cannot reach uv's cached copy.
    assert mod.stat().st_nlink == 1 and mod.stat().st_ino != (cache / "mod.py").stat().st_ino
    assert mod.read_text() == "VALUE = 1\n" and mod.stat().st_mtime_ns == st.st_mtime_ns
    with open(mod, "r+") as f:
        f.write("VALUE = 2\n")
    assert (cache / "mod.py").read_text() == "VALUE = 1\n"
    # The binary too: uv's cache is a recovery source, so nothing stays one inode with it
    # (a snapshot may share a binary; the cache may not).
    assert ext.stat().st_ino != (cache / "_ext.so").stat().st_ino and ext.stat().st_nlink == 1
    assert ext.read_bytes() == (cache / "_ext.so").read_bytes()


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "read-write"])
def test_the_snapshot_copy_of_a_source_keeps_its_bytes_and_mtime(tmp_path: Path, kernel_copy: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from rewheel.snapshot.capture import copy_plain

    src = tmp_path / "big.py"
    src.write_bytes(os.urandom(3 * MB + 17))  # more than one chunk
    os.utime(src, ns=(1_000_000_000, 1_234_567_890_123))
    if not kernel_copy:  # a kernel (or filesystem pair) without an in-kernel copy
        def refuse(*a: object, **k: object) -> int:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    copy_plain(str(src), str(tmp_path / "copy"), src.stat())
    dst = tmp_path / "copy"
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mtime_ns == 1_234_567_890_123 and dst.stat().st_ino != src.stat().st_ino
