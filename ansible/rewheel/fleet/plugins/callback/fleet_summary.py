# Copyright: rewheel contributors
# Apache License 2.0 (see the repository's pyproject.toml)
"""The `rewheel.fleet.fleet_summary` callback: keeps each host's rewheel report on the
controller and, when the playbook ends (also when a reverted canary stopped it), prints
`rewheel fleet-report` over them. The summary's logic is rewheel's own; this only collects."""

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_summary
type: aggregate
short_description: The fleet's summary of a rewheel rollout, at the end of the play
description:
  - Writes the report of every C(rewheel.fleet.rewheel) task with C(state=upgraded) to
    O(reports_dir)/HOST.json on the controller (the folder's old C(*.json) files are removed
    when a playbook starts); a host that could not be reached gets a document saying so, at
    which task and why (its status in the summary, C(unreachable)).
  - When the playbook ends, also when a failure stopped it, runs the controller's
    C(rewheel fleet-report) over them and prints it; hosts the playbook saw that have no report
    are listed as not reached. With O(summary_file) (or C($GITHUB_STEP_SUMMARY)) set, the
    Markdown summary is appended there.
version_added: "0.1.0"
requirements:
  - enable it (C(callbacks_enabled = rewheel.fleet.fleet_summary) in ansible.cfg)
  - rewheel on the controller (or O(rewheel) pointing at one)
options:
  reports_dir:
    description: Where the hosts' reports are kept on the controller.
    type: path
    default: rewheel-fleet-reports
    env:
      - name: REWHEEL_FLEET_REPORTS
    ini:
      - section: rewheel_fleet
        key: reports_dir
  rewheel:
    description: The controller's C(rewheel) command.
    type: str
    default: rewheel
    env:
      - name: REWHEEL_FLEET_REWHEEL
    ini:
      - section: rewheel_fleet
        key: rewheel
  summary_file:
    description: A file to append the Markdown summary to (a CI job summary).
    type: path
    env:
      - name: REWHEEL_FLEET_SUMMARY
      - name: GITHUB_STEP_SUMMARY
    ini:
      - section: rewheel_fleet
        key: summary_file
"""

import json
import os
import subprocess

from ansible.plugins.callback import CallbackBase

ACTIONS = ("rewheel.fleet.rewheel",)


def _result(res):
    # `result` from ansible-core 2.19 on, `_result` before it.
    return getattr(res, "result", None) if not hasattr(res, "_result") else res._result


def _host(res):
    return (getattr(res, "host", None) or res._host).get_name()


def _task(res):
    return getattr(res, "task", None) or res._task


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rewheel.fleet.fleet_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []  # hosts in the order the playbook first reached them
        self.reports = {}

    def _folder(self):
        return os.path.abspath(os.path.expanduser(self.get_option("reports_dir")))

    def v2_playbook_on_start(self, playbook):
        folder = self._folder()
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            if name.endswith(".json"):  # an earlier rollout's: never mixed into this summary
                os.unlink(os.path.join(folder, name))

    def _saw(self, res):
        host = _host(res)
        if host not in self.seen:
            self.seen.append(host)
        return host

    def _upgrade_task(self, res):
        task = _task(res)
        action = getattr(task, "resolved_action", None) or task.action
        return action in ACTIONS and task.args.get("state") == "upgraded"

    def _write(self, host, doc):
        path = os.path.join(self._folder(), host + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, default=str)
        self.reports[host] = path

    def _keep(self, res):
        host = self._saw(res)
        report = (_result(res) or {}).get("report")
        if self._upgrade_task(res) and isinstance(report, dict):
            self._write(host, report)

    def v2_runner_on_ok(self, result):
        self._keep(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._keep(result)

    def v2_runner_on_skipped(self, result):
        self._saw(result)

    def v2_runner_on_unreachable(self, result):
        # Any task of the rollout: at the start of its wave (the rollout stops there) or in the
        # middle of the upgrade (the run goes on by itself on the host).
        host = self._saw(result)
        why = ((_result(result) or {}).get("msg") or "").strip()
        why = why[len("Task failed: "):] if why.startswith("Task failed: ") else why  # (ansible-core 2.19's prefix)
        if self._upgrade_task(result):
            msg = ("connection lost during the upgrade: a run it started goes on by itself on the host, and the "
                   "next rollout reports its outcome (%s)" % why)
        else:
            msg = "unreachable at the task %r: %s" % (_task(result).get_name(), why)
        self._write(host, {"error": "Unreachable", "unreachable": True, "message": msg, "exit_code": None})

    def v2_playbook_on_stats(self, stats):
        if not self.reports:
            return
        files = ["%s=%s" % (h, p) for h, p in self.reports.items()]
        argv = [self.get_option("rewheel"), "fleet-report", "--plain"] + files + ["--expect", ",".join(self.seen)]
        summary = self.get_option("summary_file")
        if summary:
            argv += ["--summary", summary]
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        except OSError as exc:
            self._display.warning("rewheel fleet summary: cannot run %s: %s" % (argv[0], exc))
            return
        self._display.banner("REWHEEL FLEET SUMMARY")
        self._display.display(cp.stdout.rstrip() or cp.stderr.rstrip())
        if cp.returncode not in (0, 1, 3):
            self._display.warning("rewheel fleet-report exited %d: %s" % (cp.returncode, cp.stderr.strip()))
