"""The Typer app and what every command shares of its face: the options' types (`JsonOpt`,
`PlainOpt` …), the global options (`--plain`, `--version`), the one line each command has in
`rewheel --help`, and `_app_for` — the app with only the named command's click parameters built
(about 30 ms less per start). The commands are registered on it in `rewheel/cli/__init__.py`."""

from __future__ import annotations

import copy
from typing import Annotated, Any

import typer

from rewheel import report

# Plain click help (rich_markup_mode=None): one line per option with its placeholder word,
# the same on every terminal and in a pipe, and `--help` starts without rich's help renderer.
# suggest_commands off: click itself says "Did you mean ...?" (typer's would say it twice).
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None, suggest_commands=False,
                  help="Upgrade a service's Python environment and keep the upgrade only once it is proven.\n\n"
                       "RECIPE is a recipe file; TARGET a recipe file, or an environment given with "
                       "--python PATH; SNAPSHOT a snapshot id, a unique prefix of one, or its exact label "
                       "(`rewheel history TARGET` lists them).")


# The program's name in usage lines and hints: what a person types.
PROG = "rewheel"


def _keep_argument_help() -> None:
    """Typer sets an argument's help and then click's Argument.__init__ (8.2 and later, which
    takes `help` itself) resets it to None: `rewheel diff --help` listed `[A] [B]` with no
    word on them. Hand the help to click too."""
    from typer.core import TyperArgument

    init = TyperArgument.__init__
    if getattr(init, "keeps_help", False):
        return

    def __init__(self: TyperArgument, *args: Any, help: str | None = None, **kw: Any) -> None:  # noqa: A002
        init(self, *args, help=help, **kw)
        self.help = help

    __init__.keeps_help = True  # type: ignore[attr-defined]
    TyperArgument.__init__ = __init__  # type: ignore[method-assign]


_keep_argument_help()


JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout; human text on stderr.")]


YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Answer yes to the confirmation (needed without a terminal).")]


PythonOpt = Annotated[str | None, typer.Option("--python", metavar="PATH", help="Target an interpreter instead of a recipe.")]


VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Also list the packages reinstalled at the same version.")]


TargetArg = Annotated[str | None, typer.Argument(help="A recipe file (or give --python PATH instead).", show_default=False)]


def _set_plain(value: bool) -> None:
    if value:
        report.layout.PLAIN = True


# On the commands that print tables; also accepted before the command (`rewheel --plain …`).
PlainOpt = Annotated[bool, typer.Option("--plain", callback=_set_plain,
                                        help="One fact per line instead of tables (the default when stdout is not a terminal).")]


def _plain_first(args: list[str]) -> list[str]:
    """`--plain` is a global option (`rewheel --plain history X`); it is accepted after the
    command too (`rewheel history X --plain`), where a person types it, by moving it first."""
    cut = args.index("--") if "--" in args else len(args)
    if "--plain" not in args[:cut] or args[:1] == ["--plain"]:
        return args
    return ["--plain", *(a for a in args[:cut] if a != "--plain"), *args[cut:]]


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command that `args` names, or the whole app.

    Typer builds the click parameters of every registered command at each start (about
    30 ms for these); running one command needs only its own, and parses, checks and
    reports usage errors exactly as the whole app does. Anything else (no command, a typo,
    a global option such as `--help` before one) gets the whole app, whose messages list
    every command."""
    i = 0
    while i < len(args) and args[i] == "--plain":
        i += 1
    if i == len(args) or args[i].startswith("-"):
        return app
    named = [c for c in app.registered_commands
             if (c.name or (c.callback.__name__.replace("_", "-") if c.callback else None)) == args[i]]
    if len(named) != 1:
        return app
    one = copy.copy(app)
    one.registered_commands = named
    return one


def _print_version(value: bool) -> None:
    if value:
        from rewheel import __version__

        typer.echo(f"rewheel {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    plain: Annotated[bool, typer.Option("--plain", help="One fact per line instead of tables (the default when stdout is not a terminal).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print rewheel's version and exit.")] = False,
) -> None:
    del version  # handled eagerly by its callback
    if plain:
        report.layout.PLAIN = True


# click cuts a command's description in the command list to what fits 80 columns (with
# "..."); these say each command's job in that room. `rewheel COMMAND --help` shows the full
# description (the command's docstring).
_SHORT_HELP = {
    "check": "Validate a recipe and the host; changes nothing.",
    "snapshot": "Take a snapshot of an environment now.",
    "history": "Snapshots and runs, newest first, with key versions.",
    "rollback": "Restore a snapshot; stops and starts the service around it.",
    "run": "Upgrade: stop, snapshot, reinstall, test, start — or revert.",
    "resume": "Finish or undo an interrupted run.",
    "smoke": "Smoke test and health check of the live environment.",
    "why": "The root cause of a crash, from a log or a unit's journal.",
    "diff": "Versions and files between snapshots, or one and now.",
    "patches": "Installed files edited since their wheel installed them.",
    "ci": "Qualify the newest nightly in a throwaway environment.",
    "bisect": "Find the first bad nightly between a good and a bad one.",
    "verify": "Check snapshots' stored files against their manifests.",
    "status": "Where the environment stands: versions, snapshot, runs, service.",
    "pin": "Keep a snapshot from retention.",
    "unpin": "Let retention prune a pinned snapshot again.",
    "forget": "Remove one snapshot from the store.",
    "fleet-report": "Summarize a rollout over many hosts from their run reports.",
    "board": "Write a static HTML site of the runs, nightlies and fleet.",
}


def apply_short_help() -> None:
    """Each registered command's line in `rewheel --help` (`_SHORT_HELP`); called once the
    commands are registered."""
    for info in app.registered_commands:
        name = info.name or (info.callback.__name__ if info.callback else "")
        if info.short_help is None and name in _SHORT_HELP:
            info.short_help = _SHORT_HELP[name]
