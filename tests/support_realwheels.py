"""Real wheels from the package index, for the tests where packaging matters: bundled-library
folders (`numpy.libs`), a real binary break (pandas 2.0 built against numpy 1.x, imported with
numpy 2), a pinned neighbour that must move (boto3 pins botocore), a namespace package
(jaraco.functools), a `.pth` file (setuptools' distutils-precedence.pth) and a package whose
newest release needs a newer Python (Django 6.0 needs 3.12).

`real_wheels()` downloads them once (`pip download`, the package index pip is configured
for) into `.rewheel-test/real-wheels/` at the repository root, which the next test session
reuses; the tests serve that folder on a loopback index. About 150 MB.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".rewheel-test" / "real-wheels"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

# name==version, as the index ships them for this interpreter (cp311 here and in CI).
WHEELS = (
    "numpy==1.26.4", "numpy==2.2.6",
    "pandas==2.0.3", "python-dateutil==2.9.0.post0", "pytz==2024.1", "tzdata==2024.1", "six==1.16.0",
    "boto3==1.34.0", "boto3==1.35.0", "botocore==1.34.0", "botocore==1.35.0",
    "s3transfer==0.9.0", "s3transfer==0.10.0", "jmespath==1.0.1", "urllib3==2.0.7",
    "jaraco.functools==4.0.0", "jaraco.functools==4.0.1", "more-itertools==10.2.0",
    "setuptools==69.5.1", "setuptools==70.0.0",
    "django==5.1.4", "django==5.2.8", "django==6.0", "asgiref==3.9.1", "sqlparse==0.5.3",
)


def _have(folder: Path, spec: str) -> bool:
    name, version = spec.split("==")
    stem = name.replace("-", "_").replace(".", "_").lower()
    return any(p.name.lower().startswith(f"{stem}-{version}-") for p in folder.glob("*.whl"))


def real_wheels() -> Path:
    """The folder of real wheels, downloaded on first use (one session at a time: a lock)."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"the real-wheel set is pinned for CPython 3.11 (this is {PY})")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE.parent / "real-wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [s for s in WHEELS if not _have(CACHE, s)]
        for spec in missing:
            cp = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                                 "--only-binary", ":all:", "--python-version", PY, "--platform",
                                 "manylinux2014_x86_64", "--implementation", "cp", "--abi", "cp311",
                                 "--abi", "none", "--abi", "abi3", "--platform", "any",
                                 "--ignore-requires-python", "--disable-pip-version-check", "-d", str(CACHE), spec],
                                capture_output=True, text=True)
            if cp.returncode != 0:
                raise AssertionError(f"pip download {spec} failed (the real-wheel tests need the package "
                                     f"index):\n{cp.stdout}\n{cp.stderr}")
    return CACHE
