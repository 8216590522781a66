"""The command line: parse, call one core function, render, map errors to exit codes.

Core modules never print or exit; they return dataclasses. With `--json` one JSON document
goes to stdout and any human text to stderr; without it the human report goes to stdout.

The app is built here, in one place: each command registered on `app` (`cli/typer_app.py`) in the
order `rewheel --help` lists them. The package's modules:

| module | owns |
|---|---|
| `typer_app` | the Typer app, the options' types, the global options, the short help, `_app_for` |
| `process` | `main` (the console script's entry), signals, the guarded stdout |
| `failures` | `handles_errors`: failures to exit codes, hints as typed, `internal_error` |
| `output` | the consoles, `--json`'s one document, `confirm`, progress and the status line |
| `targets` | TARGET and SNAPSHOT as given, the target opened |
| `cmd_change` | `check`, `snapshot`, `rollback`, `run`, `resume`, `smoke` |
| `cmd_read` | `history`, `status`, `why`, `diff`, `patches`, `verify`, `pin`, `unpin`, `forget` |
| `cmd_nightly` | `ci`, `bisect`, `fleet-report`, `board` |
"""

from __future__ import annotations

from rewheel.cli.typer_app import app, apply_short_help
from rewheel.cli.cmd_change import check, resume, rollback, run, smoke, snapshot
from rewheel.cli.cmd_nightly import bisect, board, ci, fleet_report
from rewheel.cli.cmd_read import diff, forget, history, patches, pin, status, unpin, verify, why
from rewheel.cli.process import main

__all__ = ["app", "main"]

app.command()(check)
app.command()(snapshot)
app.command()(history)
app.command()(rollback)
app.command()(run)
app.command()(resume)
app.command()(smoke)
app.command()(why)
app.command()(diff)
app.command()(patches)
app.command()(ci)
app.command()(bisect)
app.command()(verify)
app.command()(pin)
app.command()(unpin)
app.command()(forget)
app.command()(status)
app.command("fleet-report")(fleet_report)
app.command()(board)
apply_short_help()
