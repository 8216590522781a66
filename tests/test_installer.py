"""The uv installer against real pieces: wheels built with devtools.wheelbuild, served by the local
index on 127.0.0.1, installed by uv into real venvs. No test touches the internet: every recipe
sets `index_url` to a local index (or a closed port)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest

from rewheel import installer
from rewheel.errors import InstallError, PreflightError, RecipeError, UsageError
from rewheel.installer import PlannedChange, redact
from devtools.localindex import serve_index
from devtools.wheelbuild import build_wheel
from support_index import (NIGHTLY, closed_port, installed_version, site_packages, toy_wheels,
                           write_recipe)

from support_env import make_venv, uv

SECRET = "s3cr3t-T0ken"


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    return toy_wheels(tmp_path / "wheels")


@pytest.fixture
def env_v1(tmp_path: Path, wheels: Path) -> Path:
    """A venv with toypkg 1.0.0 and toyhelper 1.0.0 (older than what the index offers)."""
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--no-index", "--find-links", str(wheels),
       "toypkg==1.0.0", "toyhelper==1.0.0")
    return python


# --- redaction -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("https://user:pa55@mirror.example/simple", "https://***@mirror.example/simple"),
    ("--index-url=https://ghp_abc123@host.example/simple/", "--index-url=https://***@host.example/simple/"),
    ("Failed to fetch `http://u:p%40ss@127.0.0.1:8080/simple/toypkg/` (401)",
     "Failed to fetch `http://***@127.0.0.1:8080/simple/toypkg/` (401)"),
    ("two: https://a:b@x.example/ and git+https://tok@y.example/r.git",
     "two: https://***@x.example/ and git+https://***@y.example/r.git"),
    ("uv masked it: http://user:****@127.0.0.1/simple", "uv masked it: http://***@127.0.0.1/simple"),
])
def test_redact_masks_userinfo_in_urls(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", [
    "Resolved 2 packages in 3ms", "mail ops@example.org about it",
    "https://mirror.example/simple/pkg@1.0/", " + toypkg==2.0.0"])
def test_redact_leaves_other_text_alone(text: str) -> None:
    assert redact(text) == text


# --- argv ------------------------------------------------------------------------------------

def test_install_argv_carries_every_recipe_option(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    r = write_recipe(tmp_path, "/usr/bin/python3", install={
        "packages": ["toypkg>=1", "Toy_Helper"], "index_url": "http://127.0.0.1:1/simple",
        "extra_index_urls": ["http://127.0.0.1:2/nightly"], "find_links": ["links"],
        "prerelease": True, "reinstall": "named", "uv_args": ["--torch-backend=auto"]})
    argv = installer.install_argv(r, uv="uv")
    assert argv[:3] == ["uv", "pip", "install"]
    assert argv[argv.index("--python") + 1] == str(r.python)
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--upgrade-package", "toypkg") in pairs and ("--upgrade-package", "toy-helper") in pairs
    assert ("--reinstall-package", "toypkg") in pairs and ("--reinstall-package", "toy-helper") in pairs
    assert "--reinstall" not in argv and "--upgrade" not in argv
    assert ("--index-url", "http://127.0.0.1:1/simple") in pairs
    assert ("--extra-index-url", "http://127.0.0.1:2/nightly") in pairs
    assert ("--find-links", str(links)) in pairs  # relative to the recipe's folder
    assert ("--prerelease", "allow") in pairs and ("--link-mode", "copy") in pairs
    assert "--no-progress" in argv and ("--color", "never") in pairs
    assert "--index-strategy" not in argv  # uv's default first-index: the extra index wins
    assert argv[-3:] == ["--torch-backend=auto", "toypkg>=1", "Toy_Helper"]
    assert "--dry-run" in installer.install_argv(r, uv="uv", dry_run=True)


def test_install_argv_reinstall_all_and_installed_names(tmp_path: Path) -> None:
    r = write_recipe(tmp_path, "/usr/bin/python3", install={
        "reinstall": "all", "uv_args": ["--link-mode=hardlink", "--prerelease=if-necessary"],
        "prerelease": True})
    argv = installer.install_argv(r, uv="uv", installed=["toypkg", "Extra_Dist", "other"])
    assert "--reinstall" in argv and "--reinstall-package" not in argv
    assert argv[-3:] == ["toypkg", "extra-dist", "other"]
    assert argv.count("toypkg") == 2  # --upgrade-package toypkg, and the requirement, once
    # The user's own --link-mode / --prerelease win over rewheel's defaults.
    assert "copy" not in argv and "allow" not in argv
    named = write_recipe(tmp_path / "n", "/usr/bin/python3", install={"reinstall": "named"})
    assert "extra-dist" not in installer.install_argv(named, uv="uv", installed=["extra-dist"])


def test_install_argv_with_a_lock_syncs_exactly_the_lock(tmp_path: Path) -> None:
    r = write_recipe(tmp_path, "/usr/bin/python3",
                     install={"index_url": "http://127.0.0.1:1/simple", "prerelease": True})
    argv = installer.install_argv(r, uv="uv", lock=tmp_path / "pylock.toml")
    assert argv[:3] == ["uv", "pip", "sync"] and argv[-1] == str(tmp_path / "pylock.toml")
    assert "toypkg" not in argv[-1:] and "--upgrade-package" not in argv
    assert "--prerelease" not in argv and ("--index-url" in argv)


def test_find_uv_is_the_bundled_uv() -> None:
    from uv import find_uv_bin

    assert installer.find_uv() == str(find_uv_bin())
    assert installer.uv_version()[0].isdigit()


# --- plan and install against a real index ------------------------------------------------------

def test_upgrade_to_newest_plan_then_install(tmp_path: Path, wheels: Path, env_v1: Path) -> None:
    with serve_index(wheels) as idx:
        r = write_recipe(tmp_path, env_v1, install={"index_url": idx.url, "reinstall": "named"})
        p = installer.plan(r)
        assert installed_version(env_v1, "toypkg") == "1.0.0"  # a plan changes nothing
        assert p.changes == [PlannedChange("toypkg", "1.0.0", "2.0.0")]
        assert p.changes[0].change == "upgrade" and p.resolved == 2
        assert p.to_json()["changes"] == [{"name": "toypkg", "old": "1.0.0", "new": "2.0.0",
                                           "change": "upgrade"}]
        lines: list[str] = []
        log = tmp_path / "run" / "install.log"
        res = installer.install(r, on_line=lines.append, log_path=log)
    assert installed_version(env_v1, "toypkg") == "2.0.0"
    assert installed_version(env_v1, "toyhelper") == "1.0.0"  # named: dependencies stay
    assert res.ok and res.changes == p.changes
    assert any(l.startswith("Installed 1 package") for l in lines)
    text = log.read_text()
    assert "+ toypkg==2.0.0" in text and text.startswith("[rewheel] $ ")
    assert res.to_json()["log_path"] == str(log)


def test_prerelease_only_when_the_recipe_allows_it(tmp_path: Path) -> None:
    wheels = toy_wheels(tmp_path / "nightly", toypkg=("0.9.0", "0.9.5", NIGHTLY))
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--no-index", "--find-links", str(wheels),
       "toypkg==0.9.0")
    with serve_index(wheels) as idx:
        stable = write_recipe(tmp_path / "a", python, install={"index_url": idx.url})
        assert installer.plan(stable).changes == [PlannedChange("toypkg", "0.9.0", "0.9.5")]
        pre = write_recipe(tmp_path / "b", python, install={"index_url": idx.url, "prerelease": True})
        assert installer.plan(pre).changes == [PlannedChange("toypkg", "0.9.0", NIGHTLY)]
        installer.install(pre)
    assert installed_version(python, "toypkg") == NIGHTLY


def _inode(python: Path, rel: str) -> tuple[int, int]:
    """Identity of the file now at `rel`: a rewrite creates a new file, and the filesystem may
    hand it the inode number just freed — but never the same change time."""
    st = (site_packages(python) / rel).stat()
    return st.st_ino, st.st_ctime_ns


def test_reinstall_all_rewrites_every_file_named_only_the_packages(
        tmp_path: Path, wheels: Path) -> None:
    build_wheel(wheels, "toyextra", "1.0.0", {"toyextra/__init__.py": "X = 1\n"})
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--no-index", "--find-links", str(wheels),
       "toypkg==2.0.0", "toyhelper==1.1.0", "toyextra==1.0.0")
    files = ["toypkg/core.py", "toyhelper/__init__.py", "toyextra/__init__.py"]
    with serve_index(wheels) as idx:
        named = write_recipe(tmp_path / "n", python, install={"index_url": idx.url,
                                                              "reinstall": "named"})
        before = {f: _inode(python, f) for f in files}
        installer.install(named)
        after = {f: _inode(python, f) for f in files}
        assert after["toypkg/core.py"] != before["toypkg/core.py"]
        assert after["toyhelper/__init__.py"] == before["toyhelper/__init__.py"]

        every = write_recipe(tmp_path / "a", python, install={"index_url": idx.url, "reinstall": "all"})
        plan = installer.plan(every)
        assert {c.name: c.change for c in plan.changes} == {"toypkg": "reinstall",
                                                             "toyhelper": "reinstall"}
        before = after
        installer.install(every)
        after = {f: _inode(python, f) for f in files}
        assert after["toypkg/core.py"] != before["toypkg/core.py"]
        assert after["toyhelper/__init__.py"] != before["toyhelper/__init__.py"]
        assert after["toyextra/__init__.py"] == before["toyextra/__init__.py"]  # not a dependency

        # "every installed package": pass the environment's distributions.
        before = after
        installer.install(every, installed=["toypkg", "toyhelper", "toyextra"])
        after = {f: _inode(python, f) for f in files}
        assert all(after[f] != before[f] for f in files)
    assert installed_version(python, "toyextra") == "1.0.0"


def test_a_patched_file_is_pristine_after_reinstall(tmp_path: Path, wheels: Path,
                                                    env_v1: Path) -> None:
    """The story's hand patches: the reinstall must not carry them over via uv's cache."""
    with serve_index(wheels) as idx:
        r = write_recipe(tmp_path, env_v1, install={"index_url": idx.url, "reinstall": "all"})
        installer.install(r)
        core = site_packages(env_v1) / "toypkg" / "core.py"
        pristine = core.read_text()
        with open(core, "a") as f:  # in place, as `>>` or an editor without backup does
            f.write("PATCHED = True\n")
        installer.install(r)
    assert core.read_text() == pristine


def test_keep_old_version_leaves_patched_distributions_alone(tmp_path: Path, wheels: Path,
                                                            env_v1: Path) -> None:
    """The `keep-old-version` patch policy: under reinstall = "all", a kept distribution is
    neither upgraded nor rewritten, so its local patch survives; everything else is."""
    helper = site_packages(env_v1) / "toyhelper" / "__init__.py"
    with open(helper, "a") as f:
        f.write("PATCHED = True\n")
    with serve_index(wheels) as idx:
        r = write_recipe(tmp_path, env_v1, install={"index_url": idx.url, "reinstall": "all"})
        keep = {"toyhelper": "1.0.0"}
        p = installer.plan(r, keep=keep)
        assert p.changes == [PlannedChange("toypkg", "1.0.0", "2.0.0")]
        assert "--reinstall" not in p.argv and "--constraints" in p.argv
        res = installer.install(r, keep=keep)
        assert res.changes == p.changes
        # A kept package that is itself one of the recipe's packages stays where it is.
        assert installer.plan(r, keep={"toypkg": "2.0.0", "toyhelper": "1.0.0"}).changes == []
    assert installed_version(env_v1, "toypkg") == "2.0.0"
    assert installed_version(env_v1, "toyhelper") == "1.0.0"
    assert helper.read_text().endswith("PATCHED = True\n")


def test_also_reinstall_rewrites_distributions_outside_the_named_packages(
        tmp_path: Path, wheels: Path) -> None:
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--no-index", "--find-links", str(wheels),
       "toypkg==2.0.0", "toyhelper==1.1.0")
    with serve_index(wheels) as idx:
        r = write_recipe(tmp_path, python, install={"index_url": idx.url, "reinstall": "named"})
        before = _inode(python, "toyhelper/__init__.py")
        res = installer.install(r, also_reinstall=["ToyHelper"])
    assert {c.name: c.change for c in res.changes} == {"toypkg": "reinstall",
                                                       "toyhelper": "reinstall"}
    assert _inode(python, "toyhelper/__init__.py") != before


def test_find_links_are_used(tmp_path: Path, env_v1: Path) -> None:
    index = toy_wheels(tmp_path / "index", toypkg=("1.0.0",))
    links = toy_wheels(tmp_path / "links", toypkg=("3.0.0",), toyhelper=())
    with serve_index(index) as idx:
        r = write_recipe(tmp_path, env_v1, install={"index_url": idx.url,
                                                    "find_links": [str(links)]})
        assert installer.plan(r).changes == [PlannedChange("toypkg", "1.0.0", "3.0.0")]
        installer.install(r)
    assert installed_version(env_v1, "toypkg") == "3.0.0"


def test_the_extra_index_wins_for_what_it_offers(tmp_path: Path, env_v1: Path) -> None:
    """vLLM nightlies: the nightly index's build must win, even over a "newer" default release."""
    default = toy_wheels(tmp_path / "default", toypkg=("1.0.0", "9.0.0"))
    nightly = tmp_path / "nightly"
    build_wheel(nightly, "toypkg", NIGHTLY, {"toypkg/__init__.py": ""}, requires=["toyhelper>=1"])
    with serve_index(default) as d, serve_index(nightly) as n:
        r = write_recipe(tmp_path, env_v1, install={
            "index_url": d.url, "extra_index_urls": [n.url], "prerelease": True,
            "reinstall": "all"})
        change, = [c for c in installer.plan(r).changes if c.name == "toypkg"]
        assert change.new == NIGHTLY
        installer.install(r)
        assert any(q.path.startswith("/files/toypkg-") for q in n.requests)
        assert not any(q.path.startswith("/files/toypkg-") for q in d.requests)
        assert any(q.path.startswith("/files/toyhelper-") for q in d.requests)
    assert installed_version(env_v1, "toypkg") == NIGHTLY
    assert installed_version(env_v1, "toyhelper") == "1.1.0"


