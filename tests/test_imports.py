"""Every `rewheel` module imports on its own, in a fresh interpreter: no circular imports
(a cycle shows only when the module that closes it is imported first)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import rewheel


def all_modules() -> list[str]:
    """Every module but the `__main__`s: importing one runs its command."""
    return sorted(m.name for m in pkgutil.walk_packages(rewheel.__path__, "rewheel.")
                  if not m.name.endswith(".__main__"))


def test_the_package_has_the_modules_this_test_walks() -> None:
    names = all_modules()
    assert "rewheel.snapshot.tree" in names and "rewheel.snapshot.lanes" in names
    assert len(names) > 20


@pytest.mark.parametrize("module", all_modules())
def test_module_imports_alone(module: str) -> None:
    cp = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, f"import {module} failed:\n{cp.stderr}"
