"""Bad input, one table: every case runs the real CLI (`python -m rewheel ... --json`) and gets
a documented exit code, a message that names the key or value, exactly one JSON document on
stdout, no traceback — and nothing changed in the environment.

The unreadable file is a mode-000 file in the environment, read by a rewheel that lacks the
power to ignore file modes: as root, through `setpriv` dropping CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH (the situation of root on an NFS export with root_squash); as another
user, as it is. Disk-full cases use a real 2 MiB tmpfs (root, as in CI)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support_env import make_venv, tree_state, uv
from support_index import toy_wheels
import support_cli

Setup = Callable[["Ctx"], "Call"]


@dataclass
class Call:
    args: list[str]
    words: list[str]  # each must appear in the error message (or, exit 0, in the JSON)
    env: dict[str, str] = field(default_factory=dict)
    as_unprivileged: bool = False
    check: Callable[[dict[str, Any]], None] | None = None


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory):
    from devtools.localindex import start_index

    # Only the installed versions: a run reinstalls what is there and changes no byte.
    wheels = toy_wheels(tmp_path_factory.mktemp("wheels"), toypkg=("1.0.0",), toyhelper=("1.0.0",))
    server = start_index(wheels)
    yield server.url
    server.stop()


class Ctx:
    def __init__(self, tmp: Path, index_url: str) -> None:
        self.tmp = tmp
        self.index_url = index_url
        self._python: Path | None = None
        self.mounts: list[Path] = []

    def python(self) -> Path:
        if self._python is None:
            self._python = make_venv(self.tmp / "env")
            uv("pip", "install", "-q", "--python", str(self._python), "--index-url", self.index_url,
               "toypkg==1.0.0")
        return self._python

    @property
    def site(self) -> Path:
        return next((self.python().parent.parent / "lib").glob("python3*/site-packages"))

    @property
    def home(self) -> Path:
        return Path(os.environ["REWHEEL_HOME"])

    def recipe(self, extra: str = "", *, python: str | None = None, name: str = "r.toml") -> Path:
        path = self.tmp / name
        path.write_text(f'[environment]\npython = "{python or self.python()}"\n'
                        f'[install]\npackages = ["toypkg"]\nindex_url = "{self.index_url}"\n{extra}',
                        encoding="utf-8")
        return path

    def state_of_env(self) -> dict[str, tuple]:
        prefix = self.python().parent.parent
        # What a reinstall of the same version rewrites without changing a byte that matters:
        # uv's bookkeeping of its cache.
        return {k: v for k, v in tree_state(prefix).items() if not k.endswith("uv_cache.json")}

    def tmpfs(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)]).returncode != 0:
            pytest.fail("mounting a 2 MiB tmpfs needs root (as in CI)")
        self.mounts.append(d)
        return d

    def cli(self, *args: str, env: dict[str, str] | None = None,
            unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
        prefix = []
        if unprivileged and os.geteuid() == 0:
            prefix = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                      "--bounding-set=-dac_override,-dac_read_search"]
        return support_cli.rewheel(*args, prefix=prefix, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, timeout=300)


def one_document(stdout: str) -> dict[str, Any]:
    text = stdout.strip()
    doc, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", f"more than one JSON document on stdout:\n{stdout}"
    assert isinstance(doc, dict)
    return doc


def system_python() -> str:
    """An interpreter that is neither a venv nor a conda env: the machine's own."""
    for cand in ("/usr/bin/python3", os.path.join(sys.base_prefix, "bin", "python3")):
        if os.path.exists(cand):
            probe = subprocess.run([cand, "-c", "import sys; print(sys.prefix == sys.base_prefix)"],
                                   capture_output=True, text=True)
            prefix = Path(os.path.realpath(cand)).parent.parent
            if probe.stdout.strip() == "True" and not (prefix / "conda-meta").exists():
                return cand
    pytest.fail("no system interpreter on this machine")


# --- the cases --------------------------------------------------------------------------------

def python_folder(c: Ctx) -> Call:
    (c.tmp / "folder").mkdir()
    return Call(["history", "--python", str(c.tmp / "folder")], ["--python", str(c.tmp / "folder")])