def test_lock_installs_exactly_the_lock(tmp_path: Path, wheels: Path, env_v1: Path) -> None:
    build_wheel(wheels, "toyextra", "1.0.0", {"toyextra/__init__.py": ""})
    uv("pip", "install", "-q", "--python", str(env_v1), "--no-index", "--find-links", str(wheels),
       "toypkg==2.0.0", "toyextra")
    (tmp_path / "req.in").write_text("toypkg==1.0.0\ntoyhelper==1.1.0\n")
    with serve_index(wheels) as idx:
        uv("pip", "compile", "-q", "--index-url", idx.url, str(tmp_path / "req.in"),
           "-o", str(tmp_path / "pylock.toml"))
        # A lock kept under another name (lockfiles/nightly-dev344.toml) works as well.
        lock = tmp_path / "lockfiles" / "qualified.nightly.toml"
        lock.parent.mkdir()
        lock.write_text((tmp_path / "pylock.toml").read_text())
        r = write_recipe(tmp_path / "r", env_v1, install={"index_url": idx.url})
        p = installer.plan(r, lock=lock)
        assert {c.name: (c.old, c.new) for c in p.changes} == {
            "toypkg": ("2.0.0", "1.0.0"), "toyhelper": ("1.0.0", "1.1.0"), "toyextra": ("1.0.0", None)}
        assert p.lock == str(lock)
        res = installer.install(r, lock=lock)
    assert {c.name: c.change for c in res.changes} == {
        "toypkg": "downgrade", "toyhelper": "upgrade", "toyextra": "remove"}
    assert installed_version(env_v1, "toypkg") == "1.0.0"
    assert installed_version(env_v1, "toyextra") is None


