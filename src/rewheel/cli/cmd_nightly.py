"""The commands about nightlies and many hosts: `ci`, `bisect`, `fleet-report`, `board`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rewheel import report
from rewheel.cli.typer_app import JsonOpt, PlainOpt, PythonOpt, TargetArg
from rewheel.cli.failures import handles_errors
from rewheel.cli.output import _streams, consoles, show
from rewheel.cli.targets import _target


@handles_errors
def ci(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe whose nightly to qualify.")],
       junit: Annotated[str | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML (one test case per step).")] = None,
       summary: Annotated[str | None, typer.Option("--summary", metavar="FILE", help="Append a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")] = None,
       promote: Annotated[bool, typer.Option("--promote", help="On success write lockfiles/pylock.<recipe>.toml.")] = False,
       lockfiles: Annotated[str, typer.Option("--lockfiles", metavar="DIR", help="Where qualified locks live.")] = "lockfiles",
       venv_python: Annotated[str | None, typer.Option("--venv-python", metavar="PATH|VERSION", help="Interpreter for the throwaway environment (default: the recipe's).")] = None,
       quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream uv's and the smoke test's output.")] = False,
       packages_only: Annotated[bool, typer.Option("--packages-only", help="Start from the recipe's packages alone, not from the target environment's pinned set.")] = False,
       board: Annotated[str | None, typer.Option("--board", metavar="DIR", help="Write the board (rewheel board) there, this verdict included.")] = None,
       json_out: JsonOpt = False, plain: PlainOpt = False) -> None:
    """Qualify the newest nightly in a throwaway environment; report for CI; promote its lock."""
    from pathlib import Path

    from rewheel import qualify
    from rewheel import recipe as recipemod

    rec = recipemod.load_recipe(recipe_path, check_interpreter=venv_python is None)
    out, err = consoles(json_out)

    say, on_output = _streams(err, quiet)

    result = qualify.qualify(rec, lockfiles=Path(lockfiles), promote=promote, interpreter=venv_python,
                             say=say, on_output=on_output, from_target=not packages_only)
    qualify.write_reports(result, junit=Path(junit) if junit else None,
                          summary=Path(summary) if summary else None)
    if board:
        from rewheel.board import write_board

        err.print(f"board: {write_board(Path(board)).index}", highlight=False, markup=False)
    show(out, json_out, result, report.render_ci)
    if not json_out:
        report.render_ci_base(out, result)
    raise typer.Exit(result.exit_code)


@handles_errors
def bisect(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe (its indexes and smoke test).")],
           good: Annotated[str, typer.Option("--good", metavar="VERSION", help="A build that passes the smoke test.")],
           bad: Annotated[str, typer.Option("--bad", metavar="VERSION", help="A later build that fails it.")],
           package: Annotated[str | None, typer.Option("--package", "-p", metavar="NAME", help="The package to bisect (default: the recipe's first).")] = None,
           repo: Annotated[str | None, typer.Option("--repo", metavar="PATH", help="A local git clone: the commits between good and bad.")] = None,
           github: Annotated[str | None, typer.Option("--github", metavar="OWNER/REPO", help="Take the commits from this repository's compare API.")] = None,
           github_api: Annotated[str, typer.Option("--github-api", metavar="URL", help="The GitHub API base URL.")] = "https://api.github.com",
           commit_index_base: Annotated[str | None, typer.Option("--commit-index-base", metavar="URL", help="Base of the per-commit indexes <URL>/<sha>/ (default: from an extra index ending in /nightly).")] = None,
           venv_python: Annotated[str | None, typer.Option("--venv-python", metavar="PATH|VERSION", help="Interpreter for the throwaway environments (default: the recipe's).")] = None,
           restart: Annotated[bool, typer.Option("--restart", help="Forget verdicts journaled by an earlier run of this bisection.")] = False,
           quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream uv's and the smoke test's output.")] = False,
           json_out: JsonOpt = False) -> None:
    """Find the first bad nightly between a good and a bad one (resumable)."""
    from rewheel import bisection
    from rewheel import recipe as recipemod

    rec = recipemod.load_recipe(recipe_path, check_interpreter=venv_python is None)
    out, err = consoles(json_out)

    say, on_output = _streams(err, quiet)

    result = bisection.bisect(rec, good=good, bad=bad, package=package, repo=repo, github=github,
                              github_api=github_api, commit_base=commit_index_base,
                              interpreter=venv_python, restart=restart,
                              say=say, on_output=on_output)
    show(out, json_out, result, report.render_bisect)
    raise typer.Exit(result.exit_code)


@handles_errors
def fleet_report(
    reports: Annotated[list[str], typer.Argument(metavar="REPORT...", show_default=False,
                                                 help="One `rewheel run --json` document per host: HOST.json, or HOST=FILE.")],
    expect: Annotated[list[str] | None, typer.Option("--expect", metavar="HOSTS", help="Hosts of the rollout (comma-separated, repeatable): those without a report were not reached.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown summary instead of the table.")] = False,
    summary: Annotated[str | None, typer.Option("--summary", metavar="FILE", help="Append the Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")] = None,
    json_out: JsonOpt = False,
    plain: PlainOpt = False,
) -> None:
    """Summarize a rollout over many hosts: per host the status, versions, downtime and root
    cause; root causes grouped across hosts. Each REPORT is what `rewheel run --json` printed
    on one host, as HOST.json or HOST=FILE. Exit 1 when a host was reverted, 3 when one could
    not be restored."""
    from rewheel import fleet

    result = fleet.fleet_report(reports, expect=expect)
    if summary:
        fleet.write_summary(result, Path(summary))
    out, _ = consoles(json_out)
    if markdown and not json_out:
        sys.stdout.write(fleet.markdown(result))
    else:
        show(out, json_out, result, report.render_fleet)
    raise typer.Exit(result.exit_code)


@handles_errors
def board(target: TargetArg = None, python: PythonOpt = None,
          out_dir: Annotated[str, typer.Option("--out", metavar="DIR", help="The folder to write the site to (new, empty, or an earlier board's).", show_default=False)] = ...,  # type: ignore[assignment]
          fleet: Annotated[str | None, typer.Option("--fleet", metavar="DIR", help="A rollout's run reports (HOST.json, as fleet-report reads them).")] = None,
          expect: Annotated[list[str] | None, typer.Option("--expect", metavar="HOSTS", help="With --fleet: the rollout's hosts in order (comma-separated, repeatable).")] = None,
          waves: Annotated[str, typer.Option("--waves", metavar="LIST", help="With --fleet: the rollout's waves, as the playbook's serial.")] = "1,30%,100%",
          json_out: JsonOpt = False) -> None:
    """Write a static HTML site of what rewheel knows: every environment's runs, rollbacks
    and snapshots (or TARGET's), each run's versions, source diff, patches, root cause and
    step timings, the nightlies `ci` qualified and `bisect` searched, a fleet's rollout. It
    opens from file:// (no server, no network)."""
    from rewheel.board import write_board

    t = _target(target, python) if target is not None or python is not None else None
    result = write_board(Path(out_dir), target=t, fleet=Path(fleet) if fleet else None, expect=expect, waves=waves)
    out, _ = consoles(json_out)
    show(out, json_out, result, report.render_board)
