"""The text of a change, for the suspects of a crash (`rewheel.suspects`): a reader of a file
change's (old, new) text between a snapshot and another or the live environment
(`change_texts`), and the files that differ between two environments' installs with a reader
of theirs (`env_change_texts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewheel.diff.results import FileChange
from rewheel.diff.sides import _read_bytes, _stored_bytes
from rewheel.environment import Distribution, Environment
from rewheel.errors import SnapshotError
from rewheel.snapshot import Manifest, SnapshotMeta
from rewheel.texts import TEXT_LIMIT, as_text, is_install_artifact, is_noise


def change_texts(old_snap: SnapshotMeta, new_snap: SnapshotMeta | None = None
                 ) -> Callable[[FileChange], tuple[str | None, str | None]]:
    """A reader of a file change's (old, new) text: the old side as `old_snap` holds it
    (verified against its hash), the new side from `new_snap` or the live file. A side is
    None when it is missing, binary, larger than TEXT_LIMIT or unreadable. Manifests are
    loaded once, on first use."""
    mans: dict[str, Manifest] = {}

    def stored(snap: SnapshotMeta, abs_path: str, sha: str | None) -> bytes | None:
        if snap.id not in mans:
            mans[snap.id] = Manifest.load(snap)
        data = _stored_bytes(snap, mans[snap.id], abs_path, sha)
        return data if isinstance(data, bytes) else None

    def texts(fc: FileChange) -> tuple[str | None, str | None]:
        if max(fc.old_size or 0, fc.new_size or 0) > TEXT_LIMIT:
            return None, None
        old = new = None
        try:
            if fc.change != "added":
                old = stored(old_snap, fc.abs_path, fc.old_sha256)
            if fc.change != "removed":
                if new_snap is None:
                    raw = _read_bytes(fc.abs_path, None)
                    new = raw if isinstance(raw, bytes) else None
                else:
                    new = stored(new_snap, fc.abs_path, fc.new_sha256)
        except (OSError, SnapshotError):
            return None, None
        return (as_text(old) if old is not None else None), (as_text(new) if new is not None else None)

    return texts


def env_change_texts(old_env: Environment, new_env: Environment
                     ) -> tuple[list[FileChange], Callable[[FileChange], tuple[str | None, str | None]]]:
    """The files that differ between two environments' installs of the same distributions
    (`rewheel ci`: the target environment, and the throwaway one its upgrade was built in),
    by their RECORDs — no file is read to find them — and a reader of each change's (old,
    new) text for the suspects of a crash. A file whose RECORD hash is the same on both sides
    is unchanged; paths are relative to their site-packages; `abs_path` is the new
    environment's file (the old one's for a removal)."""
    old = {d.name: d for d in old_env.distributions()}
    changes: list[FileChange] = []
    old_paths: dict[tuple[str | None, str], str] = {}  # (distribution, path) -> the old file

    def rows(d: Distribution) -> dict[str, Any]:
        site = str(d.site).rstrip("/") + "/"
        return {e.path[len(site):]: e for e in d.record if e.hash and e.path.startswith(site)}

    for d in new_env.distributions():
        o = old.get(d.name)
        new_rows, old_rows = rows(d), rows(o) if o is not None else {}
        for rel in sorted(new_rows.keys() | old_rows.keys()):
            if is_install_artifact(rel) or is_noise(rel):
                continue
            n, b = new_rows.get(rel), old_rows.get(rel)
            if n is not None and b is not None and n.hash == b.hash:
                continue
            change = "added" if b is None else "removed" if n is None else "changed"
            where = n.path if n is not None else b.path if b is not None else rel
            fc = FileChange(rel, where, change, d.name,
                            old_sha256=b.sha256_hex if b else None, new_sha256=n.sha256_hex if n else None,
                            old_size=b.size if b else None, new_size=n.size if n else None)
            if b is not None:
                old_paths[(d.name, rel)] = b.path
            changes.append(fc)

    def text_of(path: str | None) -> str | None:
        if path is None:
            return None
        raw = _read_bytes(path, None)
        return as_text(raw) if isinstance(raw, bytes) else None

    def texts(fc: FileChange) -> tuple[str | None, str | None]:
        if max(fc.old_size or 0, fc.new_size or 0) > TEXT_LIMIT:
            return None, None
        try:
            return (text_of(old_paths.get((fc.distribution, fc.path))),
                    text_of(fc.abs_path) if fc.change != "removed" else None)
        except OSError:
            return None, None

    return changes, texts
