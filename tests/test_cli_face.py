"""The command line's face: help with placeholder words and one line per command, one
meaning for `-p`, `--version`, `--plain` anywhere on the line, a "no" at the question shown
as a note rather than an error, and start-up that imports only what a command uses."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rewheel
from support_env import make_venv
import support_cli

COMMANDS = ["check", "snapshot", "history", "rollback", "run", "resume", "smoke", "why", "diff",
            "patches", "ci", "bisect"]


def rewheel_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=120)


def test_version() -> None:
    cp = rewheel_cli("--version")
    assert (cp.returncode, cp.stdout) == (0, f"rewheel {rewheel.__version__}\n")


def test_help_lists_every_command_on_one_line_at_80_columns() -> None:
    cp = rewheel_cli("--help", env={"COLUMNS": "80"})
    assert cp.returncode == 0
    listed = cp.stdout.split("Commands:\n", 1)[1].splitlines()
    for name in COMMANDS:
        line = next(line for line in listed if line.split()[:1] == [name])
        assert not line.endswith("...") and len(line) <= 80, line
        assert len(line.split()) > 3, line  # a description, not just the name


@pytest.mark.parametrize("command", COMMANDS)
def test_help_placeholders_are_words_and_p_means_package(command: str) -> None:
    cp = rewheel_cli(command, "--help", env={"COLUMNS": "100"})
    assert cp.returncode == 0, cp.stderr
    text = cp.stdout
    # Placeholders name what to give, never a type: TEXT, INTEGER, <bool>, <list[str]>.
    assert not re.search(r"(^|\s)-[-\w]+ (TEXT|INTEGER|FLOAT|BOOLEAN|<\w+(\[\w+\])?>)", text, re.M), text
    # `-p` is `--package` wherever it exists.
    for m in re.finditer(r"-p, (--[\w-]+)", text):
        assert m.group(1) == "--package", text
    if re.search(r"--package(?![\w-])", text):  # not `ci --packages-only`
        assert "-p, --package NAME" in text, text


def test_plain_is_accepted_after_the_command(tmp_path: Path) -> None:
    py = make_venv(tmp_path / "env")
    assert rewheel_cli("snapshot", "--python", str(py), "--label", "first").returncode == 0
    for argv in (["--plain", "history", "--python", str(py)], ["history", "--python", str(py), "--plain"]):
        cp = rewheel_cli(*argv)
        assert cp.returncode == 0, cp.stderr
        snap = json.loads(rewheel_cli("history", "--python", str(py), "--json").stdout)["snapshots"][0]
        # One line per snapshot, its id first: what grep finds.
        assert [line for line in cp.stdout.splitlines() if line.startswith(f"snapshot {snap['id']}")], cp.stdout


def _on_a_terminal(argv: list[str], answer: bytes) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on a pseudo-terminal; answer its question."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rewheel", *argv], stdin=slave, stdout=slave, stderr=slave,
                            close_fds=True)
    os.close(slave)
    out = b""
    answered = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"[y/N]" in out:
                os.write(master, answer)
                answered = True
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=60)
    os.close(master)
    return code, out.decode(errors="replace")


def test_no_at_the_question_is_a_note_not_a_red_error(tmp_path: Path) -> None:
    py = make_venv(tmp_path / "env")
    assert rewheel_cli("snapshot", "--python", str(py)).returncode == 0
    code, text = _on_a_terminal(["rollback", "--python", str(py)], b"n\n")
    assert "Restore" in text and "[y/N]" in text, text
    assert code == 2  # unchanged: not confirmed, nothing was changed
    assert "not confirmed; nothing was changed" in text
    assert "error:" not in text and "\x1b[1;31m" not in text, text


# `rewheel --help` and the read-only commands start fast when the CLI module imports only
# what every command needs; each command imports its own modules. (Times are measured in
# `make bench`, not here.)
HEAVY = ["httpx", "rich.table", "rich.markdown", "rich.syntax", "packaging.version", "rewheel.snapshot",
         "rewheel.commands", "rewheel.installer", "rewheel.diagnose", "rewheel.diff", "rewheel.patches",
         "typer.rich_utils"]


def test_importing_the_cli_imports_no_heavy_module() -> None:
    code = ("import sys, rewheel.cli; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "[]"


def test_help_imports_no_heavy_module() -> None:
    code = ("import sys; from rewheel.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "LOADED []" in cp.stdout, cp.stdout


def test_a_json_command_in_a_pipe_does_not_import_rich(tmp_path: Path) -> None:
    """A script's `rollback --json` (stderr a pipe, not a terminal) writes its progress lines
    without importing rich (about 50 ms of its start-up); with colour forced, rich is used."""
    py = make_venv(tmp_path / "env")
    snap = json.loads(rewheel_cli("snapshot", "--python", str(py), "--json").stdout)["id"]
    code = ("import sys\nfrom rewheel import cli\nsys.argv = ['rewheel', *sys.argv[1:]]\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('RICH', 'rich.console' in sys.modules, 'EXIT', code, file=sys.stderr)")
    argv = [sys.executable, "-c", code, "rollback", "--python", str(py), snap, "--yes", "--no-undo", "--json"]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                           env={k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")})
    assert "RICH False EXIT 0" in plain.stderr, plain.stderr
    assert f"restoring snapshot {snap} (manual) into {py.parent.parent}\n" in plain.stderr
    assert json.loads(plain.stdout)["restore"]["snapshot_id"] == snap
    forced = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={**os.environ, "FORCE_COLOR": "1"})
    assert "RICH True EXIT 0" in forced.stderr, forced.stderr


@pytest.mark.parametrize("args, kw", [
    (("restoring snapshot ab12 (pre-upgrade) into /srv/env",), {"highlight": False, "markup": False}),
    (("a [bold]path[/bold] with brackets",), {"markup": False}),
    (("  │ uv output line",), {"style": "dim", "highlight": False, "markup": False}),
    (("markup [bold]on[/]",), {}),
    (("a\ttab",), {"markup": False}),
    (("two", "parts"), {"end": "!\n"}),
    ((), {}),
])
def test_plain_stderr_writes_what_rich_writes_to_a_pipe(args: tuple[str, ...], kw: dict,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain console and rich's, both on a stream that is not a terminal, write the same
    bytes for everything rewheel prints there (what the plain one cannot do, it hands to rich)."""
    import io

    from rewheel import cli

    for k in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(k, raising=False)
    written = []
    for make in (cli.output._PlainStderr, cli.output._stderr_console):
        buf = io.StringIO()
        monkeypatch.setattr(sys, "stderr", buf)
        assert cli.output._PlainStderr.fits()
        make().print(*args, **kw)
        written.append(buf.getvalue())
    assert written[0] == written[1]
    with cli.output._PlainStderr().status("working") as st:  # nothing to draw on a pipe
        st.update("still")


