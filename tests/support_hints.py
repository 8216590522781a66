"""Hints a person can paste: every `rewheel …` command that a command of the suite prints —
in a `hint:` line, a report, a JSON document — is run as typed, in the state the suite left
when it was printed, and must be accepted.

`support_cli.rewheel` hands each finished command here (`check`). The commands in its output
are the spans between backticks that start like a command: `rewheel …`, `python -m rewheel …`,
a path ending in `/rewheel`, or one of rewheel's command names (a hint without the program's
name, which a shell would not find). Each one, once per test:

- must split as a shell splits it (`shlex`) and name the program `rewheel`;
- must not stand for one: a placeholder the CLI knows the value of (TARGET, RECIPE) is a defect,
  and a hint made of placeholders only a person can fill (LOGFILE, `…`) is a template, counted
  and not run;
- is then run as typed: the same arguments, environment, working folder, umask and wrapper as
  the command it came from, no terminal (stdin /dev/null). It runs forked from the warm
  interpreter (or a real one where the command's was) under a guard (support_zygote's
  `--guarded`): at the first thing it would change — a file opened for writing, a folder made,
  a rename, a removal, a signal sent, a process started that is not a read-only probe — it is
  stopped (exit GUARD_EXIT), having changed nothing. Read-only commands run to their end;
  commands that change an environment run through their parsing, their target, their
  snapshot lookup, their refusals and their question, up to their lock.

A hint is accepted when it ran to its end (exit 0, 1, 3 or 4: the state decides those), was
stopped at its first change, or stopped at the question for want of a terminal — unless it
retries the command it came from (the same command and arguments) and that one had `--yes`:
a retry keeps the person's --yes, a new action (another command, another snapshot) asks anew.
A usage error, any other refusal (exit 2; `check`'s failing checks are its report, not a
refusal) or a crash (exit 5) fails the test that printed the hint, naming both commands.

Every hint and its verdict is recorded (JSON lines under REWHEEL_TESTS_HINT_LOG, which
tests/conftest.py sets for the session); the session's summary line counts them. Usage lines
(`Usage: …`, `Try '… --help'`) are checked to name `rewheel` as well. `REWHEEL_TESTS_HINTS=0`
turns the checking off; `=record` records without failing a test (to survey a change)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The exit status of a hint stopped at its first change (support_zygote's guard).
GUARD_EXIT = 86
PROG = "rewheel"
SPAN = re.compile(r"`([^`\n]+)`")
# Placeholders of the usage: the CLI knows what was typed for these, so a hint that says them
# cannot be pasted (cli.failures._as_typed puts the value in).
KNOWN_PLACEHOLDERS = {"TARGET", "RECIPE"}
# Placeholders only the person can fill: a log they save, a file they choose.
TEMPLATE_PLACEHOLDERS = {"LOGFILE", "FILE", "UNIT", "TIME", "DIR", "GLOB", "NAME"}
USAGE_LINE = re.compile(r"^(?:Usage: (\S+)|Try '(\S+)[^']*' for help\.)", re.M)

_seen: set[tuple[str, str]] = set()


def _commands() -> tuple[set[str], set[str]]:
    """rewheel's commands, and those whose first argument is a target (TARGET or RECIPE)."""
    import click
    import typer.main

    from rewheel import cli

    commands = typer.main.get_command(cli.app).commands  # type: ignore[attr-defined]
    targeted = {name for name, c in commands.items()
                if any(isinstance(p, click.Argument) and p.name in ("target", "recipe_path") for p in c.params)}
    return set(commands), targeted


COMMANDS, TARGETED = _commands()


def _strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


