"""Helpers for the installer, local-index and smoke tests: recipes written as real TOML files,
folders of real wheels, a closed port, and process liveness that treats zombies as dead."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import tomli_w

from rewheel.recipe import Recipe, load_recipe
from support_standins import pid_alive
from devtools.wheelbuild import build_wheel

# The nightly-style version a prerelease-only index offers (setuptools-scm form).
NIGHTLY = "1.0.0rc2.dev344+g5719a4e4e"


def write_recipe(folder: Path, python: Path | str, *, install: dict[str, Any] | None = None,
                 smoke: dict[str, Any] | None = None, name: str = "toy") -> Recipe:
    """Write `folder/<name>.toml` and load it the way `rewheel run` does."""
    doc: dict[str, Any] = {"name": name, "environment": {"python": str(python)},
                           "install": {"packages": ["toypkg"], **(install or {})}}
    if smoke is not None:
        doc["smoke"] = smoke
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return load_recipe(path)


def toy_wheels(folder: Path, toypkg: tuple[str, ...] = ("1.0.0", "2.0.0"),
               toyhelper: tuple[str, ...] = ("1.0.0", "1.1.0")) -> Path:
    """toypkg (requires toyhelper>=1) and toyhelper, in the versions asked for."""
    folder.mkdir(parents=True, exist_ok=True)
    for v in toypkg:
        build_wheel(folder, "toypkg", v, {"toypkg/__init__.py": f'__version__ = "{v}"\n',
                                          "toypkg/core.py": f"VERSION = {v!r}\n"},
                    requires=["toyhelper>=1"])
    for v in toyhelper:
        build_wheel(folder, "toyhelper", v, {"toyhelper/__init__.py": f'HELP = "{v}"\n'})
    return folder


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# True while a pid runs; a zombie (dead, not yet reaped by whoever inherited it) is dead.
alive = pid_alive


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies excluded), from /proc."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(d.name))
    return found


def site_packages(python: Path) -> Path:
    """The site-packages of a uv venv (lib/pythonX.Y/site-packages under the venv)."""
    found = list((python.parent.parent / "lib").glob("python*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def installed_version(python: Path, name: str) -> str | None:
    sp = site_packages(python)
    prefix = name.replace("-", "_") + "-"
    for d in sp.glob("*.dist-info"):
        if d.name.startswith(prefix):
            return d.name[len(prefix):-len(".dist-info")]
    return None
