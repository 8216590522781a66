"""`rewheel bisect` refuses (exit 2) instead of a confident wrong answer when the recipe's
index cannot list the builds between good and bad, and takes prereleases as candidates only
when the recipe allows them. Real wheels on real local indexes; real smoke runs."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.localindex import serve_index
from support_nightly import build_toypkg, fake_sha, json_of, nightly_version, rewheel, smoke_script, write_recipe


def series(tmp: Path, n: int = 5) -> tuple[Path, list[str]]:
    wheels = tmp / "wheels"
    versions = [nightly_version(300 + i, fake_sha(i)) for i in range(n)]
    for i, v in enumerate(versions):
        build_toypkg(wheels, v, bad=i >= 2)
    return wheels, versions


def refused(cp, *words: str) -> dict:
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert "Traceback" not in cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["error"] == "UsageError" and "nothing was tested" in doc["hint"]
    for w in words:
        assert w in doc["message"], (w, doc["message"])
    return doc


def test_an_index_that_cannot_list_the_builds_is_refused(tmp_path: Path) -> None:
    wheels, versions = series(tmp_path)
    script, count = smoke_script(tmp_path)
    good, bad = versions[0], versions[-1]
    other = tmp_path / "other"
    build_toypkg(other, "0.1.0", bad=False)  # an index that has toypkg, but not this series
    empty = tmp_path / "empty"
    empty.mkdir()
    with serve_index(other) as other_index, serve_index(empty) as empty_index:
        # The nightlies are only reachable through find-links; the recipe names no index.
        r = write_recipe(tmp_path / "default.toml", install={"find_links": [str(wheels)]}, script=script, count=count)
        doc = refused(rewheel("bisect", str(r), "--good", good, "--bad", bad, "--json", "-q"),
                      "no index lists its builds", "default index is not asked")
        assert "index_url" in doc["hint"] and "--commit-index-base" in doc["hint"]
        # An index without the package.
        r = write_recipe(tmp_path / "empty.toml", install={"index_url": empty_index.url, "find_links": [str(wheels)]},
                         script=script, count=count)
        refused(rewheel("bisect", str(r), "--good", good, "--bad", bad, "--json", "-q"),
                "no index lists its builds", "has toypkg")
        # An index with the package, but not these builds.
        r = write_recipe(tmp_path / "other.toml", install={"index_url": other_index.url, "find_links": [str(wheels)]},
                         script=script, count=count)
        refused(rewheel("bisect", str(r), "--good", good, "--bad", bad, "--json", "-q"),
                f"does not list {good} or {bad}")
    assert not count.exists()  # nothing was installed or smoke-tested


def test_prereleases_only_when_the_recipe_allows_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    # 1.1.0rc1 is the first bad build; the first bad release is 1.1.0.
    for v, is_bad in (("1.0.0", False), ("1.1.0rc1", True), ("1.1.0", True), ("1.2.0", True)):
        build_toypkg(wheels, v, bad=is_bad)
    script, count = smoke_script(tmp_path)
    with serve_index(wheels) as index:
        r = write_recipe(tmp_path / "final.toml", install={"index_url": index.url}, script=script, count=count)
        # write_recipe allows prereleases: this recipe does not.
        text = r.read_text().replace("prerelease = true", "prerelease = false")
        r.write_text(text)
        cp = rewheel("bisect", str(r), "--good", "1.0.0", "--bad", "1.2.0", "--json", "-q")
        out = json_of(cp)
        assert cp.returncode == 0, cp.stderr
        assert out["candidates"] == 3 and out["first_bad"]["version"] == "1.1.0"
        assert "1.1.0rc1" not in count.read_text().split()
        # Naming a prerelease as an end when the recipe does not allow them: refused.
        refused(rewheel("bisect", str(r), "--good", "1.0.0", "--bad", "1.1.0rc1", "--json", "-q"),
                "1.1.0rc1", "prerelease")
        r.write_text(text.replace("prerelease = false", "prerelease = true"))
        cp = rewheel("bisect", str(r), "--good", "1.0.0", "--bad", "1.2.0", "--json", "-q", "--restart")
        out = json_of(cp)
        assert cp.returncode == 0, cp.stderr
        assert out["candidates"] == 4 and out["first_bad"]["version"] == "1.1.0rc1"