def python_empty(c: Ctx) -> Call:
    return Call(["history", "--python", ""], ["--python", "empty"])


def python_text_file(c: Ctx) -> Call:
    p = c.tmp / "notes.txt"
    p.write_text("not an interpreter\n")
    return Call(["snapshot", "--python", str(p)], [str(p)])


def python_text_file_executable(c: Ctx) -> Call:
    p = c.tmp / "python"
    p.write_text("not an interpreter\n")
    p.chmod(0o755)
    return Call(["history", "--python", str(p)], [str(p)])


def home_is_a_file(c: Ctx) -> Call:
    f = c.tmp / "home-file"
    f.write_text("")
    return Call(["history", "--python", str(c.python())], ["REWHEEL_HOME", str(f)],
                env={"REWHEEL_HOME": str(f)})


def store_is_a_file(c: Ctx) -> Call:
    f = c.tmp / "store-file"
    f.write_text("")
    return Call(["history", str(c.recipe(f'[snapshots]\nstore = "{f}"\n'))], ["snapshots.store", str(f)])


def home_under_proc(c: Ctx) -> Call:
    return Call(["snapshot", "--python", str(c.python())], ["REWHEEL_HOME", "/proc"],
                env={"REWHEEL_HOME": "/proc/rewheel-home"})


def store_under_proc(c: Ctx) -> Call:
    return Call(["history", str(c.recipe('[snapshots]\nstore = "/proc/self/rewheel"\n'))],
                ["snapshots.store", "/proc"])


def home_world_writable(c: Ctx) -> Call:
    d = c.tmp / "shared"
    d.mkdir()
    d.chmod(0o777)

    def mode_kept(_doc: dict[str, Any]) -> None:
        assert stat.S_IMODE(d.stat().st_mode) == 0o777 and not any(d.iterdir())

    return Call(["history", "--python", str(c.python())], ["REWHEEL_HOME", str(d), "world-writable"],
                env={"REWHEEL_HOME": str(d)}, check=mode_kept)


def deep_toml(c: Ctx) -> Call:
    p = c.tmp / "deep.toml"
    p.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    return Call(["check", str(p)], [str(p), "nested"])


def service_key(key: str, value: str, *, quoted: bool = False) -> Setup:
    """`check` of a recipe whose [service] KEY is VALUE (a TOML string when `quoted`)."""
    def setup(c: Ctx) -> Call:
        toml = f'"{value}"' if quoted else value
        r = c.recipe(f'[service]\nmanager = "command"\nstart = ["true"]\n{key} = {toml}\n')
        return Call(["check", str(r)], [f"service.{key}", value])
    return setup


def long_snapshot_id(c: Ctx) -> Call:
    ref = "a" * 5000
    return Call(["rollback", "--python", str(c.python()), ref, "--yes"], [ref[:40], "5,000 characters"])


def empty_snapshot_ref(c: Ctx) -> Call:
    # A snapshot exists, and the environment has changed since: an empty reference must not
    # restore the default snapshot.
    assert c.cli("snapshot", "--python", str(c.python())).returncode == 0
    (c.site / "toypkg" / "added.py").write_text("X = 1\n")
    return Call(["rollback", "--python", str(c.python()), "", "--yes"], ["SNAPSHOT", "empty"])


def patched_files(*rel: bytes) -> Callable[[dict[str, Any]], None]:
    def check(doc: dict[str, Any]) -> None:
        # The toy index has no newer toypkg: reinstalled at the same version (not "upgraded").
        assert doc["status"] == "reinstalled"
        paths = [os.fsencode(p["path"]) for p in doc["patches"]]
        for r in rel:
            assert r in paths, paths
        assert len(doc["patch_files"]) >= len(rel)
        for f in doc["patch_files"]:
            assert os.path.isfile(os.fsencode(f)) and len(os.path.basename(os.fsencode(f))) <= 255
    return check


def non_utf8_name(c: Ctx) -> Call:
    (c.site / "toypkg").joinpath(os.fsdecode(b"caf\xe9-debug.py")).write_text("DEBUG = 1\n")
    return Call(["run", str(c.recipe()), "--yes"], [], check=patched_files(b"toypkg/caf\xe9-debug.py"))


