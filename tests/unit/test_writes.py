"""Durable writes: every byte written even when `os.write` writes less than asked, and the
patch writer's rename synced in its folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rewheel import paths
from rewheel.patches import carry


def one_byte_at_a_time(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`os.write` as a short-writing system would behave: one byte per call."""
    real = os.write
    calls: list[int] = []

    def short(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real(fd, bytes(data[:1]))

    monkeypatch.setattr(os, "write", short)
    return calls


def test_atomic_write_writes_everything_despite_short_writes(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * 40
    calls = one_byte_at_a_time(monkeypatch)
    target = tmp_path / "state" / "meta.json"
    paths.atomic_write(target, data)
    assert target.read_bytes() == data
    assert len(calls) == len(data)  # one call per byte: it kept going after each short write
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["meta.json"]  # no temporary file left


def test_the_patch_writer_writes_everything_and_syncs_its_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site-packages" / "pkg"
    site.mkdir(parents=True)
    installed = site / "mod.py"
    installed.write_bytes(b"old\n")
    cache_copy = tmp_path / "cache-mod.py"
    os.link(installed, cache_copy)  # as uv links a file from its cache
    synced: list[Path] = []
    real_fsync_dir = paths.fsync_dir

    def record(path: Path) -> None:
        synced.append(Path(path))
        real_fsync_dir(path)

    monkeypatch.setattr(carry, "fsync_dir", record)  # where `_write_replacing` reads it
    data = b"patched = True\n" * 500
    calls = one_byte_at_a_time(monkeypatch)
    carry._write_replacing(str(installed), data, 0o644)
    assert installed.read_bytes() == data
    assert len(calls) == len(data)
    assert cache_copy.read_bytes() == b"old\n"  # written through a new inode, not into the cache's
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    assert synced == [site]  # the rename reaches the disk with the folder's entry
    assert sorted(p.name for p in site.iterdir()) == ["mod.py"]
