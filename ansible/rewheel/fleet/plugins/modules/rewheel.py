#!/usr/bin/python
# Copyright: rewheel contributors
# Apache License 2.0 (see the repository's pyproject.toml)
"""The `rewheel.fleet.rewheel` module: runs on the host and drives the host's own `rewheel`
command through its JSON interface (`--json --yes`); it never imports rewheel, so the module
works with whatever Python Ansible runs modules with, and rewheel lives in its own uv tool
environment."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rewheel
short_description: Upgrade, roll back, snapshot or inspect a GPU service's Python environment with rewheel
description:
  - Runs the C(rewheel) command on the host with C(--json --yes) and reports its answer.
  - C(state=upgraded) runs the recipe's whole cycle (stop, snapshot, reinstall, diff, smoke test,
    start and health check), installing exactly O(lock) when given (a PEP 751 lock, e.g. one
    C(rewheel ci --promote) wrote), else the newest build the recipe's indexes offer.
    A dry run (C(rewheel run --dry-run)) decides first whether anything would change version;
    a host already there is left alone and reports C(changed=false).
  - When the new build fails its checks, rewheel restores the snapshot and restarts the old
    service; the task then fails with the root cause as its message and rewheel's whole report
    in RV(report).
  - C(state=rolled_back) restores a snapshot (default, the newest one taken before an upgrade);
    C(state=snapshot) takes one; C(state=status) reports where the environment stands.
  - Check mode runs C(rewheel run --dry-run) (or C(rewheel status)) and changes nothing.
version_added: "0.1.0"
author:
  - rewheel contributors
options:
  state:
    description:
      - C(upgraded) runs the upgrade cycle (O(recipe) required).
      - C(rolled_back) restores a snapshot; C(snapshot) takes one; C(status) changes nothing.
    type: str
    required: true
    choices: [upgraded, rolled_back, snapshot, status]
  recipe:
    description:
      - Path on the host of the recipe (TOML) that describes the environment and its service.
      - Required with C(state=upgraded); with the other states give O(recipe) or O(python).
      - Given a recipe, C(rolled_back) stops and starts the service around the restore.
    type: path
  python:
    description:
      - Interpreter of the environment, instead of a recipe (C(rolled_back), C(snapshot), C(status)).
    type: path
  lock:
    description:
      - Path on the host of a PEP 751 lock to install exactly (C(rewheel run --lock)).
      - Copy the same file to every host so that every host gets the same build.
    type: path
  snapshot:
    description:
      - With C(state=rolled_back), the snapshot to restore (id, unique prefix or exact label).
      - Default, the newest snapshot taken before an upgrade.
    type: str
  force:
    description:
      - With C(state=rolled_back), restore a snapshot of a failed build (C(rewheel rollback --force)).
    type: bool
    default: false
  label:
    description:
      - With C(state=snapshot), the snapshot's label. A host whose environment already equals
        a snapshot with this label is left alone (C(changed=false)).
    type: str
  home:
    description:
      - rewheel's state folder on the host (C(REWHEEL_HOME)); default, rewheel's own
        (C(~/.local/state/rewheel)).
    type: path
  executable:
    description:
      - The C(rewheel) command on the host; a bare name is looked up on C(PATH) and in
        C(~/.local/bin) (where C(uv tool install) puts it).
      - It must be rewheel 0.1.0 or later (C(rewheel --version)); an older one is refused
        before anything runs.
    type: str
    default: rewheel
  runs_dir:
    description:
      - Where the module keeps, on the host, the record of the run it started detached (one per
        recipe, with its pid, the lock and the files its answer goes to), so that a later play
        reattaches to a run whose controller went away instead of starting another.
    type: path
    default: ~/.cache/rewheel-fleet/runs
notes:
  - Always passes C(--yes), as there is no terminal to ask on.
  - With C(state=upgraded), C(rewheel run) runs detached from the SSH session (a session of its
    own, its output into files under O(runs_dir)); the module waits for it. When the connection
    drops, the run goes on by itself to its end (kept or reverted, the service up); the next
    play's task on that host reattaches to it, waits if it still runs, and reports its outcome
    (checked against rewheel's journal, RV(reattached)) instead of starting another. A run
    that was killed is reported as interrupted, never resumed.
  - A host whose environment already has the versions the dry run plans (only same-version
    reinstalls left) counts as upgraded; run C(rewheel run) by hand to force a reinstall.
  - In check mode C(rolled_back) predicts a change unless the environment already equals the
    snapshot the rollback would restore (O(snapshot), else the newest taken before an upgrade).
requirements:
  - rewheel on the host (the collection's C(rewheel.fleet.install) role installs it)
"""

