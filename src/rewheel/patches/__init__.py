"""Local patches: installed files whose bytes differ from what their wheel installed, what
a reinstall would throw away, and carrying them onto a new version.

Finding them is fast: a RECORD-listed file whose size equals the RECORD's and whose mtime
is older than its distribution's install time (RECORD is written last) is pristine without
being read; only the rest is hashed. What installers write at install time is understood,
not reported: byte-compiled caches, the `.dist-info` bookkeeping files (RECORD,
INSTALLER, REQUESTED, direct_url.json, uv_cache.json), and console-script wrappers, which
are regenerated with the interpreter's path in their shebang. Files inside a package's
folders that no RECORD lists are reported separately as `unlisted`.

A patch is a file whose bytes match *no* owner's RECORD and differ from the bytes its wheel
actually ships. A path several distributions list (a split or renamed package and its old
metapackage, a helper module several wheels ship) holds the bytes of whichever was
installed later: it is pristine when it matches any owner's RECORD (the fast path per
owner, then the hash). A wheel whose own RECORD disagrees with the bytes it ships leaves a
file that matches no RECORD: before a mismatch is called a patch it is compared with the
wheel's bytes (uv's cache, else the index); a file equal to them is reported apart as
`record_inconsistent`, never as a patch, and never reapplied.

The pristine content a patch is diffed against comes, in this order, from a snapshot that
holds the file with the RECORD's hash, from uv's cache (uv unpacks each wheel under
`<cache>/archive-v0/<id>/`), or from the wheel fetched again from the index by uv. Every
candidate is checked against the RECORD hash before it is used.

uv installs by hard-linking files from its cache: a patch written in place into such a
file also changed uv's cached copy, and the next "clean" reinstall would link the patched
bytes back while RECORD claims they are pristine. Such patches are flagged
(`shares_uv_cache_inode`); `clean_uv_cache_for` drops those cache entries so the run
reinstalls them from fresh bytes.

The package's modules, one concern each; callers use the names re-exported here
(`patches.scan`, `patches.reapply`, …):

| module | owns |
|---|---|
| `results` | `Patch`, `PatchScan` and their JSON; the policies the run cycle reads off a scan (`hazard_packages`, `patched_distributions`) |
| `scanning` | `scan` (the RECORD index, the listed files checked, the patches and unlisted files named) and `scan_target` |
| `pristine` | the cross-check of a mismatch against the bytes its wheel ships, the pristine copy each diff is made against, `flag_snapshot_sharing` |
| `uvcache` | `UvCache` (uv's unpacked wheels), an unpacked wheel's RECORD rows, `clean_uv_cache_for` |
| `sources` | `Fetcher` and `UvIndexFetcher` (the index, through uv); snapshots as a pristine source |
| `hashes` | RECORD digests, file digests, the small reads a patch keeps (`KEEP_LIMIT`) |
| `carry` | `save_patches`, `patch_text`; `reapply` (the three-way merge onto the new version) and `ReapplyResult` |

A name is read in the module that defines or imports it: a test that replaces one patches
that module (`rewheel.patches.carry.fsync_dir`), not this package.
"""

from rewheel.patches.carry import ReapplyResult, patch_text, reapply, reapply_failed, save_patches
from rewheel.patches.hashes import KEEP_LIMIT
from rewheel.patches.pristine import flag_snapshot_sharing
from rewheel.patches.results import Patch, PatchScan, hazard_packages, patched_distributions
from rewheel.patches.scanning import scan, scan_target
from rewheel.patches.sources import Fetcher, UvIndexFetcher
from rewheel.patches.uvcache import UvCache, clean_uv_cache_for

__all__ = [
    "KEEP_LIMIT",
    "Fetcher",
    "Patch",
    "PatchScan",
    "ReapplyResult",
    "UvCache",
    "UvIndexFetcher",
    "clean_uv_cache_for",
    "flag_snapshot_sharing",
    "hazard_packages",
    "patch_text",
    "patched_distributions",
    "reapply",
    "reapply_failed",
    "save_patches",
    "scan",
    "scan_target",
]
