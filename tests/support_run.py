"""The run-cycle fixture: a real venv on toypkg 1.0.0 from a real local index, a real model
server process started from that venv under the `command` manager, and a recipe for it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from support_env import make_venv, tree_state, uv_bin
from support_standins import free_port
from devtools.wheelbuild import build_wheel
import support_cli

SERVER = Path(__file__).parent / "services" / "toy_model_server.py"

# What each toypkg version does. "good": everything works; the others break one step.
VARIANTS: dict[str, dict[str, str]] = {
    "good": {"init": "return 'ok'", "load": "return 'ok'"},
    "smoke-fails": {
        "init": "from toypkg.layers import build_attention\n    return [build_attention(r) for r in range(8)]",
        "load": "return 'ok'"},
    "service-fails": {"init": "return 'ok'",
                      "load": "raise RuntimeError('CUDA error: no kernel image is available for execution on the device')"},
    "smoke-hangs": {"init": "import time\n    time.sleep(3600)", "load": "return 'ok'"},
    "never-healthy": {"init": "return 'ok'", "load": "return 'ok'", "healthy": "return False"},
    # The package cannot even be imported (a staged run rejects it before the stop).
    "import-fails": {"init": "return 'ok'", "load": "return 'ok'",
                     "import": "raise ImportError('libcudart.so.13: cannot open shared object file')\n"},
}

LAYERS = '''
class MLAAttention:
    def __init__(self, rank, q_lora_rank):
        if rank == 4:
            raise ValueError(f"q_lora_rank {q_lora_rank} must divide num_heads 7 on rank {rank}")


def build_attention(rank):
    print(f"(Worker_TP{rank} pid=1000{rank}) INFO building attention", flush=True)
    self_attn = MLAAttention(rank, q_lora_rank=1536)
    return self_attn
'''


def toypkg_files(version: str, variant: str, binary: bool = False) -> dict[str, str | bytes]:
    """`binary`: with `toypkg/_ops.so` too (never imported), a file snapshots share by a hard
    link where they copy the sources (`hand_editable`)."""
    v = VARIANTS[variant]
    files: dict[str, str | bytes] = {} if not binary else {
        "toypkg/_ops.so": b"\x7fELF\x02\x01\x01\x00toy kernels " + version.encode() + b"\x00" * 64}
    return files | {
        "toypkg/__init__.py": f'__version__ = "{version}"\n' + v.get("import", ""),
        "toypkg/core.py": (f"def init_model():\n    {v['init']}\n\n\ndef load_model():\n    {v['load']}\n\n\n"
                           f"def healthy():\n    {v.get('healthy', 'return True')}\n"),
        "toypkg/layers.py": LAYERS,
    }


def build_toypkg(folder: Path, version: str, variant: str = "good", binary: bool = False) -> Path:
    return build_wheel(folder, "toypkg", version, toypkg_files(version, variant, binary),
                       project_urls={"Source": "https://github.com/example/toypkg"})


@dataclass
class Host:
    """Everything a run needs, and a way to look at the service."""

    tmp: Path
    python: Path
    port: int
    wheels: Path
    index_url: str
    recipe: Path
    # Put before `python -m rewheel`: e.g. nsenter into a container that runs the service.
    exec_prefix: list[str] = field(default_factory=list)

    @property
    def prefix(self) -> Path:
        return self.python.parent.parent

    def state(self) -> dict[str, tuple]:
        return tree_state(self.prefix)

    def served_version(self) -> str | None:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=2)
            return r.json()["data"][0]["toypkg"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def write_recipe(self, **overrides: Any) -> Path:
        doc: dict[str, Any] = {
            "name": "toy",
            "environment": {"python": str(self.python)},
            "service": {"manager": "command",
                        "start": ["{python}", str(SERVER), "--port", str(self.port)],
                        "health_url": f"http://127.0.0.1:{self.port}/health",
                        "ready_timeout_s": 30, "stop_timeout_s": 10, "settle_s": 0.5,
                        "probe": {"url": f"http://127.0.0.1:{self.port}/v1/models", "expect": "toy/model"}},
            "install": {"packages": ["toypkg"], "index_url": self.index_url},
            "smoke": {"command": ["{python}", "-c", "import toypkg.core as c; c.init_model()"],
                      "timeout_s": 30},
        }
        for key, value in overrides.items():
            section, _, name = key.partition("__")
            if value is None and not name:
                doc.pop(section, None)
            elif value is None:
                doc[section].pop(name, None)
            elif name:
                doc.setdefault(section, {})[name] = value
            else:
                doc[section] = value
        self.recipe.write_text(tomli_w.dumps(doc))
        return self.recipe

    def rewheel(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
        return support_cli.rewheel(*args, prefix=list(self.exec_prefix), stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, timeout=timeout)

    def run_json(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
        cp = self.rewheel("run", str(self.recipe), "--yes", "--json", *args, env=env)
        try:
            doc = json.loads(cp.stdout) if cp.stdout.strip() else {}
        except ValueError:
            raise AssertionError(f"not JSON on stdout:\n{cp.stdout}\n{cp.stderr}") from None
        doc["_stderr"] = cp.stderr
        return cp.returncode, doc

    def start_service(self) -> None:
        """Start the service the way an operator's host has it running before an upgrade."""
        from rewheel.recipe import load_recipe
        from rewheel.commands import open_target
        from rewheel.service import make_manager, wait_ready

        t = open_target(load_recipe(self.recipe))
        assert t.recipe.service
        mgr = make_manager(t.recipe.service, t.store.env_dir, python=t.recipe.python)
        mgr.start()
        wait_ready(mgr, t.recipe.service, started_at=time.time())

    def stop_service(self) -> None:
        from rewheel.recipe import load_recipe
        from rewheel.commands import open_target
        from rewheel.service import make_manager

        t = open_target(load_recipe(self.recipe, check_interpreter=False))
        if t.recipe.service:
            make_manager(t.recipe.service, t.store.env_dir, python=t.recipe.python).stop(10)


def make_host(tmp: Path, new_version: str, variant: str, binary: bool = False) -> Host:
    from devtools.localindex import start_index

    wheels = tmp / "wheels"
    build_toypkg(wheels, "1.0.0", binary=binary)
    build_toypkg(wheels, new_version, variant, binary=binary)
    index = start_index(wheels)
    py = make_venv(tmp / "env")
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(py),
                    "--index-url", index.url, "toypkg==1.0.0"], check=True, capture_output=True)
    host = Host(tmp, py, free_port(), wheels, index.url, tmp / "toy.toml")
    host._index = index  # type: ignore[attr-defined]
    host.write_recipe()
    return host