EXAMPLES = r"""
- name: Upgrade to the qualified lock (fails with the root cause if rewheel reverted)
  rewheel.fleet.rewheel:
    state: upgraded
    recipe: /etc/rewheel/vllm-kimi-k25.toml
    lock: /var/lib/rewheel/pylock.vllm-kimi-k25.toml
  register: upgrade

- name: Roll back to the snapshot taken before the last upgrade
  rewheel.fleet.rewheel:
    state: rolled_back
    recipe: /etc/rewheel/vllm-kimi-k25.toml

- name: Take a labelled snapshot (once)
  rewheel.fleet.rewheel:
    state: snapshot
    python: /root/ml-env/bin/python
    label: before-maintenance

- name: Where the environment stands
  rewheel.fleet.rewheel:
    state: status
    recipe: /etc/rewheel/vllm-kimi-k25.toml
  register: st
"""

RETURN = r"""
status:
  description:
    - The outcome. C(upgraded), C(reverted), C(failed) (not restored, a person must act),
      C(rejected) (the prepared build failed its pre-check; nothing was stopped),
      C(planned) (check mode, a change is pending), C(current) (nothing to upgrade),
      C(restored), C(snapshot), C(status).
  returned: always
  type: str
  sample: upgraded
report:
  description:
    - rewheel's own JSON document (C(rewheel run --json), C(rollback --json), C(snapshot --json),
      C(status --json)); for C(current) and C(planned), the dry run's report.
    - The rollout's summary (C(rewheel fleet-report)) reads these.
  returned: when rewheel answered
  type: dict
root_cause:
  description: The root cause rewheel named (exception type, message, rank, deepest frame), or null.
  returned: when rewheel answered
  type: dict
before:
  description: Versions by distribution before the command.
  returned: with state=upgraded
  type: dict
after:
  description: Versions by distribution after the command (or planned, in check mode).
  returned: with state=upgraded
  type: dict
pending:
  description: The version changes the dry run planned (name, old, new, change).
  returned: with state=upgraded
  type: list
  elements: dict
cmd:
  description: The rewheel command line that made the report.
  returned: when rewheel ran
  type: list
  elements: str
reattached:
  description:
    - With C(state=upgraded), true when the outcome is that of a run an earlier task started
      (its controller went away before it ended), read back instead of starting another.
  returned: with state=upgraded
  type: bool
run_id:
  description: The id of the run in rewheel's journal (C(rewheel history)).
  returned: with state=upgraded, when a run began
  type: str
rc:
  description: rewheel's exit code (0 done, 1 reverted, 2 bad usage, 3 a person must act, 4 busy, 5 internal error).
  returned: when rewheel ran
  type: int
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.compat.version import LooseVersion
from ansible_collections.rewheel.fleet.plugins.module_utils.detached import (DetachedRuns, alive, sha256_of,
                                                                              started_at)

EXIT_OK = 0  # rewheel's exit code for "done and verified"
EXIT_REVERTED = 1  # verification failed; restored and verified
EXIT_USAGE = 2  # bad usage or recipe, nothing changed
EXIT_UNRESTORED = 3  # a person must act
EXIT_BUSY = 4  # another run holds the environment, or an interrupted one must be resumed first
KEPT = ("upgraded", "reinstalled", "unchanged")  # run statuses of a build that was kept
ONLY_WITH = {"lock": "upgraded", "snapshot": "rolled_back", "force": "rolled_back", "label": "snapshot"}
# The oldest rewheel this module drives: its `--version`, `run --json` report and `history --json`
# runs (id, kind, status, started) are what the module reads.
MIN_REWHEEL = "0.1.0"


def _cause(report):
    """`ValueError: message (Worker_TP4) at vllm/x.py:998 in __init__`, or None."""
    diag = report.get("diagnosis") or {}
    if isinstance(diag, dict) and diag.get("summary") and report.get("root_cause"):
        return diag["summary"]
    rc = report.get("root_cause")
    if not isinstance(rc, dict):
        return None
    text = "%s: %s" % (rc.get("type"), (rc.get("message") or "").split("\n")[0]) if rc.get("type") \
        else (rc.get("message") or "").split("\n")[0]
    if rc.get("rank"):
        text += " (%s)" % rc["rank"]
    frame = rc.get("frame")
    if isinstance(frame, dict) and frame.get("file"):
        text += " at %s:%s" % (frame["file"], frame.get("line"))
    return text


def _refusal(error, message, hint, exit_code):
    """A document shaped like rewheel's own error answer (`rewheel fleet-report` reads it)."""
    return {"error": error, "message": message, "hint": hint, "exit_code": exit_code}


