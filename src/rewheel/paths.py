"""Where rewheel keeps its state: `$REWHEEL_HOME` (default `~/.local/state/rewheel`).

Layout, per environment (keyed by the prefix's real path):
  <home>/envs/<slug>-<hash>/{env.json, lock, snapshots/<id>/, runs/<id>/}
The home is created private to its owner (0700): snapshots hold copies of files that may
carry credentials or proprietary patches.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path


def state_home(override: str | os.PathLike[str] | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("REWHEEL_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "state" / "rewheel"


def ensure_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except PermissionError:
        pass
    return path


def env_key(prefix: Path) -> str:
    real = str(Path(prefix).resolve())
    slug = re.sub(r"[^A-Za-z0-9]+", "-", real).strip("-")[-40:] or "root"
    return f"{slug}-{hashlib.sha256(real.encode()).hexdigest()[:10]}"


def env_dir(home: Path, prefix: Path) -> Path:
    ensure_private_dir(home)
    d = home / "envs" / env_key(prefix)
    d.mkdir(parents=True, exist_ok=True)
    info = d / "env.json"
    if not info.exists():
        info.write_text(json.dumps({"prefix": str(Path(prefix).resolve())}) + "\n")
    return d


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o600) -> None:
    """Write a file so that a crash leaves either the old or the new content, durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