def long_path(c: Ctx) -> Call:
    deep = c.site / "toypkg" / ("d" * 120) / ("e" * 120) / ("f" * 120)
    deep.mkdir(parents=True)
    (deep / ("g" * 100 + ".py")).write_text("G = 1\n")
    rel = "/".join(["toypkg", "d" * 120, "e" * 120, "f" * 120, "g" * 100 + ".py"]).encode()
    return Call(["run", str(c.recipe()), "--yes"], [], check=patched_files(rel))


def disk_full_snapshot(c: Ctx) -> Call:
    small = c.tmpfs("small")
    (c.site / "toypkg" / "cache.bin").write_bytes(os.urandom(3 << 20))  # no RECORD lists it: copied

    def no_leftover(_doc: dict[str, Any]) -> None:
        left = [p for p in small.rglob("*") if p.name.startswith(".tmp-")]
        assert not left, left

    return Call(["snapshot", "--python", str(c.python())], ["no space left", str(small)],
                env={"REWHEEL_HOME": str(small / "home")}, check=no_leftover)


def disk_full_journal(c: Ctx) -> Call:
    small = c.tmpfs("small")
    home = {"REWHEEL_HOME": str(small / "home")}
    assert c.cli("snapshot", "--python", str(c.python()), env=home).returncode == 0
    (c.site / "toypkg" / "added.py").write_text("X = 1\n")  # so that a rollback would act
    with open(small / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass

    def not_left_interrupted(_doc: dict[str, Any]) -> None:
        (small / "filler").unlink()
        cp = c.cli("history", "--python", str(c.python()), "--json", env=home)
        assert cp.returncode == 0, cp.stdout + cp.stderr  # no journal left to read as interrupted

    return Call(["rollback", "--python", str(c.python()), "--yes"], ["journal", "No space left"],
                env=home, check=not_left_interrupted)


def unreadable_file(c: Ctx) -> Call:
    secret = c.site / "toypkg" / "secret.bin"
    secret.write_bytes(b"key\n")
    secret.chmod(0)
    return Call(["snapshot", "--python", str(c.python())], ["cannot read", str(secret)],
                as_unprivileged=True)


def cleanup_matches_state(c: Ctx) -> Call:
    return Call(["run", str(c.recipe(f'[cleanup]\npaths = ["{c.home}"]\n')), "--yes"],
                ["[cleanup] paths", str(c.home)])


def cleanup_glob(value: str, command: str = "check", *, shown: str | None = None) -> Setup:
    """A `[cleanup] paths` glob that could only match system files: refused by `check`, by
    `run --dry-run` and by `run`, naming the key and the glob; nothing moved."""
    def setup(c: Ctx) -> Call:
        args = {"check": ["check"], "dry-run": ["run", "--dry-run", "--yes"], "run": ["run", "--yes"]}[command]
        return Call([*args, str(c.recipe(f'[cleanup]\npaths = ["{value}"]\n'))],
                    ["cleanup.paths[0]", shown or value], check=system_files_untouched)
    return setup


def system_files_untouched(_doc: dict[str, Any]) -> None:
    assert Path("/etc/hostname").exists() and Path("/etc/passwd").exists()


def cleanup_match_through_symlink(c: Ctx) -> Call:
    """The glob lies in a temporary folder, but what it matches is /etc's, through a link."""
    (c.tmp / "dumps").symlink_to("/etc")
    return Call(["run", "--yes", str(c.recipe(f'[cleanup]\npaths = ["{c.tmp}/dumps/hostnam?"]\n'))],
                ["[cleanup] paths", "/etc/hostname", "inside the system folder /etc"], check=system_files_untouched)


def cleanup_folder_relinked(c: Ctx) -> Call:
    """A run stashed .../u/x.pt; `u` was then replaced by a link to another folder: rollback
    must not write through it (it would write /etc/x.pt with a link to /etc)."""
    (c.tmp / "u").mkdir()
    (c.tmp / "u" / "x.pt").write_bytes(b"dump")
    recipe = c.recipe(f'[cleanup]\npaths = ["{c.tmp}/u/*.pt"]\n')
    first = c.cli("run", str(recipe), "--yes", "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (c.tmp / "u" / "x.pt").exists()
    (c.tmp / "u").rmdir()
    victim = c.tmp / "victim"
    victim.mkdir()
    (c.tmp / "u").symlink_to(victim)
    snap = json.loads(first.stdout)["snapshot_id"]

    def nothing_written(_doc: dict[str, Any]) -> None:
        assert not any(victim.iterdir())

    return Call(["rollback", str(recipe), snap, "--yes"], [f"{c.tmp}/u/x.pt", f"{c.tmp}/u", str(victim)],
                check=nothing_written)


def exclude_takes_everything(c: Ctx) -> Call:
    return Call(["check", str(c.recipe('[snapshots]\nexclude = ["?*"]\n'))],
                ["snapshots.exclude", "?*", "would leave bin out"])


def exclude_takes_a_package(command: str) -> Setup:
    """A glob no sample path shows to be wrong, but that names an installed package's folder:
    refused when the snapshot would be taken (run: at its preflight, before the stop)."""
    def setup(c: Ctx) -> Call:
        r = c.recipe('[snapshots]\nexclude = ["toyp?g"]\n')
        args = ["run", str(r), "--yes"] if command == "run" else ["snapshot", str(r)]
        rel = str(c.site.relative_to(c.python().parent.parent) / "toypkg")
        return Call(args, ["[snapshots] exclude", "toyp?g", rel])
    return setup


def home_inside_prefix(where: str) -> Setup:
    """REWHEEL_HOME or [snapshots] store inside the environment (or through a link into it):
    refused before the folder is made."""
    def setup(c: Ctx) -> Call:
        prefix = c.python().parent.parent
        inside = {"prefix": prefix / "rewheel-state", "site": c.site / "rewheel-store"}.get(where)
        if where == "link":
            (c.tmp / "state-link").symlink_to(c.site)
            inside = c.tmp / "state-link" / "store"
        assert inside is not None

        def not_made(_doc: dict[str, Any]) -> None:
            assert not os.path.lexists(inside)

        if where == "site":
            return Call(["snapshot", str(c.recipe(f'[snapshots]\nstore = "{inside}"\n'))],
                        ["snapshots.store", str(inside), "inside the environment", str(prefix)], check=not_made)
        return Call(["snapshot", "--python", str(c.python())], ["REWHEEL_HOME", str(inside), "inside the environment"],
                    env={"REWHEEL_HOME": str(inside)}, check=not_made)
    return setup


def home_dangling_symlink(c: Ctx) -> Call:
    link = c.tmp / "home-link"
    link.symlink_to(c.tmp / "gone")
    return Call(["history", "--python", str(c.python())], ["REWHEEL_HOME", str(link), "does not exist"],
                env={"REWHEEL_HOME": str(link)})


def index_url_newline(c: Ctx) -> Call:
    r = c.tmp / "nl.toml"
    r.write_text(f'[environment]\npython = "{c.python()}"\n[install]\npackages = ["toypkg"]\n'
                 f'index_url = "{c.index_url}\\n--extra-index-url=http://127.0.0.1:9/simple"\n')
    return Call(["run", str(r), "--yes"], ["install.index_url", "control character"])


def restore_lanes(value: str) -> Setup:
    def setup(c: Ctx) -> Call:
        return Call(["rollback", "--python", str(c.python()), "--yes"], ["REWHEEL_RESTORE_LANES", repr(value)],
                    env={"REWHEEL_RESTORE_LANES": value})
    return setup


def dry_run_with(flag: str) -> Setup:
    def setup(c: Ctx) -> Call:
        return Call(["run", str(c.recipe()), "--dry-run", flag, "--yes"], ["--dry-run", flag])
    return setup


def ci_promote_into_proc(c: Ctx) -> Call:
    r = c.recipe('[smoke]\ncommand = ["{python}", "-c", "pass"]\n')
    return Call(["ci", str(r), "--promote", "--lockfiles", "/proc"], ["--lockfiles /proc", "pseudo-filesystem"])


def _env_state_dir(c: Ctx) -> Path:
    return next((c.home / "envs").iterdir())


def meta_json_wrong_types(c: Ctx) -> Call:
    doc = json.loads(c.cli("snapshot", "--python", str(c.python()), "--json").stdout)
    meta = Path(doc["path"]) / "meta.json"
    m = json.loads(meta.read_text())
    m["created"], m["files"] = "yesterday", "many"
    meta.write_text(json.dumps(m))
    return Call(["rollback", "--python", str(c.python()), doc["id"], "--yes"], [doc["id"], "meta.json", "created"])


def journal_is_a_folder(c: Ctx) -> Call:
    assert c.cli("snapshot", "--python", str(c.python())).returncode == 0
    bad = _env_state_dir(c) / "runs" / "20260101-000000-abcd" / "journal.jsonl"
    bad.mkdir(parents=True)
    return Call(["history", "--python", str(c.python())], [str(bad), "not a regular file"])


def system_run(c: Ctx) -> Call:
    py = system_python()
    return Call(["run", str(c.recipe(python=py)), "--yes"], [py, "environment.system"])


def system_rollback(c: Ctx) -> Call:
    py = system_python()
    return Call(["rollback", "--python", py, "--yes"], [py, "system interpreter"])


def system_resume(c: Ctx) -> Call:
    py = system_python()
    return Call(["resume", "--python", py, "--yes"], [py, "system interpreter"])


def missing_ca_bundle(command: str) -> Setup:
    """SSL_CERT_FILE naming a file that is gone (an image that moved its CA bundle)."""
    def setup(c: Ctx) -> Call:
        gone = str(c.tmp / "moved" / "ca-certificates.crt")
        service = ('[service]\nmanager = "command"\nstart = ["{python}", "-m", "http.server", "1"]\n'
                   'health_url = "http://127.0.0.1:1/health"\n')
        recipe = str(c.recipe(service))
        if command == "rollback":  # something to roll back to
            assert c.cli("snapshot", recipe, "--json").returncode == 0
        return Call([command, recipe, *(["--yes"] if command != "smoke" else [])],
                    ["SSL_CERT_FILE", gone], env={"SSL_CERT_FILE": gone})
    return setup


CASES: list[tuple[str, Setup, int]] = [
    ("python-is-a-folder", python_folder, 2),
    ("python-is-empty", python_empty, 2),
    ("python-is-a-text-file", python_text_file, 2),
    ("python-is-an-executable-text-file", python_text_file_executable, 2),
    ("home-is-a-file", home_is_a_file, 2),
    ("store-is-a-file", store_is_a_file, 2),
    ("home-under-proc", home_under_proc, 2),
    ("store-under-proc", store_under_proc, 2),
    ("home-world-writable-without-sticky-bit", home_world_writable, 2),
    ("deeply-nested-toml", deep_toml, 2),
    ("settle_s-negative", service_key("settle_s", "-3"), 2),
    ("settle_s-nan", service_key("settle_s", "nan"), 2),
    ("settle_s-inf", service_key("settle_s", "inf"), 2),
    ("snapshot-id-5000-characters", long_snapshot_id, 2),
    ("empty-snapshot-reference", empty_snapshot_ref, 2),
    ("non-utf8-file-name-in-a-package", non_utf8_name, 0),
    ("very-long-path-in-a-package", long_path, 0),
    ("disk-full-writing-a-snapshot", disk_full_snapshot, 2),
    ("disk-full-writing-the-journal", disk_full_journal, 2),
    ("unreadable-file-in-the-environment", unreadable_file, 2),
    ("cleanup-glob-matches-the-state-folder", cleanup_matches_state, 2),
    ("cleanup-glob-etc-star-check", cleanup_glob("/etc/*"), 2),
    ("cleanup-glob-etc-star-dry-run", cleanup_glob("/etc/*", "dry-run"), 2),
    ("cleanup-glob-root-star-run", cleanup_glob("/root/*", "run"), 2),
    ("cleanup-glob-var-lib-star", cleanup_glob("/var/lib/*"), 2),
    ("cleanup-glob-usr-lib-so", cleanup_glob("/usr/lib/*.so", "dry-run"), 2),
    ("cleanup-glob-run-lock", cleanup_glob("/run/lock"), 2),
    ("cleanup-glob-relative-escape", cleanup_glob("../../../../../../../../etc/hostname", shown="/etc/hostname"), 2),
    ("cleanup-glob-root-folder", cleanup_glob("/"), 2),
    ("cleanup-glob-home-tilde", cleanup_glob("~", shown=os.path.expanduser("~")), 2),
    ("cleanup-glob-boot", cleanup_glob("/boot"), 2),
    ("cleanup-glob-top-level-star", cleanup_glob("/*", "run"), 2),
    ("cleanup-match-through-a-symlink-into-etc", cleanup_match_through_symlink, 2),
    ("cleanup-folder-relinked-before-rollback", cleanup_folder_relinked, 2),
    ("home-inside-the-prefix", home_inside_prefix("prefix"), 2),
    ("store-inside-site-packages", home_inside_prefix("site"), 2),
    ("home-inside-the-prefix-through-a-symlink", home_inside_prefix("link"), 2),
    ("home-a-dangling-symlink", home_dangling_symlink, 2),
    ("health-url-unclosed-ipv6", service_key("health_url", "http://[::1", quoted=True), 2),
    ("health-url-no-host", service_key("health_url", "http://", quoted=True), 2),
    ("health-url-port-99999", service_key("health_url", "http://127.0.0.1:99999/health", quoted=True), 2),
    ("health-url-port-0", service_key("health_url", "http://127.0.0.1:0/health", quoted=True), 2),
    ("index-url-with-a-newline", index_url_newline, 2),
    ("restore-lanes-leading-space", restore_lanes(" 2"), 2),
    ("restore-lanes-trailing-newline", restore_lanes("2\n"), 2),
    ("dry-run-with-prepared", dry_run_with("--prepared"), 2),
    ("dry-run-with-prepare-only", dry_run_with("--prepare-only"), 2),
    ("ci-promote-lockfiles-proc", ci_promote_into_proc, 2),
    ("meta-json-with-wrong-types", meta_json_wrong_types, 3),
    ("journal-jsonl-is-a-folder", journal_is_a_folder, 2),
    ("snapshots-exclude-question-star", exclude_takes_everything, 2),
    ("snapshots-exclude-a-package-run", exclude_takes_a_package("run"), 2),
    ("snapshots-exclude-a-package-snapshot", exclude_takes_a_package("snapshot"), 2),
    ("system-interpreter-run", system_run, 2),
    ("system-interpreter-rollback", system_rollback, 2),
    ("system-interpreter-resume", system_resume, 2),
    ("ssl-cert-file-missing-run", missing_ca_bundle("run"), 2),
    ("ssl-cert-file-missing-rollback", missing_ca_bundle("rollback"), 2),
    ("ssl-cert-file-missing-smoke", missing_ca_bundle("smoke"), 2),
]


@pytest.mark.parametrize("setup, code", [(s, c) for _, s, c in CASES], ids=[i for i, _, _ in CASES])
def test_bad_input(setup: Setup, code: int, tmp_path: Path, index_url: str) -> None:
    ctx = Ctx(tmp_path, index_url)
    try:
        call = setup(ctx)
        before = ctx.state_of_env() if ctx._python else None
        cp = ctx.cli(*call.args, "--json", env=call.env, unprivileged=call.as_unprivileged)
        assert "Traceback" not in cp.stderr, cp.stderr
        doc = one_document(cp.stdout)
        assert cp.returncode == code, (cp.stdout, cp.stderr)
        if code:
            assert doc["exit_code"] == code and doc["error"]
            for word in call.words:
                assert word in doc["message"], (word, doc["message"])
        if before is not None:
            assert ctx.state_of_env() == before
        if call.check:
            call.check(doc)
    finally:
        for m in reversed(ctx.mounts):
            subprocess.run(["umount", "-l", str(m)])
