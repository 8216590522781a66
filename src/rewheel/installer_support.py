"""Locating the uv binary that ships with rewheel (the `uv` package), else uv on PATH."""

from __future__ import annotations

import shutil

from rewheel.errors import CommandNotFound


def uv_bin() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise CommandNotFound("uv not found: neither the `uv` package nor `uv` on PATH",
                          hint="reinstall rewheel (it depends on the uv package) or put uv on PATH")
