"""The environment model: a Python prefix, its distributions and their RECORD files.

Given an interpreter path we ask that interpreter (once) where its prefix and site
directories are; everything else — distributions, versions, RECORD entries — is read from
the `.dist-info` folders directly, so a broken environment can still be inspected.
"""

from __future__ import annotations

import binascii
import csv
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rewheel import proc
from rewheel.errors import TargetError

_PROBE = r"""
import json, sys, sysconfig
paths = sysconfig.get_paths()
print(json.dumps({
    "prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
    "version": "%d.%d.%d" % sys.version_info[:3], "implementation": sys.implementation.name,
    "purelib": paths["purelib"], "platlib": paths["platlib"], "scripts": paths["scripts"],
    "sitepackages": __import__("site").getsitepackages(),
}))
"""




_early_probes: dict[str, proc.Started] = {}
# The probe's answer by interpreter identity (`_identity`): an environment inspected twice in
# one command (a staged run: the live one and the staged one, each twice) is asked once.
_answers: dict[tuple[Any, ...], str] = {}


def _identity(py: Path) -> tuple[Any, ...] | None:
    """What the probe's answer depends on: the interpreter's path, the link or file there and
    what it points to, and the environment's pyvenv.cfg. A recreated or swapped environment
    has new files there, so it is asked again."""
    try:
        link, real = os.lstat(py), os.stat(py)
    except OSError:
        return None
    try:
        cfg = os.stat(py.parent.parent / "pyvenv.cfg")
        cfg_id: tuple[int, int, int] | None = (cfg.st_ino, cfg.st_mtime_ns, cfg.st_size)
    except OSError:
        cfg_id = None
    return (str(py), link.st_ino, link.st_mtime_ns, real.st_ino, real.st_mtime_ns, cfg_id)


def probe_early(python: str | os.PathLike[str]) -> None:
    """Start the interpreter probe of `Environment.inspect(python)` now: it runs (a Python
    start-up, tens of milliseconds) while this process imports what its command needs, and
    `inspect` of the same path collects its answer. Anything wrong with the path is left for
    `inspect` to report."""
    key = str(Path(python))
    if key not in _early_probes and os.path.isfile(key):
        _early_probes[key] = proc.start([key, "-I", "-c", _PROBE])


@dataclass(frozen=True)
class RecordEntry:
    """One row of a RECORD file. `path` is absolute and normalised."""

    path: str
    hash: str | None  # "sha256=<urlsafe b64>" as written, or None
    size: int | None

    @property
    def sha256_hex(self) -> str | None:
        if not self.hash or not self.hash.startswith("sha256="):
            return None
        b64 = self.hash[len("sha256="):]
        try:
            # binascii directly, and two replaces: base64.urlsafe_b64decode and str.translate
            # each cost several times as much, and this runs once per installed file.
            return binascii.a2b_base64(b64.replace("-", "+").replace("_", "/") + "=" * (-len(b64) % 4),
                                       strict_mode=True).hex()
        except (ValueError, TypeError, binascii.Error):
            return None