class Rewheel(object):
    def __init__(self, module):
        self.module = module
        p = module.params
        exe = p["executable"]
        if os.sep not in exe:
            exe = module.get_bin_path(exe, required=False, opt_dirs=[os.path.expanduser("~/.local/bin")])
            if exe is None:
                module.fail_json(msg="rewheel is not installed on this host (no %r on PATH or in ~/.local/bin)"
                                     % p["executable"],
                                 hint="install it with the rewheel.fleet.install role, or give executable=PATH")
        elif not os.access(exe, os.X_OK):
            module.fail_json(msg="rewheel is not installed on this host (%s is not an executable)%s"
                                 % (exe, "; check mode needs it installed first (the rewheel_install tag)"
                                    if module.check_mode else ""))
        self.exe = exe
        self.env = {"REWHEEL_HOME": p["home"]} if p["home"] else {}
        self.check_version()

    def check_version(self):
        """Refuse a rewheel older than this collection drives, before anything runs."""
        argv = [self.exe, "--version"]
        rc, out, err = self.module.run_command(argv, environ_update=self.env, check_rc=False)
        words = out.split()
        found = words[1] if rc == EXIT_OK and len(words) == 2 and words[0] == "rewheel" else None
        try:
            older = found is None or LooseVersion(found) < LooseVersion(MIN_REWHEEL)
        except (TypeError, ValueError):  # a version LooseVersion cannot order: not one we know
            older = True
        if older:
            said = "rewheel %s" % found if found else "a rewheel that does not say its version " \
                "(`rewheel --version` exited %d: %s)" % (rc, (err or out).strip()[-200:])
            msg = "%s at %s is older than this collection supports (rewheel >= %s)" % (said, self.exe, MIN_REWHEEL)
            hint = "install rewheel %s or later on the host (the rewheel.fleet.install role, from a current " \
                   "wheel); nothing was run" % MIN_REWHEEL
            self.module.fail_json(msg="%s (hint: %s)" % (msg, hint), changed=False, status="error", cmd=argv, rc=rc,
                                  report=_refusal("UnsupportedRewheel", msg, hint, EXIT_USAGE), root_cause=None)
        self.version = found

    def call(self, *args):
        """(rc, JSON document, argv, stderr) of `rewheel ARGS --json`."""
        argv = [self.exe] + list(args) + ["--json"]
        rc, out, err = self.module.run_command(argv, environ_update=self.env, check_rc=False)
        try:
            doc = json.loads(out) if out.strip() else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            self.module.fail_json(msg="rewheel gave no JSON answer (exit %d): %s" % (rc, (err or out).strip()[-2000:]),
                                  cmd=argv, rc=rc, stderr=err)
        return rc, doc, argv, err

    def target(self):
        p = self.module.params
        return [p["recipe"]] if p["recipe"] else ["--python", p["python"]]

    def refused(self, rc, doc, argv, err, **extra):
        """A command that did not run its course (exit 2, 3, 4, 5): rewheel's message and hint,
        and its exit code (3: a person must act on the host)."""
        msg = doc.get("message") or "rewheel exited %d" % rc
        if doc.get("hint"):
            msg += " (hint: %s)" % doc["hint"]
        msg += " [rewheel exit %d%s]" % (rc, ": a person must act" if rc == 3 else "")
        extra.setdefault("changed", False)
        extra.setdefault("status", "error")
        self.module.fail_json(msg=msg, report=doc, rc=rc, cmd=argv, stderr=err, **extra)