def test_a_lock_that_is_not_a_lock_is_a_usage_error(tmp_path: Path, env_v1: Path) -> None:
    r = write_recipe(tmp_path, env_v1, install={"index_url": "http://127.0.0.1:9/simple"})
    bad = tmp_path / "pylock.toml"
    bad.write_text('name = "not a lock"\n')
    with pytest.raises(UsageError, match="not a PEP 751 lock"):
        installer.plan(r, lock=bad)
    with pytest.raises(UsageError, match="does not exist"):
        installer.install(r, lock=tmp_path / "missing.toml")


def test_a_requirement_that_does_not_exist(tmp_path: Path, wheels: Path, env_v1: Path) -> None:
    with serve_index(wheels) as idx:
        r = write_recipe(tmp_path, env_v1, install={
            "index_url": idx.url, "packages": ["toypkg", "toy-missing-dist>=2"]})
        with pytest.raises(PreflightError) as pre:
            installer.plan(r)
        with pytest.raises(InstallError) as exc:
            installer.install(r, log_path=tmp_path / "install.log")
    assert exc.value.exit_code == 1 and pre.value.exit_code == 2
    for err in (pre.value, exc.value):
        assert "toy-missing-dist" in err.message and "error:" in err.message
        assert err.hint and "package names" in err.hint
    assert str(tmp_path / "install.log") in exc.value.message
    assert installed_version(env_v1, "toypkg") == "1.0.0"


