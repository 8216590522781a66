"""Tools that build, stage and measure rewheel, but are not rewheel: the demo (`python -m
devtools.demo`), the benchmarks (`python -m devtools.bench`), the benchmarks' log generator, the
local package index and the wheel builder the demo, the benchmarks and the tests share.

None of it ships in the rewheel wheel (pyproject packages only `src/rewheel`). Run it from the
repository root: `python -m` puts the working directory on sys.path, and child processes get
`REPO` on PYTHONPATH next to `REPO/src`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# The repository root: where `.demo/`, `.bench/` and `recipes/` live.
REPO: Path = Path(__file__).resolve().parents[1]


def sha256_file(path: str | Path) -> str:
    """A file's sha256, read in 1 MiB blocks: the tools' own witness of what a restore left,
    independent of rewheel's hashing."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
