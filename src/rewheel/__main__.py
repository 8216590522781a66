"""`python -m rewheel` and the `rewheel` console script: the command-line interface, with a
Ctrl-C that arrives while it is still being imported (its first tens of milliseconds) ending
rewheel with one line, never a KeyboardInterrupt traceback. (Before this module runs, the
interpreter's own start is the interpreter's.)"""


def main() -> None:
    try:
        from rewheel.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        import sys

        # What a Ctrl-C anywhere else says (rewheel.cli.handles_errors), and its exit code.
        sys.stderr.write("error: interrupted (Ctrl-C)\n")
        raise SystemExit(4) from None


if __name__ == "__main__":
    main()