# --- credentials -----------------------------------------------------------------------------

def test_credentials_never_reach_output_logs_or_errors(tmp_path: Path, wheels: Path,
                                                       env_v1: Path) -> None:
    with serve_index(wheels, auth=("rewheel", SECRET)) as idx:
        url = idx.with_auth()
        assert SECRET in url
        r = write_recipe(tmp_path / "ok", env_v1, install={"index_url": url, "uv_args": ["-v"]})
        checks = installer.check_indexes(r)
        assert checks[0].ok and checks[0].found == ("toypkg",) and SECRET not in checks[0].url
        assert checks[0].summary() == f"index {redact(url)}: offers toypkg"
        lines: list[str] = []
        p = installer.plan(r, on_line=lines.append)
        res = installer.install(r, on_line=lines.append, log_path=tmp_path / "install.log")
        assert installed_version(env_v1, "toypkg") == "2.0.0"
        # uv gets the credentials in its environment: its command line names the bare URL.
        assert any(a == f"rewheel-index={idx.url}" for a in res.argv)
        bad = write_recipe(tmp_path / "bad", env_v1, install={
            "index_url": url, "packages": ["toypkg", "toy-missing-dist"]})
        with pytest.raises(PreflightError) as pre:
            installer.plan(bad, on_line=lines.append)
        with pytest.raises(InstallError) as exc:
            installer.install(bad, on_line=lines.append, log_path=tmp_path / "install.log")
        wrong = write_recipe(tmp_path / "wrong", env_v1, install={
            "index_url": idx.with_auth(password=SECRET + "x")})
        with pytest.raises(PreflightError) as denied:
            installer.check_indexes(wrong)
    assert f"rewheel-index={idx.url}" in pre.value.message  # the command it shows names the index
    assert "refused access" in denied.value.message and "***@" in denied.value.message
    seen = "\n".join([*lines, (tmp_path / "install.log").read_text(), str(p.to_json()),
                      str(res.to_json()), str(pre.value), str(exc.value), str(denied.value)])
    assert len(lines) > 10  # -v: uv talked a lot, and none of it leaked the secret
    assert SECRET not in seen


