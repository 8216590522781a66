"""Human rendering of results (rich), one module per concern; JSON rendering is each result's
`to_json()`. Callers use the names re-exported here (`report.render_run`, `report.escape`, …).

| module | owns |
|---|---|
| `text` | terminal-safe text (`clean`, `escape`), `show_path`, `human_bytes`, the command line as typed (`ARGV`, `typed_line`), `print_error`, downtime in words |
| `layout` | `--plain` (`PLAIN`, `is_plain`), tables that fit or stack, the fitted consoles (`fitted_console`) |
| `diagnosis` | a root cause, `why`, the suspects |
| `diffs` | the package table, `diff`'s files and unified diffs, `patches` |
| `runs` | `check`, the plan, a run's report, `resume`, `smoke` |
| `snapshots` | `snapshot`, `history`, `rollback`, `verify`, `pin`, `forget`, `status`, pruning |
| `ci` | `ci`, `bisect`, `fleet-report`, `board` |

The two settings the CLI makes once live in the module that reads them, and are set there:
`report.layout.PLAIN` (`--plain`) and `report.text.ARGV` (the command line as typed).
"""

from rewheel.report import layout, text
from rewheel.report.ci import render_bisect, render_board, render_ci, render_ci_base, render_fleet
from rewheel.report.diagnosis import render_root_cause, render_suspects, render_why
from rewheel.report.diffs import print_diff, render_diff, render_package_changes, render_patches
from rewheel.report.layout import fit_text, fitted_console, is_plain, shorten_paths
from rewheel.report.runs import (
    render_changes,
    render_check,
    render_held_back,
    render_plan,
    render_prepared,
    render_resume,
    render_run,
    render_smoke,
)
from rewheel.report.snapshots import (
    render_forget,
    render_history,
    render_history_marks,
    render_pin,
    render_pruned,
    render_rollback,
    render_rollback_more,
    render_snapshot,
    render_status,
    render_verify,
    running_text,
    snapshot_cost,
    strays_hint,
)
from rewheel.report.text import (
    clean,
    downtime_text,
    escape,
    human_bytes,
    print_error,
    render_downtime,
    show_path,
    typed_line,
)

__all__ = [
    "layout",
    "text",
    "clean",
    "downtime_text",
    "escape",
    "fit_text",
    "fitted_console",
    "human_bytes",
    "is_plain",
    "print_diff",
    "print_error",
    "render_bisect",
    "render_board",
    "render_changes",
    "render_check",
    "render_ci",
    "render_ci_base",
    "render_diff",
    "render_downtime",
    "render_fleet",
    "render_forget",
    "render_held_back",
    "render_history",
    "render_history_marks",
    "render_package_changes",
    "render_patches",
    "render_pin",
    "render_plan",
    "render_prepared",
    "render_pruned",
    "render_resume",
    "render_rollback",
    "render_rollback_more",
    "render_root_cause",
    "render_run",
    "render_smoke",
    "render_snapshot",
    "render_status",
    "render_suspects",
    "render_verify",
    "render_why",
    "running_text",
    "shorten_paths",
    "show_path",
    "snapshot_cost",
    "strays_hint",
    "typed_line",
]
