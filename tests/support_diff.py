"""Helpers for the diff and patch tests: real wheels for an upgrade story and for patching,
site-packages lookup, file edits done the two ways editors do them, and a second process
that fails."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.wheelbuild import build_wheel

VLLM_URLS = {"Homepage": "https://github.com/vllm-project/vllm",
             "Documentation": "https://docs.example.invalid/en/latest/"}
OLD_VLLM = "0.16.0rc2.dev313+g5719a4e4e"
NEW_VLLM = "0.16.0rc2.dev344+g1a2b3c4d5"

DS_OLD = '''"""DeepSeek-V2."""


class DeepseekV2DecoderLayer:
    def __init__(self, config, attn_cls):
        self.hidden_size = config.hidden_size
        self.self_attn = attn_cls(config)
        self.mlp = None
'''
DS_NEW = '''"""DeepSeek-V2."""


class DeepseekV2DecoderLayer:
    def __init__(self, config, attn_cls):
        self.hidden_size = config.hidden_size
        self.self_attn = attn_cls(config, prefix="self_attn")
        self.mlp = None
        self.use_mla = config.use_mla
'''
# 8 MiB of incompressible bytes that both versions ship unchanged: the stand-in for the
# gigabytes of CUDA kernels a diff must not read.
BIG = os.urandom(8 << 20)


def story_wheels(root: Path) -> tuple[Path, Path]:
    """Two wheelhouses: the environment before and after a nightly upgrade."""
    old, new = root / "old", root / "new"
    build_wheel(old, "minivllm", OLD_VLLM,
                {"minivllm/__init__.py": f'__version__ = "{OLD_VLLM}"\n',
                 "minivllm/models/deepseek_v2.py": DS_OLD,
                 "minivllm/old_only.py": "GONE = True\n",
                 "minivllm/_C.bin": BIG},
                project_urls=VLLM_URLS,
                store_over=1 << 20)
    build_wheel(new, "minivllm", NEW_VLLM,
                {"minivllm/__init__.py": f'__version__ = "{NEW_VLLM}"\n',
                 "minivllm/models/deepseek_v2.py": DS_NEW,
                 "minivllm/new_only.py": "NEW = 1\nNEWER = 2\n",
                 "minivllm/_C.bin": BIG},
                project_urls=VLLM_URLS,
                store_over=1 << 20)
    build_wheel(old, "toyflash", "0.6.3", {"toyflash/__init__.py": "V = '0.6.3'\n"})
    build_wheel(new, "toyflash", "0.6.4", {"toyflash/__init__.py": "V = '0.6.4'\n"})
    build_wheel(old, "downgrader", "2.0", {"downgrader/__init__.py": "V = 2\n"})
    build_wheel(new, "downgrader", "1.5", {"downgrader/__init__.py": "V = 1.5\n"})
    build_wheel(old, "olddep", "1.0", {"olddep/__init__.py": "\n"})
    build_wheel(new, "newdep", "1.0", {"newdep/__init__.py": "\n"})
    build_wheel(old, "rebuilt", "1.0", {"rebuilt/__init__.py": "BUILD = 'a'\n"})
    build_wheel(new, "rebuilt", "1.0", {"rebuilt/__init__.py": "BUILD = 'b'\n"})
    for d in (old, new):
        build_wheel(d, "steady", "1.0", {"steady/__init__.py": "S = 1\n"})
    build_wheel(old, "torchlike", "2.9.0+cu128", {"torchlike/__init__.py": "CUDA = '12.8'\n"})
    build_wheel(new, "torchlike", "2.9.0+cu130", {"torchlike/__init__.py": "CUDA = '12.8'\n"})
    return old, new


OLD_SET = ["minivllm==" + OLD_VLLM, "toyflash==0.6.3", "downgrader==2.0", "olddep==1.0",
           "rebuilt==1.0", "steady==1.0", "torchlike==2.9.0+cu128"]
NEW_SET = ["minivllm==" + NEW_VLLM, "toyflash==0.6.4", "downgrader==1.5", "newdep==1.0",
           "rebuilt==1.0", "steady==1.0", "torchlike==2.9.0+cu130"]

# patchme: a package to patch. 2.0 changes a line far from the local patch (merges
# cleanly), 3.0 changes the very line the patch changes (conflicts). loader.py never changes.
MODEL = '''"""Attention layers."""
VERSION = {version}


def build(config):
    layers = []
    for i in range(config.n):
        layers.append(i)
    return layers


def rank_alive(rank):
    {alive}
'''
LOADER = "def load(path):\n    return open(path).read()\n"


def model_source(version: int) -> str:
    alive = "return rank not in (4, 5)" if version >= 3 else "return rank != 4"
    return MODEL.format(version=version, alive=alive)


def patchme_wheels(folder: Path) -> Path:
    for v in (1, 2, 3):
        build_wheel(folder, "patchme", f"{v}.0",
                    {"patchme/__init__.py": f"VERSION = {v}\n",
                     "patchme/model.py": model_source(v),
                     "patchme/loader.py": LOADER,
                     "patchme/data/table.bin": bytes(range(256)) * 4},
                    project_urls={"Source": "https://github.com/example/patchme"},
                    console_scripts={"patchme-run": "patchme.model:build"})
    return folder


def site_packages(py: Path) -> Path:
    return next((py.parent.parent / "lib").glob("python3*/site-packages"))


def edit_in_place(path: Path, old: str, new: str) -> None:
    """Rewrite a file through its existing inode (what `open(..., "r+")` and many editors do)."""
    with open(path, "r+", encoding="utf-8") as f:
        text = f.read()
        assert old in text, f"{old!r} not in {path}"
        f.seek(0)
        f.write(text.replace(old, new))
        f.truncate()


def edit_by_replace(path: Path, old: str, new: str) -> None:
    """Write a new file and rename it over the old one (a new inode)."""
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.replace(old, new), encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def fails_in_a_forked_child(fn: Callable[..., Any], fault: str) -> Callable[..., Any]:
    """`fn`, but in a process forked from this one it dies sending nothing (`fault` "dies") or
    never answers ("hangs"): what a scan's second process must survive."""
    parent = os.getpid()

    def failing(*args: Any, **kw: Any) -> Any:
        if os.getpid() != parent:
            if fault == "dies":
                os._exit(9)
            time.sleep(600)
        return fn(*args, **kw)

    return failing