# --- index checks ----------------------------------------------------------------------------

def test_check_indexes_accepts_reachable_indexes(tmp_path: Path, wheels: Path) -> None:
    deps_only = toy_wheels(tmp_path / "deps", toypkg=())
    with serve_index(wheels) as a, serve_index(deps_only) as b:
        r = write_recipe(tmp_path, "/usr/bin/python3", install={
            "index_url": a.url, "extra_index_urls": [b.url + "/"], "find_links": [str(wheels)]})
        with httpx.Client(timeout=5) as client:
            checks = installer.check_indexes(r, client)
    assert [(c.kind, c.ok) for c in checks] == [("index", True), ("extra-index", True),
                                                ("find-links", True)]
    assert checks[0].found == ("toypkg",)
    assert checks[1].found == () and "none of toypkg" in checks[1].message  # holds dependencies
    assert checks[0].to_json()["url"] == a.url


def test_the_default_index_is_not_checked(tmp_path: Path) -> None:
    r = write_recipe(tmp_path, "/usr/bin/python3", install={})

    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    with httpx.Client(transport=httpx.MockTransport(refuse)) as client:
        assert installer.check_indexes(r, client) == []


def test_unreachable_index_is_a_preflight_error(tmp_path: Path) -> None:
    url = f"http://rewheel:{SECRET}@127.0.0.1:{closed_port()}/simple"
    r = write_recipe(tmp_path, "/usr/bin/python3", install={"index_url": url})
    with pytest.raises(PreflightError) as exc:
        installer.check_indexes(r)
    assert "unreachable" in exc.value.message and exc.value.exit_code == 2
    assert f"http://***@127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/simple" in exc.value.message
    assert SECRET not in str(exc.value)