def _click_params(cmd) -> list[tuple]:
    return [(p.name, tuple(p.opts), tuple(p.secondary_opts), p.required, p.nargs, p.multiple, repr(p.default))
            for p in cmd.params]


def test_a_command_run_alone_is_built_and_parsed_as_the_whole_app_does() -> None:
    """`main` builds only the named command's click parameters (`_app_for`): each command
    must come out with exactly the parameters, and the usage errors, of the whole app."""
    import click
    import typer.main
    from typer.testing import CliRunner

    from rewheel import cli

    whole = typer.main.get_command(cli.app)
    assert isinstance(whole, click.Group)
    names = sorted(whole.commands)
    assert set(COMMANDS) <= set(names) and "fleet-report" in names
    runner = CliRunner()
    for name in names:
        one = cli.typer_app._app_for([name, "--json"])
        assert one is not cli.app
        alone = typer.main.get_command(one)
        assert sorted(alone.commands) == [name]  # a group still: `rewheel NAME ...` reads the same
        assert _click_params(alone.commands[name]) == _click_params(whole.commands[name]), name
        assert _click_params(alone) == _click_params(whole)  # --plain, --version
        for args in ([name, "--no-such-option"], [name, "--help"]):
            a, b = runner.invoke(one, args), runner.invoke(cli.app, args)
            assert (a.exit_code, a.output) == (b.exit_code, b.output), args
    assert cli.typer_app._app_for(["--plain", "history", "x"]) is not cli.app
    # No command, a typo or a global option first: the whole app (its help lists every command).
    for args in ([], ["--help"], ["--version"], ["rollbak"], ["--plain"]):
        assert cli.typer_app._app_for(args) is cli.app, args


def test_a_mistyped_command_is_suggested_once() -> None:
    cp = rewheel_cli("rollbak")
    assert cp.returncode == 2
    assert cp.stderr.count("Did you mean 'rollback'?") == 1, cp.stderr


