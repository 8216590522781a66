"""A series of real toy nightlies for `rewheel ci` and `rewheel bisect` tests: wheels versioned
like setuptools-scm nightlies (`1.0.0rc1.dev<N>+g<sha9>`), a smoke script that records every
run, a git repository whose commits the builds come from, and a stand-in for GitHub's compare
API on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import tomli_w

from devtools.wheelbuild import build_wheel

import support_cli

REPO_URLS = {"Source": "https://github.com/example/toypkg"}

# The smoke test: record the version under test, optionally kill the rewheel process that
# started it (an interruption at that moment), then initialise the "model".
SMOKE = '''
import os, signal, sys
import toypkg
count = sys.argv[1]
with open(count, "a") as f:
    f.write(toypkg.__version__ + "\\n")
kill_at = int(os.environ.get("TOY_KILL_PARENT_AT", "0"))
if kill_at and sum(1 for _ in open(count)) == kill_at:
    os.kill(os.getppid(), signal.SIGKILL)
from toypkg.core import init_model
init_model()
print("model initialised")
'''

CORE_GOOD = "def init_model():\n    return 'ok'\n"
CORE_BAD = '''
def build_attention(rank):
    print(f"(Worker_TP{rank} pid=1000{rank}) INFO building attention", flush=True)
    if rank == 4:
        raise ValueError(f"q_lora_rank 1536 must divide num_heads 7 on rank {rank}")


def init_model():
    for rank in range(8):
        build_attention(rank)
'''


def nightly_version(dev: int, sha: str) -> str:
    return f"1.0.0rc1.dev{dev}+g{sha[:9]}"


def fake_sha(i: int) -> str:
    import hashlib

    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def build_toypkg(folder: Path, version: str, *, bad: bool, uninstallable: bool = False,
                 helper: bool = False) -> Path:
    requires = ["toymissing>=1"] if uninstallable else (["toyhelper>=1"] if helper else [])
    return build_wheel(folder, "toypkg", version,
                       {"toypkg/__init__.py": f'__version__ = "{version}"\n',
                        "toypkg/core.py": CORE_BAD if bad else CORE_GOOD},
                       requires=requires, project_urls=REPO_URLS)


@dataclass
class Series:
    """n builds, oldest first; builds from `first_bad` on fail the smoke test."""

    versions: list[str]
    shas: list[str]
    first_bad: int
    count_file: Path
    smoke_script: Path

    def smoke_runs(self) -> list[str]:
        if not self.count_file.exists():
            return []
        return self.count_file.read_text().split()


def smoke_script(tmp: Path) -> tuple[Path, Path]:
    script = tmp / "smoke_toy.py"
    script.write_text(SMOKE)
    return script, tmp / "smoke-runs.txt"


def write_recipe(path: Path, *, install: dict[str, Any], script: Path, count: Path,
                 name: str = "toy") -> Path:
    doc = {"name": name, "environment": {"python": sys.executable},
           "install": {"packages": ["toypkg"], "prerelease": True, **install},
           "smoke": {"command": ["{python}", str(script), str(count)], "timeout_s": 60}}
    path.write_text(tomli_w.dumps(doc))
    return path


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    cp = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env,
                        check=True)
    return cp.stdout.strip()


def make_git_repo(repo: Path, n: int) -> list[str]:
    """A real repository with n commits; their full shas, oldest first."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    shas = []
    for i in range(n):
        (repo / "CHANGES").write_text(f"change {i}\n")
        git(repo, "add", "CHANGES")
        git(repo, "commit", "-q", "-m", f"change {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


@dataclass
class CompareApi:
    """GitHub's `GET /repos/{owner}/{repo}/compare/{base}...{head}` over a list of commits."""

    commits: list[str]
    requests: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> CompareApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                api.requests.append(self.path)
                parts = urlsplit(self.path)
                segs = parts.path.strip("/").split("/")
                if len(segs) != 5 or segs[0] != "repos" or segs[3] != "compare" or "..." not in segs[4]:
                    return self._send(404, {"message": "Not Found"})
                base, head = segs[4].split("...")
                ib = next((i for i, c in enumerate(api.commits) if c.startswith(base)), None)
                ih = next((i for i, c in enumerate(api.commits) if c.startswith(head)), None)
                if ib is None or ih is None:
                    return self._send(404, {"message": "Not Found"})
                between = api.commits[ib + 1: ih + 1]
                q = parse_qs(parts.query)
                per_page = int(q.get("per_page", ["250"])[0])
                page = int(q.get("page", ["1"])[0])
                chunk = between[(page - 1) * per_page: page * per_page]
                self._send(200, {"status": "ahead", "ahead_by": len(between),
                                 "total_commits": len(between),
                                 "base_commit": {"sha": api.commits[ib]},
                                 "commits": [{"sha": c, "commit": {"message": "x"}} for c in chunk]})

            def _send(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def rewheel(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=timeout)


def json_of(cp: subprocess.CompletedProcess) -> dict[str, Any]:
    try:
        return json.loads(cp.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {cp.returncode}):\n{cp.stdout}\n{cp.stderr}") from None
