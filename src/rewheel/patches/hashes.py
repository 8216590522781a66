"""The hashes and small reads a patch scan works with: a RECORD row's digest, a file's digest,
and the bytes of a file small enough to keep (`KEEP_LIMIT`).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from rewheel.environment import RecordEntry

# Patched files up to this size are kept in memory so they can be carried onto a new
# version after the reinstall has replaced them.
KEEP_LIMIT = 16 << 20


def _record_digest(entry: RecordEntry) -> tuple[str, str] | None:
    """(algorithm, hex digest) of a RECORD row; None when it carries no usable hash."""
    if not entry.hash or "=" not in entry.hash:
        return None
    algo, _, b64 = entry.hash.partition("=")
    if algo not in hashlib.algorithms_guaranteed or algo in ("md5", "sha1"):
        return None
    try:
        return algo, base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except (ValueError, TypeError):
        return None


def _digest_file(path: str, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_small(path: str | Path, limit: int = KEEP_LIMIT) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None
