"""`make acceptance`: the story's recipe shape on a real vLLM environment from the package index.

Not part of the test suite (its first run downloads about 12 GB; `.bench/acceptance/` keeps the
environment and uv's cache for the next). An environment of `vllm==OLD` (default 0.32.0) is
built once; then, for each of the four ways the story's recipe can be written — staged or not,
`reinstall = "named"` or `"all"`, `packages = ["vllm"]` unpinned — it checks what users rely on:

  plan      `rewheel run --dry-run --json` plans the vllm that `uv pip install -U vllm` picks
            against the same environment (asked of uv directly)
  run       `rewheel run --yes --json` installs exactly that plan (every version the plan
            names is the installed one), passes its smoke test (`import vllm` on the CPU),
            and says `upgraded`; staged, nothing is fetched after the stop
  rollback  `rewheel rollback --yes --json` puts back the same `uv pip freeze`, and every
            file of the environment hashes as before the run

It prints one line per check and a verdict, writes `result.json` beside the environment, and
exits 1 when any check fails. Settings: ACCEPT_OLD (the starting release spec, default
`vllm==0.32.0`), ACCEPT_DIR (default `.bench/acceptance`), ACCEPT_CASES (e.g. `staged-named`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devtools import REPO, sha256_file
from rewheel.installer import find_uv

CASES = {"staged-named": (True, "named"), "unstaged-named": (False, "named"),
         "staged-all": (True, "all"), "unstaged-all": (False, "all")}


class Acceptance:
    def __init__(self) -> None:
        self.old = os.environ.get("ACCEPT_OLD", "vllm==0.32.0")
        self.root = Path(os.environ.get("ACCEPT_DIR", REPO / ".bench" / "acceptance")).absolute()
        self.venv = self.root / "base"
        self.python = self.venv / "bin" / "python"
        self.home = self.root / "home"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("VIRTUAL_ENV", "UV_LINK_MODE", "UV_OFFLINE", "UV_COMPILE_BYTECODE")}
        self.env.update({"UV_CACHE_DIR": str(self.root / "uv-cache"), "UV_NO_PROGRESS": "1",
                         "UV_PYTHON_DOWNLOADS": "never", "REWHEEL_HOME": str(self.home)})
        exe = Path(sys.executable).parent / "rewheel"
        self.rewheel = [str(exe)] if exe.exists() else [sys.executable, "-m", "rewheel"]
        self.lines: list[str] = []
        self.failed = 0

    # -- plumbing -----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def check(self, ok: bool, what: str) -> bool:
        self.say(f"  {'PASS' if ok else 'FAIL'}  {what}")
        self.failed += not ok
        return ok

    def uv(self, *args: str) -> str:
        cp = subprocess.run([find_uv(), *args], env=self.env, capture_output=True, text=True)
        if cp.returncode != 0:
            raise SystemExit(f"uv {' '.join(args[:4])} … failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
        return cp.stdout + cp.stderr

    def cli(self, *args: str) -> tuple[int, dict[str, Any], float, str]:
        t0 = time.monotonic()
        cp = subprocess.run([*self.rewheel, *args, "--json"], env=self.env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, cwd=self.root)
        try:
            doc = json.loads(cp.stdout) if cp.stdout.strip() else {}
        except ValueError:
            doc = {}
        return cp.returncode, doc, time.monotonic() - t0, cp.stderr

    def freeze(self) -> list[str]:
        return sorted(x for x in self.uv("pip", "freeze", "--python", str(self.python)).splitlines() if x.strip())

    def hashes(self) -> dict[str, str]:
        """Every file, symlink and folder under the environment, by content (byte-compiled
        caches left out: a restore may rebuild them)."""
        out: dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(self.venv):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                p = Path(dirpath, name)
                rel = str(p.relative_to(self.venv))
                if p.is_symlink():
                    out[rel] = "-> " + os.readlink(p)
                    continue
                out[rel] = f"{sha256_file(p)} {oct(p.stat().st_mode & 0o7777)}"
        return out

    # -- the environment ----------------------------------------------------------------------
    def prepare(self) -> None:
        stamp = self.root / "stamp.json"
        want = {"old": self.old, "python": sys.executable}
        if self.python.exists() and stamp.exists() and json.loads(stamp.read_text()) == want:
            return
        self.say(f"building {self.venv} with {self.old} (the first run downloads it)")
        shutil.rmtree(self.venv, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.uv("venv", "-q", "--python", sys.executable, str(self.venv))
        self.uv("pip", "install", "-q", "--python", str(self.python), self.old)
        (self.root / "old.txt").write_text("\n".join(self.freeze()) + "\n")
        stamp.write_text(json.dumps(want))

    def reset(self) -> None:
        """The old set again, exactly (a case that failed midway must not taint the next)."""
        if self.freeze() != sorted(x for x in (self.root / "old.txt").read_text().splitlines() if x.strip()):
            self.uv("pip", "sync", "-q", "--python", str(self.python), "--reinstall", str(self.root / "old.txt"))

    def uv_pick(self) -> str | None:
        """The vllm `uv pip install -U vllm` picks against the environment (its dry run)."""
        out = self.uv("pip", "install", "--dry-run", "-U", "--python", str(self.python), "vllm")
        for line in out.splitlines():
            if line.strip().startswith("+ vllm=="):
                return line.strip().split("==", 1)[1]
        return None

    def recipe(self, case: str, staged: bool, reinstall: str) -> Path:
        path = self.root / f"{case}.toml"
        path.write_text(f'''name = "acceptance-{case}"

[environment]
python = "{self.python}"

[install]
packages = ["vllm"]
staged = {str(staged).lower()}
reinstall = "{reinstall}"

[smoke]
command = ["{{python}}", "-c", "import vllm, sys; print('vllm', vllm.__version__, 'imported on the CPU'); sys.exit(0)"]
timeout_s = 900
gpus = 0
''')
        return path

    # -- one case ------------------------------------------------------------------------------
    def case(self, case: str, staged: bool, reinstall: str) -> dict[str, Any]:
        self.say(f"== {case}: packages = [\"vllm\"], staged = {str(staged).lower()}, reinstall = \"{reinstall}\"")
        self.reset()
        old_freeze = self.freeze()
        before = self.hashes()
        picked = self.uv_pick()
        recipe = self.recipe(case, staged, reinstall)
        row: dict[str, Any] = {"case": case, "uv_picks": picked}

        rc, plan_doc, secs, err = self.cli("run", str(recipe), "--dry-run")
        changes = {c["name"]: c for c in (plan_doc.get("plan") or {}).get("changes", [])}
        planned = (changes.get("vllm") or {}).get("new")
        row.update(plan_rc=rc, planned_vllm=planned, plan_seconds=round(secs, 1),
                   held_back=(plan_doc.get("plan") or {}).get("held_back"))
        self.check(rc == 0 and planned is not None and planned == picked,
                   f"plan: vllm {(changes.get('vllm') or {}).get('old')} → {planned}; uv pip install -U picks "
                   f"{picked} ({secs:.1f}s){'' if rc == 0 else f' exit {rc}: {err.strip()[-400:]}'}")

        rc, run_doc, secs, err = self.cli("run", str(recipe), "--yes")
        after = run_doc.get("after") or {}
        row.update(run_rc=rc, status=run_doc.get("status"), run_seconds=round(secs, 1),
                   downtime=(run_doc.get("downtime") or {}).get("seconds"),
                   fetched_after_stop=run_doc.get("fetched_after_stop"))
        self.check(rc == 0 and run_doc.get("status") == "upgraded",
                   f"run: exit {rc}, status {run_doc.get('status')} in {secs:.1f}s"
                   + ("" if rc == 0 else f": {err.strip()[-600:]}"))
        wrong = [f"{n} planned {c['new']} installed {after.get(n)}" for n, c in changes.items()
                 if c.get("new") and after.get(n) != c["new"]]
        self.check(not wrong and after.get("vllm") == picked,
                   f"installed = plan: vllm {after.get('vllm')}, {len(changes)} planned change(s)"
                   + (f"; differ: {'; '.join(wrong[:5])}" if wrong else ""))
        smoke = next((s for s in run_doc.get("steps", []) if s.get("name") == "smoke"), None)
        self.check(bool(smoke and smoke.get("ok")), f"smoke (import vllm on the CPU): "
                   f"{'passed' if smoke and smoke.get('ok') else 'did not pass'}"
                   + (f" in {smoke['seconds']:.1f}s" if smoke else ""))
        fetched = run_doc.get("fetched_after_stop") or []
        if staged:
            self.check(not fetched, "nothing fetched after the stop: " + (", ".join(fetched) or "none"))
        else:
            self.say(f"  info  the unstaged cycle installs in the window: {len(fetched)} wheel(s) fetched after the stop")

        rc, rb_doc, secs, err = self.cli("rollback", str(recipe), "--yes")
        row.update(rollback_rc=rc, rollback_seconds=round(secs, 1))
        same_freeze = self.freeze() == old_freeze
        now = self.hashes()
        diff = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        self.check(rc == 0 and same_freeze and not diff,
                   f"rollback: exit {rc} in {secs:.1f}s; freeze {'identical' if same_freeze else 'DIFFERS'}; "
                   f"{len(before):,} files {'byte-identical' if not diff else f'— {len(diff)} differ'}"
                   + ("" if rc == 0 else f": {err.strip()[-400:]}"))
        row["rollback_exact"] = same_freeze and not diff
        # The snapshots of this case (the rollback's undo snapshot holds a whole upgraded
        # environment) are not the next case's: the disk stays bounded.
        shutil.rmtree(self.home, ignore_errors=True)
        return row


def main() -> int:
    a = Acceptance()
    t0 = time.monotonic()
    a.prepare()
    only = [c for c in os.environ.get("ACCEPT_CASES", "").split(",") if c.strip()]
    rows = [a.case(name, *spec) for name, spec in CASES.items() if not only or name in only]
    a.say(f"{'ALL PASS' if not a.failed else f'{a.failed} FAILED'} — {len(rows)} case(s) in "
          f"{time.monotonic() - t0:.0f}s on {a.old} ({len(a.freeze())} distributions)")
    (a.root / "result.json").write_text(json.dumps({"rows": rows, "lines": a.lines,
                                                    "date": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    return 1 if a.failed else 0


if __name__ == "__main__":
    sys.exit(main())
