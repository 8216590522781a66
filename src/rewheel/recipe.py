"""Recipes: loading a TOML upgrade procedure and validating it before anything is touched.

Every problem names the file and the key path (`smoke.timeout_s: expected an integer, got
"ten"`). Relative paths in a recipe (interpreter, find-links, cleanup globs, store) are taken
relative to the recipe's own folder, so a recipe and the environment beside it can move
together. `{python}` in an argv is the only template.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from rewheel.errors import RecipeError

if TYPE_CHECKING:
    from packaging.requirements import Requirement

PATCH_POLICIES = ("report", "reapply", "keep-old-version")
MANAGERS = ("systemd", "command")
REINSTALL = ("all", "named")


@dataclass(frozen=True)
class Probe:
    url: str
    expect: str | None = None


@dataclass(frozen=True)
class ServiceSpec:
    manager: str
    unit: str | None = None
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    health_url: str | None = None
    ready_timeout_s: int = 900
    stop_timeout_s: int = 180
    probe: Probe | None = None
    # How long a started service must stay up without restarting before it counts as healthy.
    settle_s: float = 3.0


@dataclass(frozen=True)
class InstallSpec:
    packages: tuple[str, ...] = ()
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    prerelease: bool = False
    reinstall: str = "named"
    uv_args: tuple[str, ...] = ()
    # Prepare and pre-check the new build beside the live environment while the service still
    # serves, then swap it in offline from uv's cache (docs/run-cycle.md); false: today's cycle.
    staged: bool = True

    @property
    def requirements(self) -> list[Requirement]:
        from packaging.requirements import Requirement

        return [Requirement(p) for p in self.packages]

    @property
    def names(self) -> list[str]:
        """The canonical names of the packages to upgrade."""
        return [canonicalize_name(r.name) for r in self.requirements]


@dataclass(frozen=True)
class SmokeSpec:
    command: tuple[str, ...] = ()
    timeout_s: int = 1200
    gpus: int = 0
    gpu_release_timeout_s: int = 120
    # MiB each GPU the smoke test uses must have free once the service stopped (0: not checked).
    gpu_free_mib: int = 0
    # A CPU-only check (argv, `{python}` = the prepared environment's interpreter) run before
    # the service is stopped: a build it fails is rejected and the service never stops.
    precheck: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    name: str
    python: Path
    path: Path | None = None
    service: ServiceSpec | None = None
    install: InstallSpec = field(default_factory=InstallSpec)
    smoke: SmokeSpec | None = None
    patch_policy: str = "report"
    cleanup_paths: tuple[str, ...] = ()
    keep: int = 5
    store: Path | None = None
    snapshot_exclude: tuple[str, ...] = ()  # globs left out of snapshots (caches)
    # `[environment] system = true`: a system interpreter (not a venv or conda env) may be
    # changed by run, rollback and resume; without it they refuse one.
    system: bool = False

    @property
    def source(self) -> str:
        return str(self.path) if self.path else f"--python {self.python}"

    def expand(self, argv: tuple[str, ...] | list[str]) -> list[str]:
        """Substitute `{python}`, the only template, in an argv list."""
        return [a.replace("{python}", str(self.python)) for a in argv]

    @classmethod
    def for_python(cls, python: str | os.PathLike[str]) -> Recipe:
        """A bare target for commands given `--python PATH` instead of a recipe."""
        hint = "give the path of the environment's python, e.g. /root/ml-env/bin/python"
        if not str(python).strip():
            raise RecipeError("--python", None, "empty interpreter path", hint=hint)
        p = Path(python).expanduser()
        if not p.is_absolute():
            p = Path.cwd() / p
        if not p.exists():
            raise RecipeError("--python", None, f"interpreter {p} does not exist", hint=hint)
        if p.is_dir():
            found = interpreter_of(p)
            if found is None:
                raise RecipeError("--python", None, f"{p} is a folder, but not a Python environment's "
                                                    "(no bin/python in it)", hint=hint)
            p = found
        if not os.access(p, os.X_OK):
            raise RecipeError("--python", None, f"{p} is not an executable interpreter", hint=hint)
        return cls(name=p.parent.parent.name or "env", python=p)


# The schema: key -> (type name, required). Tables nest.
_SCHEMA: dict[str, Any] = {
    "name": ("str", False),
    "environment": {"python": ("str", True), "system": ("bool", False)},
    "service": {
        "manager": ("str", True), "unit": ("str", False), "start": ("argv", False),
        "stop": ("argv", False), "health_url": ("str", False),
        "ready_timeout_s": ("int", False), "stop_timeout_s": ("int", False),
        "settle_s": ("number", False),
        "probe": {"url": ("str", True), "expect": ("str", False)},
    },
    "install": {
        "packages": ("strlist", True), "index_url": ("str", False),
        "extra_index_urls": ("strlist", False), "find_links": ("strlist", False),
        "prerelease": ("bool", False), "reinstall": ("str", False), "uv_args": ("strlist", False),
        "staged": ("bool", False),
    },
    "smoke": {"command": ("argv", True), "timeout_s": ("int", False), "gpus": ("int", False),
              "gpu_release_timeout_s": ("int", False), "precheck": ("argv", False),
              "gpu_free_mib": ("int", False)},
    "patches": {"policy": ("str", False)},
    "cleanup": {"paths": ("strlist", False)},
    "snapshots": {"keep": ("int", False), "store": ("str", False), "exclude": ("strlist", False)},
}

_TYPE_WORDS = {"str": "a string", "int": "an integer", "bool": "true or false",
               "number": "a number", "strlist": "a list of strings",
               "argv": "a non-empty list of strings (an argv list, never a shell string)",
               "table": "a table"}


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strlist":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "argv":
        return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    raise AssertionError(kind)


MAX_SECONDS = 7 * 24 * 3600  # the longest duration a recipe may set (`*_s` keys)


def _check(path: Path, data: dict[str, Any], schema: dict[str, Any], prefix: str) -> None:
    for key, value in data.items():
        keypath = f"{prefix}{key}"
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise RecipeError(path, keypath, f"unknown key (known here: {known})")
        spec = schema[key]
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise RecipeError(path, keypath, f"expected a table, got {_describe(value)}")
            _check(path, value, spec, keypath + ".")
        else:
            kind, _ = spec
            if not _type_ok(kind, value):
                raise RecipeError(path, keypath, f"expected {_TYPE_WORDS[kind]}, got {_describe(value)}")
            # TOML has nan and inf: a settle time of inf waits forever, -3 makes no sense.
            if kind in ("int", "number") and not math.isfinite(value):
                raise RecipeError(path, keypath, f"expected a finite number, got {value!r}")
            if kind in ("int", "number") and value < 0:
                raise RecipeError(path, keypath, f"expected 0 or more, got {value!r}")
            # A duration of 1e300 s is finite and still waits forever.
            if key.endswith("_s") and value > MAX_SECONDS:
                raise RecipeError(path, keypath, f"expected at most {MAX_SECONDS} seconds (7 days), got {value!r}")
    for key, spec in schema.items():
        required = (not isinstance(spec, dict)) and spec[1]
        if required and key not in data:
            raise RecipeError(path, f"{prefix}{key}", "missing required key")


def _check_http_url(path: Path, key: str, url: str) -> None:
    """An http(s) URL with a host and, if given, a port from 1 to 65535 — what a health
    check can ask; RecipeError naming the key and the value otherwise."""
    from urllib.parse import urlsplit

    problem = None
    if not url.startswith(("http://", "https://")):
        problem = "expected an http(s) URL"
    elif any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        problem = "expected a URL without spaces or control characters"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port  # raises for a port out of range or not a number
            if not parts.hostname:
                problem = "expected a URL with a host"
            elif port == 0:
                problem = "expected a port from 1 to 65535"
        except ValueError as exc:
            problem = f"not a valid URL ({exc})"
    if problem is not None:
        raise RecipeError(path, key, f"{problem}, got {_describe(url)}",
                          hint='e.g. "http://127.0.0.1:8000/health"')


def _check_no_controls(path: Path, key: str, value: str) -> None:
    """A URL or path handed to uv: a newline or other control character in it would split
    uv's configuration or its arguments' meaning; refused, naming the key."""
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise RecipeError(path, key, f"contains the control character {bad!r}: {value!r}",
                          hint="write the URL on one line, without control characters")


def _resolve_path(base: Path, value: str) -> Path:
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else (base / p)


def _resolve_glob(base: Path, value: str) -> str:
    v = os.path.expanduser(value)
    # Normalized ("../" resolved as written): what it may match is judged on this path.
    return os.path.normpath(v if os.path.isabs(v) else str(base / v))


# Paths every environment's distributions have (relative to the prefix): an exclude glob that
# matches one takes installed files or metadata (the snapshot then cannot restore them). A glob
# that only matches a package's own files is refused when a snapshot is taken (capture).
_DIST_SAMPLES = ("bin", "bin/python", "lib", "lib/python3.12", "lib/python3.12/site-packages",
                 "lib/python3.12/site-packages/pkg", "lib/python3.12/site-packages/pkg/__init__.py",
                 "lib/python3.12/site-packages/pkg/_C.cpython-312-x86_64-linux-gnu.so",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info/RECORD",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info/METADATA",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info/INSTALLER",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info/WHEEL",
                 "lib/python3.12/site-packages/pkg-1.0.dist-info/top_level.txt")


def _excluded_sample(glob: str) -> str | None:
    """The first of `_DIST_SAMPLES` that `[snapshots] exclude` glob would leave out, or None
    (the rule of `snapshot.tree.exclusion`: with a slash, the path from the prefix, `*`
    crossing folders; without, a name at any depth)."""
    import fnmatch

    g = glob.strip("/")
    for rel in _DIST_SAMPLES:
        if fnmatch.fnmatchcase(rel if "/" in g else rel.rpartition("/")[2], g):
            return rel
    return None


def _cleanup_globs(path: Path, base: Path, values: list[str]) -> tuple[str, ...]:
    """`[cleanup] paths`, absolute; a glob that could only match system files (inside /etc,
    /usr, /root, ...: debris lives in /tmp, /var/tmp, /dev/shm and ~/.cache) is refused."""
    if not values:
        return ()
    from rewheel.snapshot.cleanup import cleanup_glob_refusal

    out = []
    for i, value in enumerate(values):
        if not value.strip() or "\x00" in value:
            raise RecipeError(path, f"cleanup.paths[{i}]", f"expected a glob, got {_describe(value)}")
        glob = _resolve_glob(base, value)
        why = cleanup_glob_refusal(glob)
        if why is not None:
            raise RecipeError(path, f"cleanup.paths[{i}]",
                              f"{_describe(value)}" + (f" ({glob})" if glob != value else "") + f" {why}; "
                              "refusing to move what it matches",
                              hint="cleanup globs name debris: files in /tmp, /var/tmp, /dev/shm, a user's "
                                   '~/.cache, or a data folder of your own, e.g. "/tmp/*.pt"')
        out.append(glob)
    return tuple(out)


def parse_recipe(path: Path, data: dict[str, Any], *, check_interpreter: bool = True) -> Recipe:
    """Validate a parsed TOML document and build the Recipe. Raises RecipeError."""
    _check(path, data, _SCHEMA, "")
    if "environment" not in data:
        raise RecipeError(path, "environment.python", "missing required key",
                          hint='add [environment] with python = "/path/to/env/bin/python"')
    base = path.parent.resolve()
    python = _resolve_path(base, data["environment"]["python"])
    if check_interpreter and not python.exists():
        raise RecipeError(path, "environment.python", f"interpreter {python} does not exist")
    if python.is_dir():
        # An environment's folder stands for its interpreter, as with `--python`.
        found = interpreter_of(python)
        if found is not None:
            python = found
        elif check_interpreter:
            raise RecipeError(path, "environment.python", f"{python} is a folder, but not a Python "
                              "environment's (no bin/python in it)",
                              hint='give the interpreter, e.g. python = "/opt/vllm-env/bin/python", '
                                   "or the environment's folder")
    if check_interpreter and not os.access(python, os.X_OK):
        raise RecipeError(path, "environment.python", f"interpreter {python} is not executable")

    service = None
    if "service" in data:
        s = data["service"]
        manager = s["manager"]
        if manager not in MANAGERS:
            raise RecipeError(path, "service.manager",
                              f'expected one of "systemd", "command", got {_describe(manager)}')
        if manager == "systemd" and not s.get("unit"):
            raise RecipeError(path, "service.unit", 'missing required key (manager = "systemd")')
        if manager == "command" and not s.get("start"):
            raise RecipeError(path, "service.start", 'missing required key (manager = "command")')
        for k in ("ready_timeout_s", "stop_timeout_s"):
            if k in s and s[k] <= 0:
                raise RecipeError(path, f"service.{k}", f"expected a positive integer, got {s[k]}")
        if "health_url" in s:
            _check_http_url(path, "service.health_url", s["health_url"])
        probe = None
        if "probe" in s:
            _check_http_url(path, "service.probe.url", s["probe"]["url"])
            probe = Probe(url=s["probe"]["url"], expect=s["probe"].get("expect"))
        service = ServiceSpec(
            manager=manager, unit=s.get("unit"), start=tuple(s.get("start", ())),
            stop=tuple(s.get("stop", ())), health_url=s.get("health_url"),
            ready_timeout_s=s.get("ready_timeout_s", 900), stop_timeout_s=s.get("stop_timeout_s", 180),
            settle_s=float(s.get("settle_s", 3.0)), probe=probe)

    inst = data.get("install", {})
    # (packaging's requirement parser is imported here: a target given as --python needs none.)
    from packaging.requirements import InvalidRequirement, Requirement

    for i, req in enumerate(inst.get("packages", [])):
        try:
            Requirement(req)
        except InvalidRequirement as exc:
            raise RecipeError(path, f"install.packages[{i}]",
                              f"not a valid requirement {_describe(req)}: {exc}") from None
    reinstall = inst.get("reinstall", "named")
    if reinstall not in REINSTALL:
        raise RecipeError(path, "install.reinstall", f'expected "all" or "named", got {_describe(reinstall)}')
    for key in ("index_url",):
        if key in inst and not inst[key].strip():
            raise RecipeError(path, f"install.{key}", "expected a URL, got an empty string")
        if key in inst:
            _check_no_controls(path, f"install.{key}", inst[key])
    for i, url in enumerate(inst.get("extra_index_urls", [])):
        if not url.strip():
            raise RecipeError(path, f"install.extra_index_urls[{i}]", "expected a URL, got an empty string")
        _check_no_controls(path, f"install.extra_index_urls[{i}]", url)
    for i, link in enumerate(inst.get("find_links", [])):
        _check_no_controls(path, f"install.find_links[{i}]", link)
    install = InstallSpec(
        packages=tuple(inst.get("packages", ())), index_url=inst.get("index_url"),
        extra_index_urls=tuple(inst.get("extra_index_urls", ())),
        find_links=tuple(str(_resolve_path(base, f)) if "://" not in f else f for f in inst.get("find_links", ())),
        prerelease=inst.get("prerelease", False), reinstall=reinstall, uv_args=tuple(inst.get("uv_args", ())),
        staged=inst.get("staged", True))

    smoke = None
    if "smoke" in data:
        sm = data["smoke"]
        for k in ("timeout_s", "gpu_release_timeout_s"):
            if k in sm and sm[k] <= 0:
                raise RecipeError(path, f"smoke.{k}", f"expected a positive integer, got {sm[k]}")
        if sm.get("gpus", 0) < 0:
            raise RecipeError(path, "smoke.gpus", f"expected 0 or more, got {sm['gpus']}")
        smoke = SmokeSpec(command=tuple(sm["command"]), timeout_s=sm.get("timeout_s", 1200),
                          gpus=sm.get("gpus", 0), gpu_release_timeout_s=sm.get("gpu_release_timeout_s", 120),
                          precheck=tuple(sm.get("precheck", ())), gpu_free_mib=sm.get("gpu_free_mib", 0))

    policy = data.get("patches", {}).get("policy", "report")
    if policy not in PATCH_POLICIES:
        raise RecipeError(path, "patches.policy",
                          f'expected one of "report", "reapply", "keep-old-version", got {_describe(policy)}')
    snaps = data.get("snapshots", {})
    keep = snaps.get("keep", 5)
    if keep < 1:
        raise RecipeError(path, "snapshots.keep", f"expected 1 or more, got {keep}")
    store = _resolve_path(base, snaps["store"]) if "store" in snaps else None
    exclude = tuple(snaps.get("exclude", ()))
    for pat in exclude:
        if not pat.strip() or pat.startswith("/") or ".." in pat.split("/") or pat.strip("*/") == "":
            raise RecipeError(path, "snapshots.exclude",
                              f"{pat!r} would leave out the whole environment or a path outside it",
                              hint='give globs relative to the prefix, e.g. "lib/python3*/site-packages/*/.cache" '
                                   'or a name matched at any depth, e.g. "*.pt"')
        took = _excluded_sample(pat)
        if took is not None:
            raise RecipeError(path, "snapshots.exclude",
                              f"{pat!r} would leave {took} out of snapshots: a distribution's files or metadata, "
                              "which a rollback must restore",
                              hint='exclude caches only, e.g. "lib/python3*/site-packages/*/.cache" or "*.pt"')
    return Recipe(
        name=data.get("name") or path.stem, python=python, path=path, service=service,
        install=install, smoke=smoke, patch_policy=policy,
        cleanup_paths=_cleanup_globs(path, base, data.get("cleanup", {}).get("paths", [])),
        keep=keep, store=store, snapshot_exclude=exclude,
        system=data["environment"].get("system", False))


def interpreter_of(folder: Path) -> Path | None:
    """The interpreter of an environment given by its folder (a venv's or conda env's
    prefix): `bin/python`, else `bin/python3`, when executable. The path is kept as the
    environment has it (not resolved: a venv's python is a link to its base interpreter)."""
    for name in ("python", "python3"):
        cand = folder / "bin" / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def load_recipe(path: str | os.PathLike[str], *, check_interpreter: bool = True) -> Recipe:
    """Read and validate a recipe file. Raises RecipeError naming the file and key."""
    p = Path(path)
    if not p.exists():
        raise RecipeError(p, None, "no such recipe file")
    if p.is_dir():
        raise RecipeError(p, None, "is a folder, not a recipe file")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(p, None, f"TOML syntax error: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(p, None, f"not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise RecipeError(p, None, f"cannot be read: {exc.strerror or exc}") from None
    except RecursionError:
        raise RecipeError(p, None, "TOML nested too deeply to be a recipe (arrays or tables "
                                   "inside each other hundreds of levels deep)",
                          hint="a recipe is a few flat tables: [environment], [install], ...") from None
    return parse_recipe(p, data, check_interpreter=check_interpreter)


def load_target(recipe: str | None, python: str | None) -> Recipe:
    """A command's target: a recipe path or `--python PATH`, exactly one of them."""
    from rewheel.errors import UsageError

    if recipe and python:
        raise UsageError("give a recipe or --python, not both")
    if python is not None:
        return Recipe.for_python(python)
    if not recipe:
        raise UsageError("missing target: give a recipe file or --python PATH")
    if recipe.endswith(("/python", "/python3")) or os.path.basename(recipe).startswith("python"):
        if not recipe.endswith(".toml") and os.path.exists(recipe) and os.access(recipe, os.X_OK):
            return Recipe.for_python(recipe)
    return load_recipe(recipe)
