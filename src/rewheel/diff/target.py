"""`rewheel diff TARGET [A] [B]` (`diff_target`): the snapshot references resolved and
`--package` checked against both sides; what is compared when no snapshot is named
(`default_base`).
"""

from __future__ import annotations

import difflib

from packaging.utils import canonicalize_name

from rewheel.diff.results import LIVE, DiffResult
from rewheel.diff.trees import diff_trees
from rewheel.environment import Environment
from rewheel.errors import SnapshotError, UsageError
from rewheel.snapshot import SnapshotMeta, Store
from rewheel.snapshot.tree import Progress


def diff_target(env: Environment, store: Store, a: str | None = None, b: str | None = None, *,
                package: str | None = None, path_glob: str | None = None,
                with_diffs: bool = False, progress: Progress | None = None) -> DiffResult:
    """`rewheel diff TARGET [A] [B]`: no A — the newest snapshot vs live; A — A vs live;
    A and B — A vs B. `live` may be given for either."""
    if a in (None, LIVE) and b not in (None, LIVE):
        raise UsageError("the live environment can only be the newer side: give `A live` or `A B`")
    if a is None or a == LIVE:
        metas = store.list()
        if not metas:
            raise SnapshotError(f"no snapshots exist for {env.prefix}: nothing to diff against",
                                hint="`rewheel snapshot TARGET` takes one")
        old = default_base(metas)
    else:
        old = store.get(a)
    new = None if b in (None, LIVE) else store.get(b)
    if package is not None:
        # A typo must not read as "nothing changed": the name has to exist on one side.
        wanted = canonicalize_name(package)
        names: set[str] = {canonicalize_name(str(d.get("name", ""))) for d in old.distributions}
        names |= ({canonicalize_name(str(d.get("name", ""))) for d in new.distributions} if new is not None
                  else {d.name for d in env.distributions()})
        if wanted not in names:
            close = difflib.get_close_matches(wanted, sorted(names), n=3)
            raise UsageError(f"--package {package}: no distribution of that name in either side of the diff",
                             hint=("did you mean " + ", ".join(close) + "?") if close
                             else "`rewheel history TARGET --json` lists each snapshot's versions")
    return diff_trees(env, old, new, package=package, path_glob=path_glob, with_diffs=with_diffs,
                      skip={str(store.home)}, progress=progress)



def default_base(metas: list[SnapshotMeta]) -> SnapshotMeta:
    """What `diff TARGET` compares with when no snapshot is named: the newest snapshot that is
    not a failed build (`failed-upgrade`, kept after a revert). After a revert the live
    environment is the pre-upgrade state again; compared with the failed build, everything
    would read "downgraded". Only failed builds: the failed build itself."""
    return next((m for m in metas if m.status != "failed-upgrade"), metas[0])
