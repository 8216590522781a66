"""The benchmark's measure of record: a real vLLM release upgraded to the next one, every
rewheel step timed as users run it — the `rewheel` command, start-up included — against
its floor on the same machine, side by side in one run.

The environments come from the default index through uv (the first run downloads about
8 GB; `.bench/real/` keeps the venv and uv's cache for the next). Per repetition:

  patches   on the pristine old release (0 patches expected: every reported file is a false
            one), then after editing two files (exactly those two expected), vs a bare
            lstat walk of the environment
  snapshot  of the old release with the two edits, vs `cp -al` (the first of its store: every
            hand-editable file is copied, see docs/snapshots.md)
  diff      `--json` and `--stat` against the snapshot after a plain upgrade, vs `cp -al`
  rollback  after a plain upgrade, and after a `reinstall = "all"` upgrade (`uv pip
            install --reinstall`: every distribution unpacked anew, same-version files
            included), each with `--no-undo` vs `uv pip sync` of the old set from the warm
            cache + sync(2); and the default rollback, which snapshots the upgraded state
            first (so that it can be undone), vs `cp -al` + that sync (informational);
            each rollback is checked byte-exact by hashing every file
  downtime  with a service up (devtools/bench/rollback_downtime.py): the default rollback
            of a recipe, its undo snapshot taken while the service serves, by its own
            `downtime` record, vs the same by hand: stop, `uv pip sync` + sync(2), start,
            first healthy answer (target <= 1x)

Timings are medians of `BENCH_REPS` repetitions (default 3 here). BENCH_REAL_SEED_CACHE names a
uv cache that already holds the releases (the acceptance run's): the first run hard-links it
instead of downloading them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devtools.bench.harness import (TARGETS, BenchConfig, Row, _median, first_differences, fingerprint,
                                    machine_info, render_rows, rm_tree, settle, stat_walk)
from rewheel.errors import RewheelError
from rewheel.installer import find_uv as uv_bin

DEFAULT_REAL_REPS = 3
# Two files of the story's patched set, edited as editors do (new file, then rename).
EDITED = ("vllm/model_executor/models/deepseek_v2.py", "vllm/model_executor/model_loader/weight_utils.py")
MARK = b"# local patch: keep attention on rank 4 alive\n"


class RealBench:
    """The cached real environment and the commands the bench runs on it."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.base = cfg.root / "real"
        self.venv = self.base / "venv"
        self.python = self.venv / "bin" / "python"
        self.home = self.base / "home"
        self.work = self.base / "scratch"
        self.old_txt = self.base / "old.txt"
        self.edited = list(cfg.real_edit or EDITED)
        self.uv_env = {k: v for k, v in os.environ.items()
                       if k not in ("VIRTUAL_ENV", "UV_LINK_MODE", "UV_COMPILE_BYTECODE", "UV_OFFLINE")}
        self.uv_env.update({"UV_CACHE_DIR": str(self.base / "uv-cache"), "UV_NO_PROGRESS": "1",
                            "UV_PYTHON_DOWNLOADS": "never"})
        self.cli_env = {**self.uv_env, "REWHEEL_HOME": str(self.home)}
        # The `rewheel` command of this interpreter's environment, as users run it.
        exe = Path(sys.executable).parent / "rewheel"
        self.rewheel = [str(exe)] if exe.exists() else [sys.executable, "-m", "rewheel"]

    # Commands ---------------------------------------------------------------------------
    def uv(self, *args: str) -> subprocess.CompletedProcess[str]:
        cp = subprocess.run([uv_bin(), *args], env=self.uv_env, capture_output=True, text=True)
        if cp.returncode != 0:
            raise RewheelError(f"`uv {shlex.join(args[:5])} ...` failed (exit {cp.returncode}): "
                               f"{(cp.stderr or cp.stdout).strip()[-2000:]}")
        return cp

    def install(self, spec: str, *extra: str, python: Path | None = None) -> float:
        t0 = time.perf_counter()
        self.uv("pip", "install", "-q", "--python", str(python or self.python), *self.cfg.real_uv_args, *extra, spec)
        return time.perf_counter() - t0

    def sync_old(self, *extra: str, python: Path | None = None) -> None:
        self.uv("pip", "sync", "-q", "--python", str(python or self.python), "--offline", *extra,
                *self.cfg.real_uv_args, str(self.old_txt))

    def cli(self, *args: str, ok: tuple[int, ...] = (0,), home: Path | None = None) -> tuple[float, dict[str, Any]]:
        """Run `rewheel ARGS --json` (REWHEEL_HOME: `home`, or the bench's), timed from the exec
        to the exit."""
        env = self.cli_env if home is None else {**self.cli_env, "REWHEEL_HOME": str(home)}
        settle()
        t0 = time.perf_counter()
        cp = subprocess.run([*self.rewheel, *args, "--json"], env=env, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
        dt = time.perf_counter() - t0
        if cp.returncode not in ok:
            raise RewheelError(f"`rewheel {shlex.join(args)}` exited {cp.returncode}: "
                               f"{(cp.stderr or cp.stdout).strip()[-2000:]}")
        return dt, (json.loads(cp.stdout) if cp.stdout.strip() else {})

    def timed_cmd(self, argv: list[str]) -> float:
        settle()
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        return time.perf_counter() - t0

    @property
    def site(self) -> Path:
        return next((self.venv / "lib").glob("python3*/site-packages"))

    def edit(self) -> list[str]:
        done = []
        for rel in self.edited:
            p = self.site / rel
            if not p.exists():
                raise RewheelError(f"{rel} is not in {self.cfg.real_old}: set BENCH_REAL_EDIT to two files it has")
            tmp = p.with_name(p.name + ".rewheel-bench-tmp")
            tmp.write_bytes(p.read_bytes() + MARK)
            os.chmod(tmp, stat.S_IMODE(p.stat().st_mode))
            os.replace(tmp, p)
            done.append(rel)
        return done

    # Preparation ------------------------------------------------------------------------
    def seed_cache(self) -> None:
        """BENCH_REAL_SEED_CACHE: a uv cache that holds the releases, hard-linked (`cp -al`)
        into the bench's own before its first install, which then downloads only index pages.
        The seed is only read: uv replaces a cache entry by a rename, never in place, and the
        bench prunes only its own copy."""
        seed = self.cfg.real_seed_cache
        cache = self.base / "uv-cache"
        if seed is None or cache.exists():
            return
        if not (seed / "CACHEDIR.TAG").is_file():
            raise RewheelError(f"BENCH_REAL_SEED_CACHE={seed} is not a uv cache (no CACHEDIR.TAG in it)")
        self.cfg.say(f"seeding {cache} from {seed} (hard links)")
        self.base.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + ".seeding")
        rm_tree(tmp)
        subprocess.run(["cp", "-al", str(seed), str(tmp)], check=True)
        os.replace(tmp, cache)

    def prepare(self) -> dict[str, Any]:
        need = self.cfg.real_disk_need
        free = shutil.disk_usage(self.cfg.root if self.cfg.root.exists() else self.cfg.root.parent).free
        if not (self.base / "stamp.json").exists() and free < need:
            raise RewheelError(f"the real benchmark needs about {need / 2**30:.1f} GiB free under {self.cfg.root}; "
                               f"{free / 2**30:.1f} GiB is free",
                               hint="free some disk, point BENCH_DIR (--dir) elsewhere, or set "
                                    "BENCH_REAL_DISK_GIB for releases smaller than vLLM's")
        self.seed_cache()
        stamp = self.base / "stamp.json"
        want = {"old": self.cfg.real_old, "new": self.cfg.real_new, "python": sys.executable,
                "uv_args": list(self.cfg.real_uv_args)}
        self.base.mkdir(parents=True, exist_ok=True)
        if not self.python.exists() or not stamp.exists() or json.loads(stamp.read_text()) != want:
            self.cfg.say(f"installing {self.cfg.real_old} into {self.venv} with uv (the first time downloads it)")
            rm_tree(self.venv)
            stamp.unlink(missing_ok=True)
            self.uv("venv", "-q", "--python", sys.executable, str(self.venv))
            self.install(self.cfg.real_old)
            self.old_txt.write_text(self.uv("pip", "freeze", "--python", str(self.python)).stdout)
            # Warm the cache with the new release, so no timed step downloads.
            self.install(self.cfg.real_new)
            self.sync_old()
            stamp.write_text(json.dumps(want))
        else:
            # A fresh install of the old set from the warm cache, whatever was done to the
            # environment since (a rollback over a force-reinstall leaves files newer than the
            # RECORD put back: correct, but no longer the pristine release the steps assume).
            self.cfg.say("reinstalling the old set from uv's cache (offline)")
            self.sync_old("--reinstall")
        old = [x for x in self.old_txt.read_text().splitlines() if x.strip()]
        return {"old": self.cfg.real_old, "new": self.cfg.real_new, "distributions": len(old)}