def texts_of(stdout: str, stderr: str) -> list[str]:
    """What a person reads: stderr, and stdout — a JSON document's strings, one by one."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return [stdout, stderr]
    return [*_strings(doc), stderr]


def looks_like_a_command(span: str) -> bool:
    words = span.split()
    if not words:
        return False
    first = words[0]
    return (first == PROG or first.endswith("/" + PROG) or first in COMMANDS
            or (re.fullmatch(r"python[\d.]*", first) is not None and words[1:3] == ["-m", PROG]))


def hints_in(stdout: str, stderr: str) -> list[str]:
    found: list[str] = []
    for text in texts_of(stdout, stderr):
        for span in SPAN.findall(text):
            if looks_like_a_command(span) and span not in found:
                found.append(span)
    return found


def usage_problems(stdout: str, stderr: str) -> list[str]:
    """Usage lines that name another program than `rewheel` (`Usage: python -m rewheel …`)."""
    return [m.group(0) for text in (stdout, stderr) for m in USAGE_LINE.finditer(text)
            if (m.group(1) or m.group(2)) != PROG]


def known_placeholders(args: tuple[str, ...] | list[str]) -> set[str]:
    """The placeholders the command knows the value of, so that its hints say that instead:
    TARGET when it was given `--python PATH`, TARGET and RECIPE when it was given a recipe."""
    if not args or args[0] not in TARGETED:
        return set()
    if "--python" in args:
        return {"TARGET"}
    positional = [a for a in args[1:] if not a.startswith("-")]
    return {"TARGET", "RECIPE"} if positional and os.path.isfile(positional[0]) else set()


def static_verdict(hint: str, known: set[str] = KNOWN_PLACEHOLDERS) -> tuple[str, str] | None:
    """("defect", why) or ("template", why) when the hint cannot be run as typed; None when it
    can. `known`: the placeholders whose value the command that printed it knew."""
    try:
        words = shlex.split(hint)
    except ValueError as exc:
        return "defect", f"a shell cannot split it ({exc})"
    if not words or words[0] != PROG:
        return "defect", f"it does not start with the program's name `{PROG}`"
    said = sorted({w for w in words if w in KNOWN_PLACEHOLDERS})
    if set(said) & known:
        return "defect", f"it says {', '.join(sorted(set(said) & known))} where the command knows what was typed"
    if said or any("…" in w or w == "..." for w in words) or any(w in TEMPLATE_PLACEHOLDERS for w in words):
        return "template", "a placeholder only the person can fill"
    return None


def retries(hint_args: list[str], came_from: list[str]) -> bool:
    """Whether the hint is the command it came from again (the same command and arguments,
    other flags): a retry keeps the --yes the person gave; a new action asks anew."""
    def words(args: list[str]) -> list[str]:
        return [a for a in args if not a.startswith("-")]

    return words(hint_args) == words(came_from)


def verdict(hint: str, came_from: list[str], cp: subprocess.CompletedProcess) -> tuple[str, str]:
    """("ran" | "stopped" | "asks" | "defect", detail) for a hint run as typed (`cp`)."""
    words = shlex.split(hint)
    err = cp.stderr if isinstance(cp.stderr, str) else cp.stderr.decode(errors="replace")
    first_error = next((ln.strip() for ln in err.splitlines() if re.match(r"\s*(error|Error):", ln)), "")
    rc = cp.returncode
    if rc == GUARD_EXIT:
        return "stopped", err.strip().splitlines()[-1] if err.strip() else ""
    if rc in (0, 1, 3, 4):
        return "ran", f"exit {rc}"
    if rc == 2 and "no terminal to ask on" in err:
        if retries(words[1:], came_from) and ("--yes" in came_from or "-y" in came_from):
            return "defect", "it retries a command given --yes, and drops the --yes: a script that pastes it is refused again"
        return "asks", "asks for a confirmation (a new action: the person decides)"
    if rc == 2 and len(words) > 1 and words[1] == "check" and not first_error:
        return "ran", "exit 2: check's report of a failing check"
    return "defect", f"exit {rc}: {first_error or err.strip()[-300:]}"


def enabled() -> bool:
    return os.environ.get("REWHEEL_TESTS_HINTS", "1") != "0"


def _record(entry: dict[str, Any]) -> None:
    log = os.environ.get("REWHEEL_TESTS_HINT_LOG")
    if not log:
        return
    try:
        with open(os.path.join(log, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError:
        pass  # (the log folder went with the session that made it)


def check(args: tuple[str, ...], env: dict[str, str], cwd: str | Path | None, umask: int,
          prefix: list[str] | None, cp: subprocess.CompletedProcess) -> None:
    """The hints `rewheel *args` printed (its result `cp`), each run as typed; an
    AssertionError names every one that cannot be pasted."""
    if not enabled():
        return
    out = cp.stdout if isinstance(cp.stdout, str) else cp.stdout.decode(errors="replace")
    err = cp.stderr if isinstance(cp.stderr, str) else cp.stderr.decode(errors="replace")
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    came_from = list(args)
    problems = [f"{line!r}: usage that names another program than `{PROG}`" for line in usage_problems(out, err)]
    # (Help is the usage's documentation: the commands in it are its templates.)
    hints = [] if "--help" in args or "--version" in args else hints_in(out, err)
    if any(ch in a for a in args for ch in "\n\r\t\x1b`"):
        # Hostile arguments (the sweeps of control characters): printed made visible, so not
        # pasteable by design; their hints are counted, not run.
        for hint in hints:
            _record({"test": test, "hint": hint, "from": came_from, "verdict": "hostile"})
        hints = []
    for hint in hints:
        key = (test, hint)
        if key in _seen:
            continue
        _seen.add(key)
        static = static_verdict(hint, known_placeholders(args))
        if static is not None:
            kind, why = static
            detail = why
        else:
            import support_cli

            try:
                ran = support_cli.run_guarded(shlex.split(hint)[1:], env=env, cwd=cwd, umask=umask, prefix=prefix)
            except subprocess.TimeoutExpired as exc:
                kind, detail = "defect", f"still running after {exc.timeout:g}s"
            else:
                kind, detail = verdict(hint, came_from, ran)
        _record({"test": test, "hint": hint, "from": came_from, "verdict": kind, "detail": detail})
        if kind == "defect":
            problems.append(f"`{hint}`: {detail}")
    if problems and os.environ.get("REWHEEL_TESTS_HINTS") != "record":
        raise AssertionError(f"`{shlex.join([PROG, *args])}` (exit {cp.returncode}) printed what cannot be "
                             "pasted as given:\n  " + "\n  ".join(problems) + f"\n--- its stderr:\n{err[-2000:]}")


def summary(log: str) -> str:
    """The session's count of hints, from every worker's record."""
    entries = []
    for name in sorted(os.listdir(log)):
        with open(os.path.join(log, name)) as f:
            entries += [json.loads(line) for line in f if line.strip()]
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["verdict"]] = counts.get(e["verdict"], 0) + 1
    distinct = len({_shape(e["hint"]) for e in entries})
    tests = len({e["test"] for e in entries})
    parts = [f"{counts.get(k, 0)} {what}" for k, what in (
        ("ran", "ran to their end"), ("stopped", "stopped at their first change"),
        ("asks", "stopped at their question (a new action: asked anew)"), ("template", "templates (not run)"),
        ("hostile", "from hostile arguments (not run)"), ("defect", "could not be pasted"))]
    return (f"hints: {len(entries)} printed by the commands of {tests} tests ({distinct} shapes), "
            "run as typed: " + ", ".join(parts))


def _shape(hint: str) -> str:
    """A hint with its paths, ids and numbers blanked: how many different hints there are."""
    words = []
    for w in hint.split():
        if "/" in w or re.fullmatch(r"[0-9a-f]{8,}|\d+", w):
            w = "X"
        words.append(w)
    return " ".join(words)
