"""Build small, real wheels from a dict of files: for the demo, the benchmarks and the tests.

A wheel is a zip with `.dist-info/{METADATA,WHEEL,RECORD}`; writing one directly needs no
build backend and no network, and the result installs with uv like any other wheel.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version


def record_hash(data: bytes) -> str:
    """The `sha256=<urlsafe-b64, unpadded>` form RECORD files use."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_filename(name: str, version: str, tag: str = "py3-none-any") -> str:
    dist = re.sub(r"[-_.]+", "_", canonicalize_name(name))
    return f"{dist}-{Version(version)}-{tag}.whl"


def build_wheel(out_dir: str | Path, name: str, version: str, files: Mapping[str, str | bytes], *,
                requires: Sequence[str] = (), project_urls: Mapping[str, str] | None = None,
                console_scripts: Mapping[str, str] | None = None, summary: str = "",
                tag: str = "py3-none-any", executable: Sequence[str] = (),
                store_over: int | None = None) -> Path:
    """Write `<name>-<version>-<tag>.whl` into out_dir and return its path.

    `files` maps archive paths (e.g. "pkg/__init__.py") to contents; paths listed in
    `executable` get mode 0755 in the archive. Members larger than `store_over` bytes are
    stored uncompressed (ZIP_STORED): the benchmarks' multi-hundred-MB random payloads do not
    compress, and deflating them only costs time.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-_.]+", "_", canonicalize_name(name))
    ver = str(Version(version))
    info = f"{dist}-{ver}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {ver}"]
    if summary:
        meta.append(f"Summary: {summary}")
    for label, url in (project_urls or {}).items():
        meta.append(f"Project-URL: {label}, {url}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    entries: dict[str, bytes] = {}
    for path, content in files.items():
        entries[path] = content.encode() if isinstance(content, str) else content
    entries[f"{info}/METADATA"] = ("\n".join(meta) + "\n\n").encode()
    entries[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: rewheel.wheelbuild\n"
                                f"Root-Is-Purelib: true\nTag: {tag}\n").encode()
    if console_scripts:
        eps = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in console_scripts.items())
        entries[f"{info}/entry_points.txt"] = eps.encode()
    record_lines = [f"{p},{record_hash(d)},{len(d)}" for p, d in entries.items()]
    record_lines.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    target = out / wheel_filename(name, version, tag)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in entries.items():
            zi = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = ((0o100755 if path in executable else 0o100644) << 16)
            big = store_over is not None and len(data) > store_over
            zi.compress_type = zipfile.ZIP_STORED if big else zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return target