def _outcome(rw, module, rc, report, argv, err, **common):
    """Hand a run's report to the controller: ok when upgraded, else failed with the cause."""
    status = report.get("status")
    if status is None:
        rw.refused(rc, report, argv, err, **common)
    common.update(report=report, cmd=argv, rc=rc, status=status, after=report.get("after") or {},
                  root_cause=report.get("root_cause"), run_id=report.get("run_id"))
    if rc == EXIT_OK and status in KEPT:
        module.exit_json(changed=status != "unchanged", **common)
    cause = _cause(report)
    failure = report.get("failure") or {}
    why = cause or failure.get("message") or "the new build failed its checks"
    if status == "rejected":
        module.fail_json(msg="rejected (nothing was stopped or changed): %s" % why, changed=False, **common)
    if status == "reverted":
        module.fail_json(msg="reverted to snapshot %s: %s" % (report.get("snapshot_id"), why), changed=True,
                         **common)
    revert = report.get("revert") or {}
    msg = "NOT restored, a person must act (rewheel exit %s): %s" % (rc, revert.get("error") or why)
    if revert.get("hint"):
        msg += " (hint: %s)" % revert["hint"]
    module.fail_json(msg=msg, changed=True, **common)


def _journal_run(rw, record, run_id):
    """(our run, whether a later command superseded it) from rewheel's journal (`history`): the
    run with `run_id`, else the first run that began after the record's process started."""
    rc, hist, argv, err = rw.call("history", rw.module.params["recipe"])
    if not isinstance(hist.get("runs"), list):
        rw.refused(rc, hist, argv, err)
    runs = sorted((r for r in hist["runs"] if isinstance(r, dict)), key=started_at)
    if run_id:
        mine = next((r for r in runs if r.get("id") == run_id), None)
    else:
        mine = next((r for r in runs if r.get("kind") == "run" and started_at(r) >= started_at(record) - 1), None)
    since = started_at(mine) if mine is not None else started_at(record)
    later = [r for r in runs if r is not mine and started_at(r) > since]
    return mine, bool(later)


def _mark(module, runs, record, how):
    trouble = runs.mark(record, how)
    if trouble:
        module.warn(trouble)


def reattach(rw, module, runs, record):
    """The outcome of a run an earlier task started here and never reported (its controller
    went away): waited for while it still runs, then read back and checked against rewheel's
    journal. Returns only when a later command superseded it (the caller then goes on as usual)."""
    runs.wait(record)
    report = runs.answer(record)
    run_id = report.get("run_id") if report else None
    mine, superseded = _journal_run(rw, record, run_id)
    common = dict(reattached=True, pending=[], before=(report or {}).get("before") or {}, run_id=run_id,
                  detached=record)
    argv = record.get("argv") or []
    if superseded:
        _mark(module, runs, record, "superseded")  # the environment moved on since: not this run's to report
        return
    _mark(module, runs, record, "reattached")
    if mine is not None and mine.get("status") == "interrupted":
        # Its rewheel was killed: rewheel's own refusal from now on; never resumed here.
        target = module.params["recipe"]
        msg = ("run %s, started on this host by an earlier play (pid %s), was interrupted (last step: %s)"
               % (mine.get("id"), record.get("pid"), mine.get("last_step") or "start"))
        hint = ("`rewheel resume %s` finishes or undoes it; `rewheel rollback %s` restores its pre-upgrade "
                "snapshot %s; nothing was resumed" % (target, target, mine.get("snapshot_id") or "")).rstrip()
        module.fail_json(msg="%s (hint: %s)" % (msg, hint), changed=False, status="error", rc=EXIT_BUSY,
                         report=_refusal("InterruptedRun", msg, hint, EXIT_BUSY), root_cause=None, cmd=argv,
                         **dict(common, run_id=mine.get("id")))
    if report is None and mine is not None:
        # Its answer is lost (the file removed): the journal's record of how it ended.
        report = dict(mine, run_id=mine.get("id"), from_journal=True)
    if report is None:
        module.fail_json(msg="the run an earlier play started here (pid %s) left no answer and no journal: %s"
                             % (record.get("pid"), runs.stderr_tail(record).strip() or "nothing on its stderr"),
                         changed=False, status="error", cmd=argv, root_cause=None, **common)
    # (the exit code the run ended with, as its report says it: the process was not this one's child)
    status = report.get("status")
    code = report.get("exit_code")
    rc = (code if isinstance(code, int) and not isinstance(code, bool) else EXIT_USAGE) if status is None \
        else EXIT_OK if status in KEPT else EXIT_UNRESTORED if status == "failed" else EXIT_REVERTED
    _outcome(rw, module, rc, report, argv, runs.stderr_tail(record), **common)