ALL_COMMANDS = [*COMMANDS, "verify", "pin", "unpin", "forget", "status", "fleet-report"]
TABLES = ["history", "diff", "patches", "run", "ci", "fleet-report"]


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_help_describes_every_argument_and_shows_plain_where_it_applies(command: str) -> None:
    cp = rewheel_cli(command, "--help", env={"COLUMNS": "100"})
    assert cp.returncode == 0, cp.stderr
    args = cp.stdout.split("Arguments:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    named = [line for line in args if re.match(r"  \S", line)]
    assert named, cp.stdout
    for line in named:
        # `  RECIPE  The recipe to run.  [required]`: a description, not only the name.
        words = re.sub(r"\[required\]", "", line).split()
        assert len(words) > 2, f"{command}: {line!r} has no description"
    assert ("--plain" in cp.stdout) == (command in TABLES), cp.stdout
    assert "ummarise" not in cp.stdout


def test_help_spells_summarize_one_way() -> None:
    cp = rewheel_cli("--help", env={"COLUMNS": "100"})
    assert "Summarize" in cp.stdout and "ummarise" not in cp.stdout


def test_plain_given_to_a_command_lists_one_fact_per_line(tmp_path: Path) -> None:
    py = make_venv(tmp_path / "env")
    assert rewheel_cli("snapshot", "--python", str(py)).returncode == 0
    # On a terminal (pty), `history --plain` is the plain list, not a table.
    code, out = _on_a_terminal(["history", "--python", str(py), "--plain"], b"")
    assert code == 0 and re.search(r"^snapshot [0-9a-f]{8}  ", out, re.M) and "┃" not in out, out


@pytest.mark.parametrize("given, typed", [
    ({"target": "recipes/my host.toml"}, "'recipes/my host.toml'"),
    ({"recipe_path": "vllm.toml"}, "vllm.toml"),
    ({"target": "abc123", "python": "/opt/env/bin/python"}, "--python /opt/env/bin/python"),
])
def test_a_core_hint_names_the_target_as_it_was_typed(given: dict, typed: str) -> None:
    """Core modules that do not know what was typed (the store, the lock, a diff) say TARGET in
    their hints; the CLI puts in what the person gave, quoted for the shell."""
    from rewheel import cli
    from rewheel.errors import LockHeld

    err = LockHeld("held", hint="`rewheel resume TARGET` (or `rewheel rollback TARGET`) stops them")
    cli.failures._as_typed(err, cli.failures._typed_target(given))
    assert err.hint == f"`rewheel resume {typed}` (or `rewheel rollback {typed}`) stops them"


def _app_commands() -> list[str]:
    import typer.main

    from rewheel import cli

    return sorted(typer.main.get_command(cli.app).commands)  # type: ignore[attr-defined]


HEADING = re.compile(r"^(\S[^:]*):$", re.M)


@pytest.mark.parametrize("command", [None, *_app_commands()])
def test_help_says_each_thing_once(command: str | None) -> None:
    """Every `--help` has the shape click and typer give together when they agree (the pair
    pyproject.toml pins): `Usage: rewheel …`, then the description, then each section once —
    `Arguments:` (where the command takes any), `Options:`, and the app's `Commands:` — and
    each argument and option listed once. (click 8.5 beside typer 0.24 added its own
    "Positional arguments:" section, so every argument was listed twice.)"""
    import click
    import typer.main

    from rewheel import cli

    whole = typer.main.get_command(cli.app)
    cmd = whole if command is None else whole.commands[command]  # type: ignore[attr-defined]
    cp = rewheel_cli(*([command] if command else []), "--help", env={"COLUMNS": "100"})
    assert cp.returncode == 0, cp.stderr
    text = cp.stdout
    assert text.startswith(f"Usage: rewheel {command + ' ' if command else ''}[OPTIONS]"), text
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    want = [*(["Arguments"] if args else []), "Options", *(["Commands"] if command is None else [])]
    assert HEADING.findall(text) == want, text
    sections = dict(zip(HEADING.findall(text), re.split(HEADING, text)[2::2], strict=True))
    for p in args:
        name = p.human_readable_name.strip("[]")  # (an optional one is shown `[NAME]`)
        listed = re.findall(rf"^  \[?{re.escape(name)}\]?\s", sections["Arguments"], re.M)
        assert len(listed) == 1, f"{p.human_readable_name} listed {len(listed)} times:\n{text}"
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            first = p.opts[0]
            listed = re.findall(rf"^  (?:-\w, )?{re.escape(first)}[\s,/]", sections["Options"], re.M)
            assert len(listed) == 1, f"{first} listed {len(listed)} times:\n{text}"
