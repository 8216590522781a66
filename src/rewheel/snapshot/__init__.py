"""Snapshots: the store, the manifest, taking one, and restoring one byte for byte.

A snapshot is `<envdir>/snapshots/<id>/` with `meta.json` (label, status, versions,
distributions), `manifest.json` (every file, folder and symlink under the environment's
roots with its mode, size, mtime, the inode a shared file has in common with the store and
— where known — sha256; stored by folder, as columns) and `tree/` (the contents).

Sharing: a file whose bytes provably equal what its wheel installed (RECORD hash known,
size equal, not modified since the install) is hard-linked into the tree (or reflinked,
or copied when the store is on another filesystem), and its hash is taken from RECORD, so
an 8 GB environment is captured without reading 8 GB — unless a person may edit it by
hand (`hand_editable`: sources, configs, scripts), which is never one inode with the
environment: reflinked, or copied (or linked to the previous snapshot's unchanged copy).
Every other file — hand-patched, unlisted, or of unknown provenance — is copied and
hashed while copying, so that editing it in place later cannot change the snapshot. A
restore copies hand-editable files back for the same reason.

Restore compares the live tree with the manifest folder by folder, checks every stored
file it will use and every manifest entry it acts on, and refuses a damaged snapshot
before anything changes; then it replaces what differs, syncs, and verifies every folder
it changed. A large restore runs in two lanes (this process and a forked one).

The package, by idea (each module imports only those above it):

- `tree`     — roots, the walk, the RECORD index, "provably pristine", kinds, hashing
- `store`    — `Store`, `SnapshotMeta` (`meta.json`), the aliases file
- `manifest` — `Folder`, `Manifest`, validation, `ManifestDamaged`
- `capture`  — `take_snapshot`, `estimate_snapshot`, linking, hashed and sparse copies
- `proof`    — same-bytes proof of a reinstalled file (RECORD rows, aliases)
- `lanes`    — the second restore lane: forked peer, pipes, messages
- `restore`  — `restore_snapshot`, `verify`, `remove_displaced`/`discard_displaced`, the damage checks
- `cleanup`  — `[cleanup]` stashing and unstashing, and what it may never touch
- `integrity` — `verify_snapshot`: stored bytes against the manifest (fast: stat; full: sha256)

This module re-exports the public API; other modules import from `rewheel.snapshot`.
"""

from __future__ import annotations

from rewheel.errors import RestoreError, SnapshotDamaged, SnapshotError
from rewheel.snapshot.capture import SnapshotResult, copy_hashed, estimate_snapshot, take_snapshot
from rewheel.snapshot.cleanup import (SYSTEM_FOLDERS, check_cleanup_entries, cleanup_glob_refusal, cleanup_matches,
                                      cleanup_refusal, pending_cleanup, stash_cleanup, unstash_cleanup)
from rewheel.snapshot.lanes import LANES_MIN_FILES, restore_lanes_setting
from rewheel.snapshot.manifest import MANIFEST_VERSION, Entry, Folder, Manifest, ManifestDamaged, match_roots
from rewheel.snapshot.restore import (PreparedRestore, RestoreResult, discard_displaced, prepare_restore,
                                      remove_displaced, restore_snapshot, verify)
from rewheel.snapshot.restore_checks import share_folders
from rewheel.snapshot.store import ALIASES, SnapshotMeta, Store
from rewheel.snapshot.integrity import (Damage, StoreVerify, VerifyResult, damaged_files, verify_snapshot,
                                        verify_store)
from rewheel.snapshot.tree import (STAGING_PREFIX, Progress, Root, exclusion, hand_editable, hash_file, kind_of,
                                   nested_prefix, provably_pristine, record_index, scope_of, walk)

__all__ = [
    "ALIASES", "LANES_MIN_FILES", "MANIFEST_VERSION", "STAGING_PREFIX", "SYSTEM_FOLDERS", "Entry", "Folder", "Manifest",
    "ManifestDamaged", "PreparedRestore", "Progress", "RestoreError", "RestoreResult", "Root", "SnapshotDamaged", "SnapshotError",
    "SnapshotMeta", "SnapshotResult", "Store", "check_cleanup_entries", "cleanup_glob_refusal", "cleanup_matches", "cleanup_refusal", "copy_hashed",
    "discard_displaced", "estimate_snapshot", "exclusion", "hand_editable", "hash_file", "kind_of", "match_roots", "nested_prefix",
    "pending_cleanup", "prepare_restore", "provably_pristine", "record_index", "remove_displaced", "restore_lanes_setting",
    "restore_snapshot", "scope_of", "share_folders", "stash_cleanup", "take_snapshot", "unstash_cleanup", "verify", "walk",
    "Damage", "StoreVerify", "VerifyResult", "damaged_files", "verify_snapshot", "verify_store",
]