def upgraded(rw, module):
    p = module.params
    lock_sha = sha256_of(p["lock"]) if p["lock"] else None
    runs = DetachedRuns(p["runs_dir"], p["recipe"])
    earlier = runs.unreported()
    if earlier is not None and not module.check_mode:
        if earlier.get("lock_sha256") == lock_sha:
            reattach(rw, module, runs, earlier)
        elif alive(earlier):
            msg = ("a run of another lock (%s), started here by an earlier play (pid %s), still runs; it ends by "
                   "itself: run this play again after it" % (earlier.get("lock"), earlier.get("pid")))
            module.fail_json(msg=msg, changed=False, status="error", rc=EXIT_BUSY, root_cause=None, detached=earlier,
                             report=_refusal("LockHeld", msg, "wait for it, then run the play again", EXIT_BUSY))
        else:
            _mark(module, runs, earlier, "superseded")  # a run of another lock that ended: this play asks anew
    args = ["run", p["recipe"], "--yes", "--quiet"] + (["--lock", p["lock"]] if p["lock"] else [])
    rc, plan, argv, err = rw.call(*(args + ["--dry-run"]))
    if rc != EXIT_OK or plan.get("status") != "planned":
        rw.refused(rc, plan, argv, err)
    changes = (plan.get("plan") or {}).get("changes") or []
    pending = [c for c in changes if c.get("old") != c.get("new")]
    before = plan.get("before") or {}
    common = dict(pending=pending, before=before, root_cause=None, reattached=False)
    if not pending:
        module.exit_json(changed=False, status="current", report=plan, after=before, cmd=argv, rc=rc, **common)
    if module.check_mode:
        after = dict(before)
        for c in pending:
            if c.get("new") is None:
                after.pop(c["name"], None)
            else:
                after[c["name"]] = c["new"]
        module.exit_json(changed=True, status="planned", report=plan, after=after, cmd=argv, rc=rc, **common)
    # Detached from this connection: a dropped SSH session must not take the run with it.
    argv = [rw.exe] + args + ["--json"]
    try:
        proc, record = runs.start(argv, dict(os.environ, **rw.env), recipe=p["recipe"], lock=p["lock"],
                                  lock_sha256=lock_sha, home=p["home"])
    except OSError as exc:
        module.fail_json(msg="cannot start rewheel detached (%s: %s); nothing was changed"
                             % (exc.filename or argv[0], exc.strerror or exc), cmd=argv, **common)
    runs.wait(record, proc)
    report = runs.answer(record)
    if report is None:  # it printed nothing (killed): what its journal says
        reattach(rw, module, runs, record)
        module.fail_json(msg="rewheel (pid %d) ended by signal %d without an answer, and a later command has "
                             "changed the environment since: `rewheel history %s` shows what happened"
                             % (proc.pid, -proc.returncode, p["recipe"]), changed=False, status="error",
                         root_cause=None, detached=record, **common)
    _mark(module, runs, record, "reported")
    _outcome(rw, module, proc.returncode, report, argv, runs.stderr_tail(record), detached=record, **common)


def _changed_restore(report):
    restore = report.get("restore") or {}
    return bool(report.get("undo_snapshot_id") or any(restore.get(k) for k in
                                                      ("written", "deleted", "chmodded", "folders_rebuilt")))


def _default_snapshot(snaps):
    """The snapshot `rewheel rollback` picks without one named, as far as `history` shows it:
    the newest taken before an upgrade, else the newest that is not a failed build."""
    for wanted in (lambda m: m.get("status") == "pre-upgrade",
                   lambda m: m.get("status") not in ("failed-upgrade", "pre-rollback")):
        found = [m for m in snaps if wanted(m)]
        if found:
            return found[0]
    return None


