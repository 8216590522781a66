"""`.demo/rewheel ARGS`: run rewheel on what the demo left, with what its recipe needs.

The demo stops its toy index and its service when it ends (it leaves no process). Its
recipe still names that index and starts that service, which needs the demo's process
environment (`HF_HOME` for the model's config, `HF_HUB_OFFLINE`, rewheel's state in
`REWHEEL_HOME`, uv's cache). The demo writes `.demo/rewheel`, a script that runs this module:
it takes the demo's environment, serves the toy index again on the port the recipe names
for as long as the command runs, runs `rewheel ARGS` (so `check`, `rollback`, even another
`run` work as written), then stops the index. A service the command started (`rollback`
starts it) keeps running, as on a host; the next `make demo` ends it, and
`.demo/rewheel --stop-service` stops it now.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from devtools import REPO
from devtools.demo import stage as st
from devtools.demo import toyvllm as toy

SCRIPT_NAME = "rewheel"


def write_script(stage: Path) -> Path:
    """`<stage>/rewheel`: this module, under this interpreter, for this stage."""
    script = stage / SCRIPT_NAME
    script.write_text("#!/bin/sh\n"
                      "# rewheel on the demo's state, with the demo's environment and its toy index "
                      "(devtools/demo/lookaround.py)\n"
                      f"PYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} "
                      f"-m devtools.demo.lookaround {shlex.quote(str(stage))} \"$@\"\n")
    script.chmod(0o755)
    return script


def _index_port(recipe: Path) -> int | None:
    url = tomllib.loads(recipe.read_text()).get("install", {}).get("index_url")
    return urlsplit(url).port if url else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m devtools.demo.lookaround STAGE [rewheel arguments]", file=sys.stderr)
        return 2
    stage, args = Path(argv[0]).resolve(), argv[1:]
    env = st.demo_env(stage, os.environ)
    if args == ["--stop-service"]:
        # The service a look-around `rollback` started: the demo's own clean-up, now.
        from devtools.demo.__main__ import _kill, _stage_processes

        _kill(_stage_processes(stage))
        return 0
    recipe = stage / "demo.toml"
    index = None
    port = _index_port(recipe) if recipe.exists() else None
    if port is not None and (stage / "index").is_dir():
        from devtools.localindex import start_index

        idx = st.ToyIndex(stage / "index", toy.GOOD_SHA, toy.BAD_SHA)
        try:
            index = start_index(idx.root, port=port, prefix_paths=idx.prefix_paths)
        except OSError as exc:  # the port is taken now: run without the index, and say so
            print(f"[demo] cannot serve the toy index on port {port} again ({exc}); commands that "
                  "need it will say so", file=sys.stderr)
    try:
        return subprocess.call([sys.executable, "-m", "rewheel", *args], env=env)
    finally:
        if index is not None:
            index.stop()


if __name__ == "__main__":
    sys.exit(main())