@dataclass
class Distribution:
    """An installed distribution, read from its `.dist-info` folder."""

    name: str  # canonical
    display_name: str
    version: Version | None
    version_text: str
    dist_info: Path
    site: Path
    installer: str | None = None
    requested: bool = False
    direct_url: dict | None = None
    project_urls: dict[str, str] = field(default_factory=dict)
    wheel_tags: list[str] = field(default_factory=list)

    @property
    def local(self) -> str | None:
        return self.version.local if self.version else None

    @cached_property
    def install_time_ns(self) -> int:
        """When the installer finished: RECORD is written last by pip and uv."""
        try:
            return (self.dist_info / "RECORD").stat().st_mtime_ns
        except OSError:
            return 0

    @cached_property
    def record(self) -> list[RecordEntry]:
        path = self.dist_info / "RECORD"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        entries: list[RecordEntry] = []
        site_dir = str(self.site)
        site = site_dir.rstrip("/") + "/"
        # Every row goes through normpath only when the site path itself is not normal;
        # else only rows with something to normalise (a `/.bench/` folder is normal).
        odd_site = os.path.normpath(site_dir) + "/" != site
        lines = [line for line in text.splitlines() if line]
        rows = [line.split(",") for line in lines] if '"' not in text else None
        if not odd_site and rows is not None and set(map(len, rows)) <= {3}:
            # Nothing quoted and three fields a row (nearly every RECORD): the rows csv
            # would give, split at C speed.
            norm, join = os.path.normpath, os.path.join
            return [RecordEntry(norm(join(site_dir, rel)) if rel[0] in "./" or "/." in rel or "//" in rel
                                else site + rel,
                                digest or None, int(size) if size.strip().isdigit() else None)
                    for rel, digest, size in rows if rel]
        add = entries.append
        for row in csv.reader(lines):
            if not row or not (rel := row[0]):
                continue
            # normpath only where there is something to normalise (`../../bin/x`): it is
            # pure Python, and this runs once per installed file.
            if odd_site or rel[0] in "./" or "/." in rel or "//" in rel:
                full = os.path.normpath(os.path.join(site_dir, rel))
            else:
                full = site + rel
            n = len(row)
            digest = row[1] if n > 1 and row[1] else None
            size = int(row[2]) if n > 2 and row[2].strip().isdigit() else None
            add(RecordEntry(full, digest, size))
        return entries

    @cached_property
    def import_names(self) -> list[str]:
        """The modules this distribution provides, as `import` spells them, from its RECORD:
        top-level packages and modules (`numpy`, `six`, extension modules), and for a namespace
        package (a folder without `__init__.py`, e.g. `jaraco/`) the packages inside it
        (`jaraco.functools`). Never folders Python cannot import — bundled libraries
        (`numpy.libs`), `*.data`, `*.dist-info`, `__pycache__` — nor `.pth` files or scripts.
        The one named like the distribution comes first (`setuptools` before
        `_distutils_hack`), then the rest in RECORD order."""
        tops: dict[str, bool] = {}  # top-level name -> has an __init__ (a regular package)
        subs: dict[str, list[str]] = {}  # namespace folder -> the packages/modules inside it
        for e in self.record:
            rel = os.path.relpath(e.path, self.site)
            parts = rel.split(os.sep)
            if parts[0].startswith(".."):
                continue
            name = _module_name(parts[0]) if len(parts) == 1 else parts[0]
            if name is None or not name.isidentifier() or name == "__pycache__":
                continue
            if len(parts) == 1:
                tops.setdefault(name, True)
                continue
            init = parts[1] in ("__init__.py", "__init__.pyi") or (
                len(parts) == 2 and parts[1].startswith("__init__.") and parts[1].endswith((".so", ".pyd")))
            tops[name] = tops.get(name, False) or init
            inner = _module_name(parts[1]) if len(parts) == 2 else parts[1]
            if inner and inner.isidentifier() and inner not in ("__init__", "__pycache__"):
                subs.setdefault(name, [])
                if inner not in subs[name]:
                    subs[name].append(inner)
        out: list[str] = []
        for name, regular in tops.items():
            if regular or name not in subs:
                out.append(name)
            else:  # a namespace package: what this distribution put inside it
                out += [f"{name}.{inner}" for inner in subs[name]]
        own = canonicalize_name(self.name).replace("-", "_")
        out.sort(key=lambda n: 0 if n.lower() == own or n.lower().replace(".", "_") == own else 1)
        return out

    @property
    def wheel_name(self) -> str | None:
        """The wheel file this was most likely installed from, rebuilt from the WHEEL tags."""
        if not self.wheel_tags:
            return None
        dist = self.dist_info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        tag = self.wheel_tags[0] if len(self.wheel_tags) == 1 else _compress_tags(self.wheel_tags)
        return f"{dist}-{self.version_text}-{tag}.whl"

    def to_json(self) -> dict:
        archive = (self.direct_url or {}).get("archive_info", {})
        hashes = archive.get("hashes") or {}
        sha = hashes.get("sha256") or (archive.get("hash", "").split("=", 1)[1]
                                       if archive.get("hash", "").startswith("sha256=") else None)
        return {"name": self.name, "version": self.version_text, "installer": self.installer,
                "requested": self.requested, "wheel": self.wheel_name,
                "url": (self.direct_url or {}).get("url"), "sha256": sha,
                "editable": bool((self.direct_url or {}).get("dir_info", {}).get("editable")),
                "project_urls": self.project_urls}


def _module_name(filename: str) -> str | None:
    """The module a top-level file provides (`six.py` -> `six`, `_cffi.cpython-311-x86_64-linux-gnu.so`
    -> `_cffi`), or None for anything else (`.pth` files, data)."""
    if filename.endswith((".py", ".pyi")):
        return filename.rsplit(".", 1)[0]
    if filename.endswith((".so", ".pyd")):
        return filename.split(".", 1)[0]
    return None


