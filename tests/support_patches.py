"""Helpers for the patch-scan tests on real wheels: wheels whose own RECORD disagrees with the
bytes they ship (a wheel post-processed after its RECORD was written: stripped or patchelf'd
libraries), and wheels that ship a path another distribution ships too."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

from devtools.wheelbuild import build_wheel, record_hash


def rewrite_record(wheel: Path, recorded: Mapping[str, bytes]) -> Path:
    """Rewrite `wheel` in place so that its RECORD gives each path in `recorded` the hash and
    size of those bytes instead of the bytes the wheel ships."""
    with zipfile.ZipFile(wheel) as zf:
        members = [(zi, zf.read(zi)) for zi in zf.infolist()]
    out: list[tuple[zipfile.ZipInfo, bytes]] = []
    for zi, data in members:
        if zi.filename.endswith(".dist-info/RECORD"):
            rows = []
            for line in data.decode().splitlines():
                path = line.split(",", 1)[0]
                if path in recorded:
                    other = recorded[path]
                    line = f"{path},{record_hash(other)},{len(other)}"
                rows.append(line)
            data = ("\n".join(rows) + "\n").encode()
        out.append((zi, data))
    with zipfile.ZipFile(wheel, "w") as zf:
        for zi, data in out:
            zf.writestr(zi, data)
    return wheel


def build_lying_wheel(out_dir: Path, name: str, version: str, files: Mapping[str, str | bytes],
                      recorded: Mapping[str, bytes]) -> Path:
    """A wheel shipping `files` whose RECORD lists `recorded`'s bytes for some of them."""
    return rewrite_record(build_wheel(out_dir, name, version, files), recorded)
