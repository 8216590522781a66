"""The demo's stage: the toy nightly index, the service's environment with its hand-made
patch, the leftover debug dumps, the model's config, and the recipe — everything inside one
folder, so that the demo (and the tests that reuse these pieces) touch nothing else.

Layout of a stage folder (default `<repo>/.demo/`):

    index/<sha313>/vllm-…dev313….whl      per-commit indexes, like vLLM's wheel server
    index/<sha344>/vllm-…dev344….whl      (served with /nightly -> the newest commit)
    index/flashinfer_python-0.6.{3,4}….whl the "default index" stand-in
    env/                                  the service's virtualenv (made by uv)
    hf/hub/models--toy--Kimi-K2.5-mini/   the model's config.json, Hugging Face cache layout
    tmp/debug_*.pt                        leftover debug dumps ([cleanup] paths)
    home/                                 REWHEEL_HOME: snapshots, runs, the service's pid/log
    uv-cache/                             UV_CACHE_DIR: works offline, pollutes nothing
    demo.toml                             the recipe, from recipes/demo.toml with ports filled in
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devtools import REPO
from devtools.demo import toyvllm as toy
from devtools.wheelbuild import build_wheel
from rewheel import proc
from rewheel.installer import find_uv as uv_bin

LOCAL_PATCH_MARKER = "# LOCAL PATCH (ops, 2026-02-18)"
DEEPSEEK_REL = "vllm/model_executor/models/deepseek_v2.py"
WEIGHT_UTILS_REL = "vllm/model_executor/model_loader/weight_utils.py"
N_DUMPS = 35
RECIPE_TEMPLATE = REPO / "recipes" / "demo.toml"


@dataclass(frozen=True)
class ToyIndex:
    root: Path           # serve this folder
    good_sub: str        # per-commit sub-index holding dev313
    bad_sub: str         # per-commit sub-index holding dev344 (what /nightly mirrors)

    @property
    def prefix_paths(self) -> dict[str, str]:
        return {"nightly": self.bad_sub}


def build_index(root: str | os.PathLike[str]) -> ToyIndex:
    """Build the toy nightlies: vllm dev313 (good) and dev344 (bad), each in its per-commit
    folder, and flashinfer-python 0.6.3 / 0.6.4 at the top."""
    root = Path(root)
    for bad, version, sha in ((False, toy.GOOD_VERSION, toy.GOOD_SHA), (True, toy.BAD_VERSION, toy.BAD_SHA)):
        build_wheel(root / sha, "vllm", version, toy.toy_vllm_files(version, bad=bad),
                    requires=toy.toy_vllm_requires(bad), project_urls=toy.PROJECT_URLS,
                    console_scripts={"vllm": "vllm.entrypoints.cli.main:main"},
                    summary="A high-throughput and memory-efficient inference and serving engine for LLMs (toy build)")
    for version in (toy.FLASHINFER_GOOD, toy.FLASHINFER_BAD):
        build_wheel(root, "flashinfer-python", version, toy.toy_flashinfer_files(version),
                    project_urls={"Source": "https://github.com/flashinfer-ai/flashinfer"},
                    summary="FlashInfer: kernel library for LLM serving (toy build)")
    return ToyIndex(root, toy.GOOD_SHA, toy.BAD_SHA)


def demo_env(stage: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment every demo step runs with: state, caches and the model's
    config inside the stage; nothing inherited that could point uv at another index."""
    env = dict(base if base is not None else os.environ)
    for key in list(env):
        if key.startswith(("UV_INDEX", "UV_EXTRA_INDEX", "UV_DEFAULT_INDEX", "UV_FIND_LINKS",
                           "PIP_", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "HF_")):
            del env[key]
    env.update({
        "REWHEEL_HOME": str(stage / "home"),
        "UV_CACHE_DIR": str(stage / "uv-cache"),
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        "HF_HOME": str(stage / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(stage / "tmp-sys"),
        "NO_COLOR": "1",
    })
    (stage / "tmp-sys").mkdir(parents=True, exist_ok=True)
    return env


def create_env(stage: Path, index_url: str, sub_url: str, env: Mapping[str, str],
               python: str | None = None) -> Path:
    """`uv venv` + install vllm dev313 from its per-commit index. Returns the interpreter."""
    prefix = stage / "env"
    r = proc.run([uv_bin(), "venv", "-q", "--python", python or sys.executable, str(prefix)],
                 env=env, timeout=120)
    if not r.ok:
        raise RuntimeError(f"uv venv failed: {r.stderr or r.stdout}")
    py = prefix / "bin" / "python"
    r = proc.run([uv_bin(), "pip", "install", "-q", "--python", str(py), "--index-url", index_url,
                  "--extra-index-url", sub_url, "--prerelease", "allow",
                  f"vllm=={toy.GOOD_VERSION}"], env=env, timeout=300)
    if not r.ok:
        raise RuntimeError(f"uv pip install vllm=={toy.GOOD_VERSION} failed: {r.stderr or r.stdout}")
    return py


def site_packages(python: Path) -> Path:
    found = sorted((python.parent.parent / "lib").glob("python3*/site-packages"))
    if not found:
        raise RuntimeError(f"no site-packages under {python.parent.parent}/lib")
    return found[0]


def apply_local_patch(python: Path) -> list[Path]:
    """The operator's hand-made debugging edits in installed files (the story's patches):
    deepseek_v2.py dumps attention inputs, weight_utils.py logs skipped files."""
    site = site_packages(python)
    ds = site / DEEPSEEK_REL
    text = ds.read_text()
    anchor = "        self.self_attn = attn_cls(\n"
    if anchor not in text:
        raise RuntimeError(f"{ds}: patch anchor not found")
    text = text.replace(anchor,
                        f"        {LOCAL_PATCH_MARKER}: dump the attention config per layer to\n"
                        "        # /tmp for the gguf investigation; remove before upgrading.\n"
                        "        _debug_dump(f\"attn_{layer_idx}\", config)\n" + anchor, 1)
    text = text.replace("\nlogger = init_logger(__name__)\n",
                        "\nlogger = init_logger(__name__)\n\n\n"
                        f"{LOCAL_PATCH_MARKER}\n"
                        "def _debug_dump(name, obj):\n"
                        "    import os\n"
                        "    if os.environ.get(\"VLLM_DEBUG_DUMP\"):\n"
                        "        with open(f\"/tmp/{name}.pt\", \"w\") as f:\n"
                        "            f.write(repr(obj))\n", 1)
    ds.write_text(text)
    wu = site / WEIGHT_UTILS_REL
    wtext = wu.read_text()
    wtext = wtext.replace('_SKIP = (', f'{LOCAL_PATCH_MARKER}: also skip the consolidated .pth\n_SKIP = ("consolidated.pth", ', 1)
    wu.write_text(wtext)
    return [ds, wu]


def make_debug_dumps(stage: Path, n: int = N_DUMPS) -> list[Path]:
    """The 35 leftover `/tmp/*.pt` debug dumps of the story — in the stage's own tmp/."""
    tmp = stage / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = tmp / f"attn_dump_layer{i:02d}.pt"
        p.write_bytes(b"PK\x03\x04toy-tensor-dump" + bytes([i]) * 64)
        out.append(p)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_recipe(stage: Path, *, index_base: str, port: int,
                 template: Path = RECIPE_TEMPLATE) -> Path:
    """recipes/demo.toml with its two placeholders filled: the index's base URL and the
    service's port. Its relative paths are relative to the recipe, so it lives in the stage."""
    text = template.read_text()
    for key in ("@INDEX@", "@PORT@"):
        if key not in text:
            raise RuntimeError(f"{template}: placeholder {key} missing")
    text = text.replace("@INDEX@", index_base).replace("@PORT@", str(port))
    leftover = re.findall(r"@[A-Z_]+@", text)
    if leftover:
        raise RuntimeError(f"{template}: unknown placeholders {leftover}")
    out = stage / "demo.toml"
    out.write_text(text)
    return out