def run_real(cfg: BenchConfig) -> dict[str, Any]:
    t_start = time.perf_counter()
    rb = RealBench(cfg)
    desc = rb.prepare()
    t_prepared = time.perf_counter()
    py = str(rb.python)
    prefix = str(rb.venv)
    s: dict[str, list[float]] = {k: [] for k in (
        "patches", "patches_edited", "stat_walk", "cp_al", "snapshot", "diff_json", "diff_stat",
        "rollback", "uv_sync", "rollback_all", "uv_sync_all", "upgrade", "upgrade_all", "rollback_undo",
        "cp_al_uv_sync", "stat_walk_again", "snapshot_unchanged")}
    false_patches: list[int] = []
    edited_found: list[bool] = []
    exact: list[bool] = []
    info: dict[str, Any] = {}
    env_files = env_bytes = 0
    reps = cfg.reps
    def check_exact(what: str) -> None:
        """Every file hashed again: the rollback must have brought back `before` exactly."""
        after = fingerprint(prefix)
        exact.append(after == before)
        if after != before:
            cfg.say(f"  {what} NOT byte-exact: " + "; ".join(first_differences(before, after)))

    for rep in range(reps):
        cfg.say(f"repetition {rep + 1}/{reps}")
        rm_tree(rb.home)
        rm_tree(rb.work)
        rb.work.mkdir(parents=True)
        rb.sync_old()
        # patches on the pristine release: anything reported is a false patch.
        dt, doc = rb.cli("patches", "--python", py, "--offline")
        s["patches"].append(dt)
        false_patches.append(len(doc.get("patches", [])))
        if false_patches[-1]:
            cfg.say("  false patches: " + ", ".join(p["path"] for p in doc["patches"][:5]))
        settle()
        t0 = time.perf_counter()
        stat_walk(prefix)
        s["stat_walk"].append(time.perf_counter() - t0)
        # Two hand edits: exactly those must be found.
        edited = rb.edit()
        dt, doc = rb.cli("patches", "--python", py, "--offline")
        s["patches_edited"].append(dt)
        found = sorted(p["path"] for p in doc.get("patches", []))
        edited_found.append(found == sorted(edited))
        if found != sorted(edited):
            cfg.say(f"  after editing {edited}: patches reported {found[:6]}")
        before = fingerprint(prefix)
        env_files = sum(1 for v in before.values() if v[0] == "f")
        env_bytes = sum(v[2] for v in before.values() if v[0] == "f")
        s["cp_al"].append(rb.timed_cmd(["cp", "-al", prefix, str(rb.work / "cp-al")]))
        rm_tree(rb.work / "cp-al")
        dt, snap = rb.cli("snapshot", "--python", py, "--label", f"bench-{rep}")
        s["snapshot"].append(dt)
        sid = snap["id"]
        # The next snapshot, nothing changed since: what the store costs is what changed.
        settle()
        t0 = time.perf_counter()
        stat_walk(prefix)
        s["stat_walk_again"].append(time.perf_counter() - t0)
        dt, again = rb.cli("snapshot", "--python", py, "--label", f"bench-{rep}-again")
        s["snapshot_unchanged"].append(dt)
        info["snapshot_unchanged"] = {k: again.get(k) for k in ("files", "files_unchanged", "files_copied")}
        info["snapshot"] = {k: snap.get(k) for k in ("files", "files_linked", "files_copied", "bytes_copied",
                                                     "link_mode", "files_private", "bytes_private")}
        # A plain upgrade: the diff, then the rollback, then uv's way back.
        settle()
        s["upgrade"].append(rb.install(cfg.real_new))
        dt, d = rb.cli("diff", "--python", py, sid)
        s["diff_json"].append(dt)
        info["diff"] = {"packages": len(d.get("packages", [])), "files": len(d.get("files", [])),
                        "added_lines": sum(f.get("added_lines") or 0 for f in d.get("files", [])),
                        "removed_lines": sum(f.get("removed_lines") or 0 for f in d.get("files", []))}
        dt, _ = rb.cli("diff", "--python", py, sid, "--stat")
        s["diff_stat"].append(dt)
        for kind, extra, key in (("plain", (), "rollback"), ("reinstall-all", ("--reinstall",), "rollback_all")):
            if kind != "plain":
                settle()
                s["upgrade_all"].append(rb.install(cfg.real_new, *extra))
            # The restore as `uv pip sync` does it: no snapshot of the state it replaces.
            dt, doc = rb.cli("rollback", "--python", py, sid, "--yes", "--no-undo")
            s[key].append(dt)
            r = doc.get("restore", {})
            info[f"rollback_{kind}"] = {k: r.get(k) for k in ("written", "deleted", "proven_same", "unchanged",
                                                              "lanes", "seconds")}
            check_exact(f"{kind} rollback")
            if kind == "plain":
                # The default rollback snapshots the upgraded state first, so that it can be
                # undone; its cost is a snapshot's (the same for either upgrade: timed once).
                rb.install(cfg.real_new)
                settle()
                dt, doc = rb.cli("rollback", "--python", py, sid, "--yes")
                s["rollback_undo"].append(dt)
                r = doc.get("restore", {})
                info["rollback_undo"] = {"undo_snapshot_id": doc.get("undo_snapshot_id"),
                                         "steps": {x["name"]: x["seconds"] for x in doc.get("steps", [])},
                                         **{k: r.get(k) for k in ("written", "from_cache", "proven_same")}}
                check_exact("rollback with undo")
            # The baseline: the same upgrade again, then `uv pip sync` of the old set (warm cache).
            rb.install(cfg.real_new, *extra)
            settle()
            t0 = time.perf_counter()
            rb.sync_old()
            os.sync()
            s["uv_sync" if kind == "plain" else "uv_sync_all"].append(time.perf_counter() - t0)
            if kind == "plain":
                # By hand with an undo: a hard-link copy of the upgraded state, then the sync.
                s["cp_al_uv_sync"].append(s["cp_al"][-1] + s["uv_sync"][-1])
            if kind != "plain":
                # `--reinstall` implies `--refresh`: each one unpacks every wheel into uv's cache
                # anew (8 GB). Drop what no entry points at any more, or the disk fills up.
                rb.uv("cache", "prune")
            cfg.say(f"  {kind} rollback {s[key][-1]:.2f}s (written {r.get('written')}, proven "
                    f"{r.get('proven_same')}) vs uv sync {s['uv_sync' if kind == 'plain' else 'uv_sync_all'][-1]:.2f}s")
        cfg.say(f"  patches {s['patches'][-1]:.2f}s (stat walk {s['stat_walk'][-1]:.2f}s), snapshot "
                f"{s['snapshot'][-1]:.2f}s (cp -al {s['cp_al'][-1]:.2f}s), diff --json {s['diff_json'][-1]:.2f}s, "
                f"--stat {s['diff_stat'][-1]:.2f}s")
    rb.sync_old()

    def row(step: str, a: str, baseline: str, b: str, target: float | None, note: str = "") -> Row:
        return Row(step, _median(s[a]), baseline, _median(s[b]), target, note=note, samples=s[a],
                   baseline_samples=s[b])

    rows = [
        row("snapshot (the first, empty store)", "snapshot", "cp -al", "cp_al", TARGETS["snapshot"],
            f"{(info.get('snapshot') or {}).get('files_linked')} linked, "
            f"{(info.get('snapshot') or {}).get('files_copied')} copied, of them "
            f"{(info.get('snapshot') or {}).get('files_private')} hand-editable "
            f"({((info.get('snapshot') or {}).get('bytes_private') or 0) / 2**20:,.0f} MiB, never shared)"),
        row("snapshot (environment unchanged)", "snapshot_unchanged", "stat walk", "stat_walk_again",
            TARGETS["snapshot unchanged"],
            f"{(info.get('snapshot_unchanged') or {}).get('files_unchanged')} of "
            f"{(info.get('snapshot_unchanged') or {}).get('files')} files unchanged, "
            f"{(info.get('snapshot_unchanged') or {}).get('files_copied')} copied"),
        row("patches (pristine)", "patches", "stat walk", "stat_walk", TARGETS["patch scan"],
            f"false patches {max(false_patches, default=0)}"),
        row("patches (2 edited)", "patches_edited", "stat walk", "stat_walk", TARGETS["patch scan"],
            "exactly the edited files" if edited_found and all(edited_found) else "NOT exactly the edited files"),
        row("diff --json", "diff_json", "cp -al", "cp_al", TARGETS["diff"],
            ", ".join(f"{k} {v:,}" for k, v in (info.get("diff") or {}).items())),
        row("diff --stat", "diff_stat", "cp -al", "cp_al", TARGETS["diff"]),
        row("rollback (plain upgrade)", "rollback", "uv pip sync + sync", "uv_sync", TARGETS["rollback"],
            _rb_note(info.get("rollback_plain"), s["upgrade"])),
        row("rollback (reinstall all)", "rollback_all", "uv pip sync + sync", "uv_sync_all", TARGETS["rollback"],
            _rb_note(info.get("rollback_reinstall-all"), s["upgrade_all"])),
        row("rollback + undo snapshot (plain upgrade)", "rollback_undo", "cp -al + uv pip sync", "cp_al_uv_sync",
            TARGETS["rollback"], _undo_note(info.get("rollback_undo"))),
    ]
    from devtools.bench.rollback_downtime import bench_rollback_downtime

    trivial = bench_rollback_downtime(cfg, rb, imports=False)
    rows += trivial["rows"]
    served = bench_rollback_downtime(cfg, rb)
    rows += served["rows"]
    from devtools.bench.story import bench_story

    story = bench_story(cfg, rb)
    rows += story["rows"]
    from devtools.bench.startup import bench_startup

    startup: dict[str, Any] = {"startup": None}
    if "startup" not in cfg.skip:
        startup = bench_startup(cfg, python=rb.python, home=rb.home)
        rows += startup["rows"]
    from devtools.bench.downtime import run_real_downtime

    downtime: dict[str, Any] = {"downtime": None}
    if "downtime" not in cfg.skip:
        downtime = run_real_downtime(cfg)
        rows += downtime["rows"]
    board: dict[str, Any] | None = None
    if cfg.board_runs and "board" not in cfg.skip:
        from devtools.bench.board import board_row

        row, board = board_row(cfg)  # synthetic: a home of that many runs, not this environment's
        rows.append(row)
    result: dict[str, Any] = {
        "kind": "real", "environment": {**desc, "measured_files": env_files, "measured_bytes": env_bytes,
                                        "prefix": prefix},
        "reps": reps, "machine": machine_info(cfg.root), "rows": [r.to_json() for r in rows],
        "false_patches": false_patches, "edited_found_exactly": edited_found,
        "rollback": {"byte_exact": bool(exact) and all(exact)}, **info,
        "rollback_downtime": served["rollback_downtime"], "rollback_downtime_trivial": trivial["rollback_downtime"],
        "story": story["story"], "startup": startup["startup"],
        "downtime": downtime["downtime"], "board": board,
        "seconds": {"prepare": round(t_prepared - t_start, 1), "total": round(time.perf_counter() - t_start, 1)},
        "skipped": sorted(cfg.skip),
    }
    checks = [r["pass"] for r in result["rows"] if r["pass"] is not None]
    if board is not None:
        checks.append(board["pass"])
    checks += [result["rollback"]["byte_exact"], result["rollback_downtime"]["byte_exact"],
               result["rollback_downtime"]["undo_while_serving"], result["rollback_downtime_trivial"]["byte_exact"],
               result["story"]["byte_exact"], not any(false_patches),
               bool(edited_found) and all(edited_found)]
    result["all_pass"] = all(checks)
    rm_tree(rb.work)
    return result


