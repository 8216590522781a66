"""`rewheel bisect` against a real local index of real nightly wheels: the first bad build in
⌈log2(n)⌉ + 2 smoke runs or fewer, install failures skipped, per-commit indexes with commits
from a local git clone or a compare API on 127.0.0.1, and resuming after a kill."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from rewheel import nightly
from devtools.localindex import serve_index
from support_env import cmdlines
from support_nightly import (CompareApi, build_toypkg, fake_sha, json_of, make_git_repo,
                             nightly_version, rewheel, smoke_script, write_recipe)

N = 9


def bound(n: int) -> int:
    return math.ceil(math.log2(n)) + 2


@pytest.fixture
def flat_series(tmp_path: Path):
    """N nightlies on one PEP 503/691 index; builds from 6 on are bad; build 4 cannot be
    installed (it needs a package no index has)."""
    wheels = tmp_path / "wheels"
    shas = [fake_sha(i) for i in range(N)]
    versions = [nightly_version(300 + i, shas[i]) for i in range(N)]
    for i, v in enumerate(versions):
        build_toypkg(wheels, v, bad=i >= 6, uninstallable=i == 4)
    script, count = smoke_script(tmp_path)
    with serve_index(wheels) as index:
        recipe = write_recipe(tmp_path / "toy.toml", install={"index_url": index.url},
                              script=script, count=count)
        yield recipe, versions, count


def runs(count: Path) -> list[str]:
    return count.read_text().split() if count.exists() else []


def test_finds_the_first_bad_build_skipping_an_uninstallable_one(flat_series) -> None:
    recipe, versions, count = flat_series
    cp = rewheel("bisect", str(recipe), "--good", versions[0], "--bad", versions[-1], "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 0, cp.stderr
    assert doc["status"] == "found"
    assert doc["mode"] == "versions"
    assert doc["candidates"] == N
    assert doc["first_bad"]["version"] == versions[6]
    assert doc["last_good"]["version"] == versions[5]
    verdicts = {s["version"]: s["verdict"] for s in doc["steps"]}
    # good and bad were checked first, in that order of the report
    assert [s["version"] for s in doc["steps"][:2]] == [versions[-1], versions[0]]
    assert verdicts[versions[4]] == "skip"
    assert "toymissing" in next(s["reason"] for s in doc["steps"] if s["version"] == versions[4])
    smoke = runs(count)
    assert versions[4] not in smoke  # an install failure runs no smoke test
    assert len(smoke) == doc["smoke_runs"] <= bound(N)
    assert len(set(smoke)) == len(smoke)  # no build tested twice
    rc = doc["root_cause"]
    assert rc["type"] == "ValueError" and "must divide num_heads" in rc["message"]
    assert rc["frame"]["file"].endswith("toypkg/core.py")
    # The suspect: the file the first bad build changed, its hunk covering the raise.
    top = rc["suspects"][0]
    assert (top["path"], top["package"], top["change"], top["distance_lines"]) == \
        ("toypkg/core.py", "toypkg", "changed", 0)
    assert any("must divide num_heads" in h["text"] for h in top["hunks"])
    # both versions carry shas and the wheel names its GitHub repository
    assert doc["compare_url"] == (f"https://github.com/example/toypkg/compare/"
                                  f"{versions[5].split('+g')[1]}...{versions[6].split('+g')[1]}")
    # throwaway environments are gone
    assert not any((Path(doc["state_dir"]) / "envs").glob("*/venv"))


def test_good_that_is_not_good_exits_1(flat_series) -> None:
    recipe, versions, count = flat_series
    cp = rewheel("bisect", str(recipe), "--good", versions[7], "--bad", versions[8], "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 1, cp.stderr
    assert doc["status"] == "good-is-bad"
    assert versions[7] in doc["message"]
    assert doc["first_bad"] is None


def test_bad_arguments_exit_2(flat_series) -> None:
    recipe, versions, _ = flat_series
    cp = rewheel("bisect", str(recipe), "--good", versions[5], "--bad", versions[2], "--json")
    assert cp.returncode == 2
    assert "is not older than" in json_of(cp)["message"]
    cp = rewheel("bisect", str(recipe), "--good", "not-a-version", "--bad", versions[2])
    assert cp.returncode == 2
    assert "--good/--bad" in cp.stderr


def test_an_interrupted_bisect_resumes_without_retesting(flat_series) -> None:
    recipe, versions, count = flat_series
    args = ("bisect", str(recipe), "--good", versions[0], "--bad", versions[-1], "--json", "-q")
    # The third smoke run kills rewheel (SIGKILL) while it tests that build.
    first = rewheel(*args, env={"TOY_KILL_PARENT_AT": "3"})
    assert first.returncode == -9, (first.returncode, first.stderr)
    # The smoke test that killed it goes on for a moment, holding the lock: a command started
    # now is refused (exit 4, "wait until they end"), as it should be. Wait until it has ended.
    script = str(count.with_name("smoke_toy.py"))
    deadline = time.monotonic() + 60
    while any(script in line for _pid, line in cmdlines(skip={os.getpid()})):
        assert time.monotonic() < deadline, "the smoke test that killed rewheel is still running"
        time.sleep(0.05)
    before = runs(count)
    assert len(before) == 3
    second = rewheel(*args)
    doc = json_of(second)
    assert second.returncode == 0, second.stderr
    assert doc["first_bad"]["version"] == versions[6]
    resumed = [s["version"] for s in doc["steps"] if s["resumed"]]
    # the verdicts recorded before the kill are reused: bad, good, and the install failure
    assert before[:2] == [versions[-1], versions[0]]
    assert resumed == [versions[-1], versions[0], versions[4]]
    after = runs(count)[3:]
    assert before[0] not in after and before[1] not in after
    assert before[2] in after  # the build whose test was cut short is tested again
    assert len(after) == doc["smoke_runs"] <= bound(N) - 2
    # Running it once more answers from the journal alone.
    third = json_of(rewheel(*args))
    assert third["first_bad"]["version"] == versions[6] and third["smoke_runs"] == 0
    # Its root cause is read back from the journal as the object that was diagnosed.
    assert third["root_cause"] == doc["root_cause"] and third["root_cause"]["frame"]["file"]
    assert third["root_cause"]["suspects"][0]["path"] == "toypkg/core.py"  # frames kept in the journal
    bad = next(s for s in third["steps"] if s["verdict"] == "bad")
    assert bad["resumed"] and bad["root_cause"]["type"] == "ValueError"


@pytest.fixture
def commit_series(tmp_path: Path):
    """vLLM's layout: one index per commit (`/<sha>/`), `/nightly/` mirrors the newest only.
    Builds from commit 5 on are bad; commit 2 has no build."""
    shas = make_git_repo(tmp_path / "repo", N)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    versions = [nightly_version(100 + i, s) for i, s in enumerate(shas)]
    for i, (sha, v) in enumerate(zip(shas, versions, strict=True)):
        if i != 2:
            build_toypkg(wheels / sha, v, bad=i >= 5)
    script, count = smoke_script(tmp_path)
    with serve_index(wheels, prefix_paths={"nightly": wheels / shas[-1]}) as index:
        recipe = write_recipe(tmp_path / "toy.toml", script=script, count=count,
                              install={"index_url": index.url,
                                       "extra_index_urls": [f"{index.base}/nightly"]})
        yield recipe, shas, versions, count, index


def test_per_commit_indexes_with_commits_from_a_local_clone(commit_series, tmp_path: Path) -> None:
    recipe, shas, versions, count, index = commit_series
    cp = rewheel("bisect", str(recipe), "--good", versions[0], "--bad", versions[-1],
                 "--repo", str(tmp_path / "repo"), "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 0, cp.stderr
    assert doc["mode"] == "commits" and doc["commit_source"] == "git"
    assert doc["first_bad"]["commit"] == shas[5]
    assert doc["first_bad"]["version"] == versions[5]
    assert doc["last_good"]["commit"] == shas[4]
    assert doc["candidates"] == N
    assert len(runs(count)) == doc["smoke_runs"] <= bound(N)
    # older builds came from their own per-commit index, not from /nightly
    served = {r.path for r in index.requests}
    assert f"/{shas[4]}/toypkg/" in served
    assert doc["compare_url"] == f"https://github.com/example/toypkg/compare/{shas[4]}...{shas[5]}"


def test_commits_from_the_compare_api_named_by_the_project_urls(commit_series) -> None:
    recipe, shas, versions, count, _ = commit_series
    api = CompareApi(shas).start()
    try:
        cp = rewheel("bisect", str(recipe), "--good", versions[1], "--bad", versions[-1],
                     "--github-api", api.url, "--json", "-q")
    finally:
        api.stop()
    doc = json_of(cp)
    assert cp.returncode == 0, cp.stderr
    assert doc["commit_source"] == "github compare API"
    # the repository came from the bad build's Project-URLs; shas from the version labels
    assert api.requests and api.requests[0].startswith(
        f"/repos/example/toypkg/compare/{shas[1][:9]}...{shas[-1][:9]}")
    assert doc["first_bad"]["commit"] == shas[5]
    assert doc["candidates"] == N - 1
    assert len(runs(count)) == doc["smoke_runs"] <= bound(N - 1)


def test_compare_api_pages_and_git_rev_list_agree(tmp_path: Path) -> None:
    shas = make_git_repo(tmp_path / "repo", 8)
    api = CompareApi(shas).start()
    try:
        via_api = nightly.compare_commits("https://github.com/example/toypkg", shas[1][:9], shas[7][:9],
                                          api_url=api.url, per_page=2, token="")
    finally:
        api.stop()
    assert len(api.requests) == 3  # 6 commits, 2 per page
    via_git = nightly.git_commits(tmp_path / "repo", shas[1][:9], shas[7][:9])
    assert via_api.commits == via_git.commits == shas[2:8]
    assert via_api.base == via_git.base == shas[1]


def test_commit_index_base_and_pinning() -> None:
    from rewheel.recipe import InstallSpec, Recipe

    r = Recipe(name="x", python=Path("/p"), install=InstallSpec(
        packages=("vllm[audio]>=0.16.0rc2.dev0", "flashinfer-python"),
        extra_index_urls=("https://wheels.example/nightly",)))
    assert nightly.commit_index_base(r) == "https://wheels.example"
    assert nightly.pinned_packages(r, "vllm", "0.16.0rc2.dev330+gabc123def") == [
        "vllm[audio]==0.16.0rc2.dev330+gabc123def", "flashinfer-python"]
    scoped = nightly.scoped_recipe(r, Path("/tmp/venv/bin/python"), first_index="https://wheels.example/abc")
    assert scoped.install.extra_index_urls[0] == "https://wheels.example/abc"
    assert scoped.service is None and scoped.install.reinstall == "named"
