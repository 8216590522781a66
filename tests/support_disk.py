"""A small real filesystem that tests fill (tests/test_full_disk.py, tests/test_fleet_ssh.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


# Preflight wants 2 GiB free on the environment's and the store's filesystems: a sparse ext4
# image of a little more, in memory where there is a /dev/shm (fsyncs stay cheap). Filled by
# fallocate, it costs no memory or disk of its own.
SIZE_MB = 2200


@pytest.fixture
def disk(tmp_path: Path):
    """A real ext4 filesystem of 2.2 GiB on a loop device (root, as in CI), unmounted and
    its image removed whatever happens."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    shm = Path("/dev/shm")
    img = (shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path) / f"rewheel-fulldisk-{os.getpid()}-{id(mnt)}.img"
    try:
        with open(img, "wb") as f:
            f.truncate(SIZE_MB << 20)
        subprocess.run(["mkfs.ext4", "-q", "-m", "0", "-E", "nodiscard", str(img)], check=True, capture_output=True)
        if subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True).returncode:
            pytest.fail("mounting a loop filesystem needs root (as in CI)")
        try:
            yield mnt
        finally:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(mnt)])
    finally:
        img.unlink(missing_ok=True)


def fill(disk: Path, room: int) -> Path:
    """Fill the filesystem of `disk`, leaving `room` bytes free (to a block): fallocate the
    bulk, then block by block (the extent tree takes blocks too), then single bytes until the
    last one is taken when `room` is 0."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        def free() -> int:
            st = os.statvfs(disk)
            return st.f_bavail * st.f_frsize

        size = max(0, free() - room - (1 << 20))
        if size:
            os.posix_fallocate(f.fileno(), 0, size)
        while free() > room:
            try:
                os.posix_fallocate(f.fileno(), size, 4096)
            except OSError:
                break
            size += 4096
        if room == 0:
            f.seek(size)
            try:
                while True:
                    f.write(b"\0")
            except OSError:
                pass
    return filler
