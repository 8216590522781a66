"""What the commands take a target and a snapshot from: the recipe or `--python PATH` opened
(`_target`), TARGET and SNAPSHOT as given, an empty reference refused, and the exit 4 of a
read-only command while an interrupted run is pending."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from rewheel import report
from rewheel.errors import EXIT_BUSY

if TYPE_CHECKING:
    from rich.console import Console


def _target(target: str | None, python: str | None):  # -> commands.Target
    from rewheel import environment, recipe

    r = recipe.load_target(target, python)
    environment.probe_early(r.python)  # the interpreter answers while the commands import
    from rewheel import commands

    return commands.open_target(r)


def _refuse_empty_ref(name: str, ref: str | None, *, default: bool = True) -> None:
    """An empty snapshot reference is a mistake (an unset shell variable), never "the default"
    (`default`: whether leaving it out gives one)."""
    if ref is not None and not ref.strip():
        from rewheel.errors import UsageError

        raise UsageError(f"{name}: empty snapshot reference {ref!r}",
                         hint="give a snapshot id, a unique prefix of one or an exact label "
                              "(`rewheel history TARGET` lists them)"
                              + (", or leave it out for the default" if default else ""))


def _target_and_ref(target: str | None, ref: str | None, python: str | None, *,
                    required: bool = False) -> tuple[str | None, str | None]:
    """(TARGET, SNAPSHOT) as given: with --python the one positional argument is the
    snapshot. `required`: a command with no default snapshot."""
    if python and target is not None and ref is None:
        target, ref = None, target
    if required and ref is None:
        from rewheel.errors import UsageError

        # Never a default here: an unset shell variable must not pick a snapshot.
        raise UsageError("missing SNAPSHOT", hint="give a snapshot id, a unique prefix of one or an exact label "
                                                  "(`rewheel history TARGET` lists them)")
    _refuse_empty_ref("SNAPSHOT", ref, default=not required)
    return target, ref


def _target_and_snapshot(target: str | None, ref: str | None, python: str | None) -> tuple[str | None, str]:
    """(TARGET, SNAPSHOT) for a command that has no default snapshot: one must be named."""
    target, named = _target_and_ref(target, ref, python, required=True)
    assert named is not None  # required: refused above when missing
    return target, named


def _exit_if_interrupted(t, err: Console) -> None:  # t: commands.Target
    """Read-only commands are how an operator investigates, so they report fully — then exit
    4 like every other command while an interrupted run is pending."""
    from rewheel import journal
    from rewheel.status import interrupted_now

    j = interrupted_now(t)  # a journal a live rewheel is writing is running, not interrupted
    if j is not None:
        report.print_error(err, journal.interrupted_error(j, t.cli_ref))
        raise typer.Exit(EXIT_BUSY)