def test_a_404_index_is_a_preflight_error(tmp_path: Path, wheels: Path) -> None:
    with serve_index(wheels) as idx:
        typo = idx.base + "/simpel"
        r = write_recipe(tmp_path, "/usr/bin/python3", install={"extra_index_urls": [typo]})
        with pytest.raises(PreflightError) as exc:
            installer.check_indexes(r)
    assert typo in exc.value.message and "HTTP 404" in exc.value.message


def test_an_index_that_does_not_speak_http(tmp_path: Path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def banner() -> None:
        conn, _ = srv.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    t = threading.Thread(target=banner, daemon=True)
    t.start()
    try:
        r = write_recipe(tmp_path, "/usr/bin/python3", install={
            "index_url": f"http://127.0.0.1:{srv.getsockname()[1]}/simple"})
        with pytest.raises(PreflightError, match="unreachable"):
            installer.check_indexes(r)
    finally:
        t.join(timeout=5)
        srv.close()


@pytest.mark.parametrize("key, value", [
    ("index_url", "ftp://mirror.example/simple"), ("index_url", "mirror.example/simple"),
    ("extra_index_urls", ["http:///nohost"])])
def test_a_bad_index_url_is_a_recipe_error(tmp_path: Path, key: str, value: object) -> None:
    r = write_recipe(tmp_path, "/usr/bin/python3", install={key: value})
    with pytest.raises(RecipeError) as exc:
        installer.check_indexes(r)
    assert exc.value.key is not None and exc.value.key.startswith(f"install.{key}")
    assert str(r.path) in exc.value.message and exc.value.exit_code == 2


def test_file_indexes_and_missing_find_links(tmp_path: Path) -> None:
    simple = tmp_path / "simple" / "toypkg"
    simple.mkdir(parents=True)
    r = write_recipe(tmp_path, "/usr/bin/python3", install={
        "index_url": (tmp_path / "simple").as_uri()})
    assert installer.check_indexes(r)[0].found == ("toypkg",)
    r = write_recipe(tmp_path, "/usr/bin/python3", install={"find_links": ["no-such-folder"]})
    with pytest.raises(PreflightError, match="no-such-folder"):
        installer.check_indexes(r)
