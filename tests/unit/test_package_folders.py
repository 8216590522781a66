"""The package folders a patch scan walks (issue 44): which folders they are, how many files
their RECORDs list, how they are split between two processes, and an lstat as it travels
back from the second one. The walk itself, in one process and in two, on real environments:
tests/test_patches.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from rewheel.environment import Distribution, RecordEntry
from rewheel import package_folders
from rewheel.package_folders import PackageFolders, _portable

SITE = "/env/lib/python3.11/site-packages"


def dist(name: str, rels: list[str], *, editable: bool = False) -> Distribution:
    d = Distribution(name=name, display_name=name, version=None, version_text="1",
                     dist_info=Path(f"{SITE}/{name}-1.dist-info"), site=Path(SITE),
                     direct_url={"dir_info": {"editable": True}} if editable else None)
    # (a cached property, set as it would be read: absolute, normalised paths)
    d.__dict__["record"] = [RecordEntry(os.path.normpath(f"{SITE}/{r}"), "sha256=x", 1) for r in rels]
    return d


def test_the_folders_and_what_their_records_list() -> None:
    torch = dist("torch", ["torch/__init__.py", "torch/nn/a.py", "torch/nn/b.py", "torch-1.dist-info/RECORD",
                           "six.py", "../../../bin/torchrun", "__pycache__/six.cpython-311.pyc"])
    cublas = dist("nvidia-cublas", ["nvidia/cublas/lib/libcublas.so", "nvidia/__init__.py", "x.data/y"])
    nccl = dist("nvidia-nccl", ["nvidia/nccl/lib/libnccl.so"])
    mine = dist("mine", ["mine/a.py"], editable=True)
    f = PackageFolders([torch, cublas, nccl, mine])
    assert f.tops == {f"{SITE}/torch": torch, f"{SITE}/nvidia": cublas}  # a folder: its first distribution
    assert f.listed_in == {f"{SITE}/torch": 3, f"{SITE}/nvidia": 3}
    assert f.packaged == [torch, cublas, nccl]  # an editable install is its checkout: not walked


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(alphabet="abcdefgh", min_size=1, max_size=4), st.integers(0, 60_000), max_size=40))
def test_the_halves_take_every_folder_once_and_about_as_many_files(weights: dict[str, int]) -> None:
    f = PackageFolders([])
    tops = sorted(f"{SITE}/{t}" for t in weights)
    for t, w in weights.items():
        f.listed_in[f"{SITE}/{t}"] = w
    mine, theirs = f.halves(tops)
    assert sorted(mine + theirs) == tops and not set(mine) & set(theirs)
    assert mine == sorted(mine) and theirs == sorted(theirs)  # each in walk order
    load = [sum(f.listed_in[t] for t in half) for half in (mine, theirs)]
    # Largest first, each into the lighter half: the halves differ by at most the largest folder.
    assert abs(load[0] - load[1]) <= max(weights.values(), default=0)


def test_one_folder_is_walked_here_without_a_second_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`patches -p vllm`: one folder cannot be shared (a fork would start here and fail)."""
    site = tmp_path / "site-packages"
    (site / "vllm" / "sub").mkdir(parents=True)
    rels = ["vllm/__init__.py", "vllm/sub/a.py"]
    for rel in rels:
        (site / rel).write_text("x = 1\n")
    (site / "vllm" / "sub" / "unlisted.py").write_text("y = 2\n")
    d = Distribution(name="vllm", display_name="vllm", version=None, version_text="1",
                     dist_info=site / "vllm-1.dist-info", site=site)
    d.__dict__["record"] = [RecordEntry(str(site / rel), "sha256=x", 6) for rel in rels]
    d.__dict__["install_time_ns"] = time.time_ns() + 10**9
    monkeypatch.setattr(package_folders, "SHARE_MIN_FILES", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    f = PackageFolders([d])
    assert f.halves(sorted(f.tops)) == ([str(site / "vllm")], [])
    listed = {e.path: e for e in d.record}
    proven: set[str] = set()
    walked, extra = f.walk(listed, dict.fromkeys(listed, d), {}, proven)
    assert proven == set(listed) and [p for p, _st, _top in extra] == [str(site / "vllm/sub/unlisted.py")]
    assert walked == 3


def test_one_large_folder_and_many_small_ones() -> None:
    f = PackageFolders([])
    weights = {"torch": 15_000, "vllm": 3_000, "flashinfer": 6_000, **{f"small{i}": 100 for i in range(60)}}
    for t, w in weights.items():
        f.listed_in[t] = w
    mine, theirs = f.halves(sorted(weights))
    assert "torch" in mine and sum(f.listed_in[t] for t in theirs) == 15_000  # 9,000 + 6,000 small


def test_an_lstat_travels_back_whole(tmp_path: Path) -> None:
    import marshal

    p = tmp_path / "f"
    p.write_bytes(b"x" * 10)
    os.link(p, tmp_path / "g")
    for path in (p, tmp_path):
        st = os.lstat(path)
        back = os.stat_result(*marshal.loads(marshal.dumps(_portable(st))))
        assert back == st
        assert (back.st_mtime_ns, back.st_ctime_ns, back.st_ino, back.st_dev, back.st_nlink, back.st_size) == (
            st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_nlink, st.st_size)
