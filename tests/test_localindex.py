"""The local package index: PEP 503 HTML, PEP 691 JSON, per-commit sub-indexes, basic auth, the
`python -m devtools.localindex` entry point — and uv really installing from it."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devtools.localindex import JSON_TYPE, serve_index
from devtools.wheelbuild import build_wheel
from support_index import NIGHTLY, installed_version, toy_wheels

from support_env import REPO, make_venv, uv


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    return toy_wheels(tmp_path / "wheels")


def test_simple_html_lists_projects_and_files_with_sha256(wheels: Path) -> None:
    with serve_index(wheels) as idx, httpx.Client() as c:
        root = c.get(idx.url + "/")
        assert root.status_code == 200
        assert root.headers["content-type"].startswith("text/html")
        assert re.findall(r'href="([^"]+)"', root.text) == ["toyhelper/", "toypkg/"]

        page = c.get(idx.url + "/toypkg/")
        links = re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page.text)
        assert sorted(Path(u).name for u, _ in links) == [
            "toypkg-1.0.0-py3-none-any.whl", "toypkg-2.0.0-py3-none-any.whl"]
        for url, digest in links:
            assert url.startswith("/files/")
            body = c.get(idx.base + url).content
            assert hashlib.sha256(body).hexdigest() == digest
            assert body == (wheels / Path(url).name).read_bytes()


def test_json_when_the_client_asks_for_it(wheels: Path) -> None:
    with serve_index(wheels) as idx, httpx.Client() as c:
        uv_accept = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
        r = c.get(idx.url + "/toypkg/", headers={"Accept": uv_accept})
        assert r.headers["content-type"] == JSON_TYPE
        doc = r.json()
        assert doc["meta"]["api-version"] == "1.0" and doc["name"] == "toypkg"
        assert {f["filename"] for f in doc["files"]} == {"toypkg-1.0.0-py3-none-any.whl",
                                                          "toypkg-2.0.0-py3-none-any.whl"}
        assert all(len(f["hashes"]["sha256"]) == 64 for f in doc["files"])
        root = c.get(idx.url + "/", headers={"Accept": JSON_TYPE}).json()
        assert [p["name"] for p in root["projects"]] == ["toyhelper", "toypkg"]
        # HTML preferred by q-value: HTML it is.
        r = c.get(idx.url + "/toypkg/", headers={"Accept": f"{JSON_TYPE};q=0.1, text/html"})
        assert r.headers["content-type"].startswith("text/html")


def test_names_are_normalised_and_unknown_projects_are_404(wheels: Path) -> None:
    with serve_index(wheels) as idx, httpx.Client() as c:
        assert "toypkg-2.0.0" in c.get(idx.url + "/ToyPkg/").text
        assert c.get(idx.url + "/nothere/").status_code == 404
        assert c.get(idx.base + "/files/nothere-1.0-py3-none-any.whl").status_code == 404
        r = c.get(idx.url + "/toypkg")
        assert r.status_code == 301 and r.headers["location"] == "/simple/toypkg/"


def test_per_commit_sub_indexes_and_prefix_paths(tmp_path: Path) -> None:
    wheels = toy_wheels(tmp_path / "w", toypkg=("1.0.0",))
    old_sha, new_sha = "a1b2c3d4e5f6", "5719a4e4e0aa"
    build_wheel(wheels / old_sha, "toypkg", "1.0.0rc2.dev313+ga1b2c3d4e", {"toypkg/__init__.py": ""})
    build_wheel(wheels / new_sha, "toypkg", NIGHTLY, {"toypkg/__init__.py": ""})
    with serve_index(wheels, prefix_paths={"nightly": new_sha}) as idx, httpx.Client() as c:
        def files(base: str) -> list[str]:
            return [f["filename"] for f in
                    c.get(base + "/toypkg/", headers={"Accept": JSON_TYPE}).json()["files"]]

        assert files(idx.sub_url(old_sha)) == ["toypkg-1.0.0rc2.dev313+ga1b2c3d4e-py3-none-any.whl"]
        assert files(idx.sub_url(new_sha)) == [f"toypkg-{NIGHTLY}-py3-none-any.whl"]
        assert files(idx.sub_url("nightly")) == [f"toypkg-{NIGHTLY}-py3-none-any.whl"]
        assert files(idx.url) == ["toypkg-1.0.0-py3-none-any.whl"]
        assert c.get(idx.sub_url("0000000") + "/toypkg/").status_code == 404
        # A sub-index's file URL downloads that folder's wheel, "+" in the name and all.
        doc = c.get(idx.sub_url("nightly") + "/toypkg/", headers={"Accept": JSON_TYPE}).json()
        body = c.get(idx.base + doc["files"][0]["url"]).content
        assert body == (wheels / new_sha / f"toypkg-{NIGHTLY}-py3-none-any.whl").read_bytes()


def test_wheels_added_while_serving_are_offered(tmp_path: Path) -> None:
    wheels = toy_wheels(tmp_path / "w", toypkg=("1.0.0",))
    with serve_index(wheels) as idx, httpx.Client() as c:
        assert "toypkg-3.0.0" not in c.get(idx.url + "/toypkg/").text
        build_wheel(wheels, "toypkg", "3.0.0", {"toypkg/__init__.py": ""})
        assert "toypkg-3.0.0-py3-none-any.whl" in c.get(idx.url + "/toypkg/").text


def test_basic_auth_is_required_when_configured(wheels: Path) -> None:
    with serve_index(wheels, auth=("rewheel", "s3cret")) as idx, httpx.Client() as c:
        r = c.get(idx.url + "/toypkg/")
        assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]
        assert c.get(idx.url + "/toypkg/", auth=("rewheel", "wrong")).status_code == 401
        assert c.get(idx.url + "/toypkg/", auth=("rewheel", "s3cret")).status_code == 200
        # Credentials inside the URL, the way a recipe carries them.
        assert c.get(idx.with_auth() + "/toypkg/").status_code == 200


def test_uv_installs_from_a_per_commit_sub_index(tmp_path: Path) -> None:
    wheels = toy_wheels(tmp_path / "w")
    sha = "5719a4e4e0aa"
    build_wheel(wheels / sha, "toypkg", NIGHTLY, {"toypkg/__init__.py": ""}, requires=["toyhelper"])
    build_wheel(wheels / sha, "toyhelper", "1.1.0", {"toyhelper/__init__.py": ""})
    python = make_venv(tmp_path / "env")
    with serve_index(wheels) as idx:
        uv("pip", "install", "-q", "--python", str(python), "--index-url", idx.sub_url(sha),
           "--prerelease", "allow", "toypkg")
        served = [r.path for r in idx.requests if r.path.startswith("/files/")]
    assert installed_version(python, "toypkg") == NIGHTLY
    assert any(f"/files/{sha}/toypkg-" in p for p in served)


def test_module_entry_point_serves_until_terminated(tmp_path: Path) -> None:
    wheels = toy_wheels(tmp_path / "w")
    p = subprocess.Popen([sys.executable, "-m", "devtools.localindex", str(wheels), "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/simple", url), url
        r = httpx.get(url + "/toypkg/")
        assert r.status_code == 200 and "toypkg-2.0.0-py3-none-any.whl" in r.text
    finally:
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 0


def test_module_entry_point_rejects_a_missing_folder(tmp_path: Path) -> None:
    cp = subprocess.run([sys.executable, "-m", "devtools.localindex", str(tmp_path / "nope")],
                        capture_output=True, text=True, timeout=30, cwd=REPO)
    assert cp.returncode == 2 and "does not exist" in cp.stderr


def test_no_two_indexes_of_one_process_get_the_same_port(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv's cache keys a wheel by the index URL and the file name: an index on a port an earlier
    one had would serve its `toypkg-2.0.0` under the earlier one's cache entry. When the kernel
    offers a port again, it is held and another taken (a fake server class plays the kernel)."""
    import devtools.localindex as li

    offered = iter([40001, 40001, 40001, 40002])
    closed: list[int] = []

    class Kernel:
        def __init__(self, address: tuple[str, int], handler: object) -> None:
            self.server_address = (address[0], address[1] or next(offered))

        def server_close(self) -> None:
            closed.append(self.server_address[1])

    monkeypatch.setattr(li, "ThreadingHTTPServer", Kernel)
    monkeypatch.setattr(li, "_PORTS_GIVEN", set())
    first = li._bind("127.0.0.1", 0, object)  # type: ignore[arg-type]
    second = li._bind("127.0.0.1", 0, object)  # type: ignore[arg-type]
    assert (first.server_address[1], second.server_address[1]) == (40001, 40002)
    assert closed == [40001, 40001]  # the offers it refused were let go
    # An explicit port is what was asked for, given before or not.
    assert li._bind("127.0.0.1", 40001, object).server_address[1] == 40001  # type: ignore[arg-type]
    # And for real: two indexes one after the other, the first stopped, never share a port.
    monkeypatch.undo()
    with serve_index(wheels) as a:
        port = a.port
    with serve_index(wheels) as b:
        assert b.port != port