def _compress_tags(tags: list[str]) -> str:
    parts = [t.split("-") for t in tags]
    if any(len(p) != 3 for p in parts):
        return tags[0]
    pys, abis, plats = (sorted({p[i] for p in parts}) for i in range(3))
    return f"{'.'.join(pys)}-{'.'.join(abis)}-{'.'.join(plats)}"


def read_distribution(dist_info: Path, site: Path) -> Distribution | None:
    meta_path = dist_info / "METADATA"
    try:
        raw = meta_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # Only the header block matters; the long description can be megabytes.
    head = raw.split("\n\n", 1)[0]
    import email.parser  # here, not at import: commands that read no distribution never need it

    msg = email.parser.HeaderParser().parsestr(head)
    name = msg.get("Name") or dist_info.name.split("-")[0]
    vtext = (msg.get("Version") or "").strip()
    try:
        version: Version | None = Version(vtext)
    except InvalidVersion:
        version = None
    urls = {}
    for item in msg.get_all("Project-URL") or []:
        label, _, url = item.partition(",")
        urls[label.strip()] = url.strip()
    if msg.get("Home-page"):
        urls.setdefault("Homepage", msg["Home-page"].strip())
    dist = Distribution(name=canonicalize_name(name), display_name=name, version=version,
                        version_text=vtext, dist_info=dist_info, site=site, project_urls=urls)
    inst = dist_info / "INSTALLER"
    if inst.exists():
        dist.installer = inst.read_text(errors="replace").strip() or None
    dist.requested = (dist_info / "REQUESTED").exists()
    du = dist_info / "direct_url.json"
    if du.exists():
        try:
            dist.direct_url = json.loads(du.read_text())
        except (OSError, ValueError):
            dist.direct_url = None
    wheel = dist_info / "WHEEL"
    if wheel.exists():
        wmsg = email.parser.HeaderParser().parsestr(wheel.read_text(errors="replace"))
        dist.wheel_tags = [t.strip() for t in wmsg.get_all("Tag") or []]
    return dist