def _rollback_would_change(rw, ref):
    """Check mode: whether the environment differs from the snapshot a rollback would restore
    (`status` names the snapshots it equals, `history` the snapshots there are)."""
    rc, st, argv, err = rw.call("status", *rw.target())
    if "target" not in st:
        rw.refused(rc, st, argv, err)
    equal = ([st["equals"]["id"]] if isinstance(st.get("equals"), dict) else []) + list(st.get("also_equal") or [])
    rc, hist, argv, err = rw.call("history", *rw.target())
    if "snapshots" not in hist:
        rw.refused(rc, hist, argv, err)
    snaps = hist["snapshots"]
    if ref is None:
        target = _default_snapshot(snaps)
    else:
        target = next((m for m in snaps if m.get("id", "").startswith(ref) or m.get("label") == ref), None)
    return target is None or target.get("id") not in equal, st


def rolled_back(rw, module):
    p = module.params
    if module.check_mode:
        changed, st = _rollback_would_change(rw, p["snapshot"])
        module.exit_json(changed=changed, status="planned", report=st, root_cause=None)
    args = ["rollback"] + rw.target() + ([p["snapshot"]] if p["snapshot"] else []) + ["--yes"]
    if p["force"]:
        args.append("--force")
    rc, report, argv, err = rw.call(*args)
    if "restore" not in report:
        rw.refused(rc, report, argv, err)
    common = dict(report=report, cmd=argv, rc=rc, status=report.get("status"), root_cause=report.get("root_cause"))
    if rc != EXIT_OK:
        msg = report.get("error") or "the rollback did not finish"
        if report.get("hint"):
            msg += " (hint: %s)" % report["hint"]
        module.fail_json(msg=msg, changed=True, **common)
    module.exit_json(changed=_changed_restore(report), **common)


def snapshot(rw, module):
    p = module.params
    if p["label"]:
        rc, st, argv, err = rw.call("status", *rw.target())
        eq = st.get("equals")
        if isinstance(eq, dict) and eq.get("label") == p["label"]:
            module.exit_json(changed=False, status="snapshot", report=st, cmd=argv, rc=rc, root_cause=None,
                             snapshot_id=eq.get("id"))
    if module.check_mode:
        module.exit_json(changed=True, status="planned", root_cause=None)
    args = ["snapshot"] + rw.target() + (["--label", p["label"]] if p["label"] else [])
    rc, report, argv, err = rw.call(*args)
    if rc != EXIT_OK or "id" not in report:
        rw.refused(rc, report, argv, err)
    module.exit_json(changed=True, status="snapshot", report=report, cmd=argv, rc=rc, root_cause=None,
                     snapshot_id=report["id"])


def status(rw, module):
    rc, st, argv, err = rw.call("status", *rw.target())
    if "target" not in st:
        rw.refused(rc, st, argv, err)
    # Exit 4 with a full report: an interrupted run is pending; say so, as rewheel does.
    if st.get("interrupted"):
        module.fail_json(msg="an interrupted rewheel run is pending: `rewheel resume` or `rewheel rollback` it",
                         changed=False, status="status", report=st, cmd=argv, rc=rc, root_cause=None)
    module.exit_json(changed=False, status="status", report=st, cmd=argv, rc=rc, root_cause=None)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["upgraded", "rolled_back", "snapshot", "status"]),
            recipe=dict(type="path"),
            python=dict(type="path"),
            lock=dict(type="path"),
            snapshot=dict(type="str"),
            force=dict(type="bool", default=False),
            label=dict(type="str"),
            home=dict(type="path"),
            executable=dict(type="str", default="rewheel"),
            runs_dir=dict(type="path", default="~/.cache/rewheel-fleet/runs"),
        ),
        mutually_exclusive=[("recipe", "python")],
        required_one_of=[("recipe", "python")],
        required_if=[("state", "upgraded", ("recipe",))],
        supports_check_mode=True,
    )
    p = module.params
    # Options that mean something with one state only: given with another, a mistake to name.
    misplaced = [name for name, state in ONLY_WITH.items()
                 if p[name] not in (None, False) and p["state"] != state]
    if misplaced:
        module.fail_json(msg="; ".join("%s: only with state=%s" % (n, ONLY_WITH[n]) for n in misplaced))
    rw = Rewheel(module)
    {"upgraded": upgraded, "rolled_back": rolled_back, "snapshot": snapshot, "status": status}[p["state"]](rw, module)


if __name__ == "__main__":
    main()
