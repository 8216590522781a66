"""What changed between two states of an environment: package versions and installed files.

A state is a snapshot (its `meta.json` distributions and `manifest.json` entries) or the
live environment. Package changes are classified (upgraded, downgraded, added, removed,
reinstalled with different bytes) and annotated with what nightly versions encode: the
dev-build distance, the git shas and a compare link (see `rewheel.versions`).

File changes come from hashes that are already known, never from re-reading unchanged
files: the manifest holds a sha256 for every captured file; a live file whose size and
mtime equal the manifest's is unchanged; a live file that its RECORD proves pristine
(same size, not modified since its distribution was installed) has the RECORD's hash.
Only the rest is hashed — so diffing an 8 GB vLLM environment against its snapshot reads
the handful of files that were touched by hand, plus the contents of changed text files
when line counts or unified diffs are asked for.

Line counts take linear time (`rewheel.texts.count_changed_lines`: a multiset difference of
the two versions' lines); unified diffs, which difflib builds in quadratic time at worst, are
built only for the files shown (`with_diffs`), and their counts are those of the diff shown.

A large diff shares its work with a second process (`rewheel.halves`): the live environment
is walked there while this one loads the snapshot's manifest and reads the RECORDs, then
each reads and counts half the changed files.

Byte-compiled caches (`__pycache__`, `.pyc`) and `.dist-info` folders (metadata and the
installer's bookkeeping: RECORD, INSTALLER, uv_cache.json, ...) are not source and are left
out of file diffs; the package table covers them.

The package's modules, one concern each; callers use the names re-exported here
(`diff.diff_trees`, `diff.diff_versions`, …):

| module | owns |
|---|---|
| `packages` | `PackageChange` and `diff_versions`: package versions between two states |
| `results` | `FileChange`, `DiffResult` and their JSON, `LIVE`; `display_path` (a path as users name it) |
| `owners` | which distribution a path belongs to, from live or stored RECORDs; the live RECORD rows by path |
| `sides` | each side's files (a manifest's items, the live walk and its hashes), the comparison, each side's bytes read once (`BINARY`) |
| `trees` | `diff_trees`, the line counts and unified diffs, the work shared with a second process (`SPLIT_MIN_FILES`, `SPLIT_WAIT_MIN_S`, `WALK_SHARE_MIN_FILES`) |
| `target` | `diff_target` (`rewheel diff TARGET [A] [B]`) and `default_base` |
| `suspect_texts` | `change_texts` and `env_change_texts`: the text of each change, for the suspects of a crash |

A name is read in the module that defines or imports it: a test that replaces one (the
thresholds, `_walk_live`, `_fill_text`) patches that module (`rewheel.diff.trees`), not this
package.
"""

from rewheel.diff.packages import PackageChange, diff_versions
from rewheel.diff.results import LIVE, DiffResult, FileChange, display_path
from rewheel.diff.sides import BINARY, LiveWalk
from rewheel.diff.suspect_texts import change_texts, env_change_texts
from rewheel.diff.target import default_base, diff_target
from rewheel.diff.trees import SPLIT_MIN_FILES, SPLIT_WAIT_MIN_S, WALK_SHARE_MIN_FILES, diff_trees

# The text helpers the board and the tests have read through this module (`rewheel.texts`'s).
from rewheel.texts import count_changed_lines, count_lines, unified_diff

__all__ = [
    "BINARY",
    "LIVE",
    "SPLIT_MIN_FILES",
    "SPLIT_WAIT_MIN_S",
    "WALK_SHARE_MIN_FILES",
    "DiffResult",
    "FileChange",
    "LiveWalk",
    "PackageChange",
    "change_texts",
    "count_changed_lines",
    "count_lines",
    "default_base",
    "diff_target",
    "diff_trees",
    "diff_versions",
    "display_path",
    "env_change_texts",
    "unified_diff",
]