@dataclass
class Environment:
    """A Python prefix, named by its interpreter path."""

    python: Path
    prefix: Path
    base_prefix: Path
    version: str
    site_dirs: list[Path]
    scripts_dir: Path
    kind: str  # "venv" | "conda" | "system"
    # Site folders the interpreter also imports from that are not its install scheme's
    # (a Debian python's /usr/lib/python3/dist-packages, where apt puts packages): read for
    # what `check` reports, never installed into nor snapshotted.
    other_sites: list[Path] = field(default_factory=list)

    @classmethod
    def inspect(cls, python: str | os.PathLike[str]) -> Environment:
        py = Path(python)
        if not py.exists():
            raise TargetError(f"interpreter {py} does not exist")
        if py.is_dir():
            raise TargetError(f"interpreter {py} is a folder, not an interpreter",
                              hint="give the environment's python, e.g. /root/ml-env/bin/python")
        ident = _identity(py)
        answer = _answers.get(ident) if ident is not None else None
        if answer is None or str(py) in _early_probes:  # (an early probe is always collected)
            answer = cls._probe(py)
        try:
            info = json.loads(answer.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TargetError(f"interpreter {py} did not answer the probe: {answer[-300:]!r}") from None
        if ident is not None:
            _answers[ident] = answer
        prefix = Path(info["prefix"])
        base = Path(info["base_prefix"])
        sites: list[Path] = []
        real_prefix = os.path.realpath(prefix)
        for key in ("purelib", "platlib"):
            p = Path(info[key])
            # A site folder linked out of the prefix (moved to another disk, linked back):
            # what the interpreter imports is the folder the link points to, so RECORD paths
            # and snapshots use that real folder (`roots` captures it beside the prefix).
            real = os.path.realpath(p)
            if not (real == real_prefix or real.startswith(real_prefix.rstrip("/") + "/")):
                p = Path(real)
            if p not in sites:
                sites.append(p)
        if (prefix / "conda-meta").is_dir():
            kind = "conda"
        elif prefix != base or (prefix / "pyvenv.cfg").exists():
            kind = "venv"
        else:
            kind = "system"
        real_sites = {os.path.realpath(s) for s in sites}
        others = [Path(p) for p in info.get("sitepackages") or []
                  if os.path.realpath(p) not in real_sites and os.path.isdir(p)]
        return cls(python=py, prefix=prefix, base_prefix=base, version=info["version"],
                   site_dirs=sites, scripts_dir=Path(info["scripts"]), kind=kind,
                   other_sites=list(dict.fromkeys(others)))

    @staticmethod
    def _probe(py: Path) -> str:
        """The interpreter's answer to the probe (started early by `probe_early`, or now)."""
        try:
            early = _early_probes.pop(str(py), None)
            res = early.wait(timeout=60) if early is not None else proc.run([str(py), "-I", "-c", _PROBE], timeout=60)
        except OSError as exc:  # a text file, no permission to run it, a broken binary
            raise TargetError(f"interpreter {py} cannot be run: {exc.strerror or exc}",
                              hint="give the environment's python, e.g. /root/ml-env/bin/python") from None
        if not res.ok:
            raise TargetError(f"interpreter {py} failed to start (exit {res.returncode}): "
                              f"{(res.stderr or res.stdout).strip()[-500:]}")
        return res.stdout

    @property
    def roots(self) -> list[Path]:
        """What a snapshot captures whole: the prefix of a venv or conda env, and any site
        folder that lives outside it (linked in from another disk); for a system interpreter
        only its site directories (script files are captured through RECORDs)."""
        if self.kind in ("venv", "conda"):
            real_prefix = os.path.realpath(self.prefix).rstrip("/") + "/"
            return [self.prefix] + [s for s in self.site_dirs
                                    if not (os.path.realpath(s) + "/").startswith(real_prefix)]
        return list(self.site_dirs)

    def distributions(self) -> list[Distribution]:
        seen: dict[str, Distribution] = {}
        for site in self.site_dirs:
            try:
                names = sorted(os.listdir(site))
            except OSError:
                continue
            for entry in names:
                if not entry.endswith(".dist-info"):
                    continue
                dist = read_distribution(site / entry, site)
                if dist and dist.name not in seen:
                    seen[dist.name] = dist
        return sorted(seen.values(), key=lambda d: d.name)

    def system_refusal(self, recipe: Any) -> TargetError | None:  # recipe: recipe.Recipe
        """Why `run`, `rollback` and `resume` must not change this environment: a system
        interpreter (not a venv, not a conda env) without `[environment] system = true` in the
        recipe. The error (exit 2) or None; `check` reports it, the commands raise it."""
        if self.kind != "system" or recipe.system:
            return None
        where = (f"add `system = true` under [environment] in {recipe.path}" if recipe.path
                 else "use a recipe with [environment] system = true (--python alone never allows it)")
        return TargetError(f"{self.python} is a system interpreter (prefix {self.prefix}, not a venv "
                           "or conda environment): refusing to change it (environment.system is not set)",
                           hint=f"upgrade a virtualenv instead, or, if this interpreter is really the "
                                f"service's own, {where}; nothing was changed")

    def other_site_counts(self) -> dict[Path, int]:
        """Distributions (`.dist-info` and `.egg-info`, as apt installs them) in each of
        `other_sites` that has any."""
        counts: dict[Path, int] = {}
        for site in self.other_sites:
            try:
                n = sum(1 for e in os.listdir(site) if e.endswith((".dist-info", ".egg-info")))
            except OSError:
                continue
            if n:
                counts[site] = n
        return counts

    def import_name(self, dists: list[str]) -> str | None:
        """The top-level package a traceback of these distributions runs through (for "the
        deepest frame inside the upgraded package"): the first import name their RECORDs
        list, else the first name spelled as a module."""
        wanted = [canonicalize_name(n) for n in dists]
        installed = {d.name: d for d in self.distributions()}
        for name in wanted:
            d = installed.get(name)
            if d is not None and d.import_names:
                return d.import_names[0]
        return wanted[0].replace("-", "_") if wanted else None

    def versions(self) -> dict[str, str]:
        return {d.name: d.version_text for d in self.distributions()}

    def to_json(self) -> dict:
        return {"python": str(self.python), "prefix": str(self.prefix), "kind": self.kind,
                "version": self.version, "site_dirs": [str(s) for s in self.site_dirs]}


def inspect_prefix(prefix: Path) -> Environment:
    """The environment of a prefix rewheel keeps state for, by the interpreter in it
    (SnapshotError, exit 2, when it has none: removed or moved)."""
    from rewheel.errors import SnapshotError

    for rel in ("bin/python", "bin/python3", "python.exe", "Scripts/python.exe"):
        if (prefix / rel).exists():
            return Environment.inspect(prefix / rel)
    raise SnapshotError(f"no Python interpreter in {prefix}: cannot compare a snapshot with it",
                        hint="the environment was removed or moved; `rewheel diff TARGET A B` compares two snapshots")