def _undo_note(r: dict[str, Any] | None) -> str:
    if not r:
        return ""
    steps = ", ".join(f"{k} {v:.2f}s" for k, v in (r.get("steps") or {}).items())
    return (f"the default: the upgraded state snapshotted first; {steps}; written {r.get('written') or 0:,}, of "
            f"them {r.get('from_cache') or 0:,} the very inodes uv's cache held")


def _rb_note(r: dict[str, Any] | None, upgrades: list[float]) -> str:
    if not r:
        return ""
    return (f"written {r.get('written'):,}, proven identical {r.get('proven_same') or 0:,}, removed "
            f"{r.get('deleted'):,}, in {r.get('lanes')} lane(s); the upgrade took {_median(upgrades) or 0:.1f}s")


def render_real(result: dict[str, Any]) -> str:
    env = result["environment"]
    m = result["machine"]
    lines = [f"rewheel benchmarks — real: {env['old']} → {env['new']}, {env['distributions']} distributions, "
             f"{env['measured_files']:,} files, {env['measured_bytes'] / 2**30:.2f} GiB; the CLI timed end to end; "
             f"medians of {result['reps']}",
             f"machine: {m.get('nproc')} CPUs ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB RAM, "
             f"{m.get('filesystem', '?')} on {m.get('disk', m.get('device', '?'))}; {m.get('uv', '')}", ""]
    lines += render_rows(result["rows"])
    lines.append("")
    lines.append(f"false patches on the pristine release: {result['false_patches']}; exactly the two edited "
                 f"files found: {result['edited_found_exactly']}")
    lines.append(f"rollbacks byte-exact: {'PASS' if result['rollback']['byte_exact'] else 'FAIL'}")
    rd = result.get("rollback_downtime") or {}
    if rd:
        lines.append(f"rollback with the service up: byte-exact {'PASS' if rd['byte_exact'] else 'FAIL'}, undo "
                     f"snapshot taken while serving {'PASS' if rd['undo_while_serving'] else 'FAIL'}")
    if result.get("board"):
        from devtools.bench.board import board_line

        lines.append(board_line(result["board"]))
    for r in result["rows"]:
        if r["note"]:
            lines.append(f"  {r['step']}: {r['note']}")
    if result.get("skipped"):
        lines.append(f"sections left out (BENCH_SKIP): {', '.join(result['skipped'])}")
    lines.append(f"all targets: {'PASS' if result['all_pass'] else 'FAIL'}   "
                 f"(prepare {result['seconds']['prepare']}s, total {result['seconds']['total']}s)")
    return "\n".join(lines)
