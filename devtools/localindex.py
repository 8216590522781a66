"""A real package index over a folder of wheels, on 127.0.0.1: for the tests, the demo and the
benchmarks, so that nothing needs the internet.

It speaks PEP 503 (HTML) and, when the client asks for it with
`Accept: application/vnd.pypi.simple.v1+json`, PEP 691 (JSON) — uv asks for JSON first, pip for
HTML. Layout, mirroring vLLM's nightly wheel server:

    /simple/                    project list of the wheels directly in `wheels_dir`
    /simple/<name>/             that project's files
    /<sub>/  /<sub>/<name>/     a sub-index over `wheels_dir/<sub>/` only (per-commit indexes:
                                `<sub>` is a commit sha), or over a folder named in `prefix_paths`
                                (e.g. {"nightly": "<newest-sha>"})
    /files/[<sub>/]<wheel>      the wheel itself; links carry `#sha256=<hex>`

The folder is read on every request, so wheels added while the server runs are offered at once.
An optional basic-auth requirement (`auth=("user", "secret")`) lets tests prove that credentials
inside index URLs never reach logs. Run it by hand with `python -m devtools.localindex DIR --port N`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename,
                             parse_wheel_filename)

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
_ROOT = "simple"
_FILES = "files"


@dataclass
class Request:
    """One request the server answered: for tests that check which index served what."""

    method: str
    path: str
    status: int
    accept: str


def _pick_format(accept: str) -> str:
    """Content negotiation per PEP 691: the highest-q type we serve, HTML when nothing matches."""
    best, best_q = "text/html", -1.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media, q = fields[0].lower(), 1.0
        for param in fields[1:]:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        if media in (JSON_TYPE, HTML_TYPE, "text/html", "*/*") and q > best_q:
            best, best_q = media, q
    return "text/html" if best == "*/*" else best


class _HashCache:
    """sha256 of each wheel, recomputed only when its size or mtime changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[int, int, str]] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = str(path)
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
                return hit[2]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        with self._lock:
            self._cache[key] = (st.st_size, st.st_mtime_ns, digest)
        return digest


@dataclass
class IndexServer:
    """A running index. `url` is the `/simple` base to pass as `--index-url`."""

    wheels_dir: Path
    host: str
    port: int
    auth: tuple[str, str] | None = None
    prefix_paths: dict[str, Path] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/{_ROOT}"

    def sub_url(self, sub: str) -> str:
        """The base of a sub-index: a folder of wheels_dir (a commit sha) or a prefix_paths key."""
        return f"{self.base}/{quote(sub)}"

    def with_auth(self, url: str | None = None, *, user: str | None = None,
                  password: str | None = None) -> str:
        """`url` (default: `.url`) with credentials in it, as an operator would write it."""
        url = url or self.url
        default_user, default_password = self.auth or ("", "")
        u = default_user if user is None else user
        p = default_password if password is None else password
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{quote(u, safe='')}:{quote(p, safe='')}@{rest}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> IndexServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what the server offers -------------------------------------------------------------

    def folder_for(self, sub: str | None) -> Path | None:
        """The folder a (sub-)index serves, or None when there is no such sub-index."""
        if sub is None:
            return self.wheels_dir
        if sub in self.prefix_paths:
            return self.prefix_paths[sub]
        if sub in (_ROOT, _FILES) or "/" in sub or sub.startswith("."):
            return None
        d = self.wheels_dir / sub
        return d if d.is_dir() else None

    def wheels(self, folder: Path) -> dict[str, list[Path]]:
        """canonical project name -> its wheel files (and sdists, `NAME-VERSION.tar.gz`) in
        `folder` (not recursive)."""
        out: dict[str, list[Path]] = {}
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return out
        for p in entries:
            if not p.is_file():
                continue
            try:
                if p.name.endswith(".whl"):
                    name = parse_wheel_filename(p.name)[0]
                elif p.name.endswith(".tar.gz"):
                    name = parse_sdist_filename(p.name)[0]
                else:
                    continue
            except (InvalidWheelFilename, InvalidSdistFilename):
                continue
            out.setdefault(canonicalize_name(name), []).append(p)
        return out


def _make_handler(server: IndexServer, hashes: _HashCache) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "rewheel-localindex/1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # tests and the demo print what they need; stderr noise helps nobody

        def _send(self, status: int, body: bytes, ctype: str,
                  extra: Mapping[str, str] | None = None, head: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)
            server.requests.append(Request(self.command, self.path, status,
                                           self.headers.get("Accept", "")))

        def _not_found(self, head: bool) -> None:
            self._send(404, b"404 Not Found\n", "text/plain", head=head)

        def _authorised(self) -> bool:
            if server.auth is None:
                return True
            expected = "Basic " + base64.b64encode(
                f"{server.auth[0]}:{server.auth[1]}".encode()).decode()
            return self.headers.get("Authorization", "") == expected

        def do_HEAD(self) -> None:  # noqa: N802
            self._handle(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._handle(head=False)

        def _handle(self, head: bool) -> None:
            if not self._authorised():
                self._send(401, b"401 Unauthorized\n", "text/plain",
                           {"WWW-Authenticate": 'Basic realm="rewheel-localindex"'}, head=head)
                return
            parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
            if not parts:
                self._redirect("/" + _ROOT + "/", head)
                return
            if parts[0] == _FILES:
                self._file(parts[1:], head)
                return
            sub = None if parts[0] == _ROOT else parts[0]
            folder = server.folder_for(sub)
            if folder is None or len(parts) > 2:
                self._not_found(head)
                return
            # PEP 503: index and project URLs end in a slash; send clients there.
            if not urlsplit(self.path).path.endswith("/"):
                self._redirect(urlsplit(self.path).path + "/", head)
                return
            fmt = _pick_format(self.headers.get("Accept", ""))
            if len(parts) == 1:
                self._root(folder, fmt, head)
            else:
                self._project(sub, folder, parts[1], fmt, head)

        def _redirect(self, location: str, head: bool) -> None:
            self._send(301, b"", "text/plain", {"Location": location}, head=head)

        def _root(self, folder: Path, fmt: str, head: bool) -> None:
            names = sorted(server.wheels(folder))
            if fmt == JSON_TYPE:
                body = json.dumps({"meta": {"api-version": "1.0"},
                                   "projects": [{"name": n} for n in names]}).encode()
            else:
                links = "".join(f'    <a href="{quote(n)}/">{html.escape(n)}</a>\n' for n in names)
                body = ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" "
                        f"content=\"1.0\"><title>Simple index</title></head>\n  <body>\n{links}"
                        "  </body>\n</html>\n").encode()
            self._send(200, body, fmt, head=head)

        def _project(self, sub: str | None, folder: Path, name: str, fmt: str, head: bool) -> None:
            canon = canonicalize_name(name)
            files = server.wheels(folder).get(canon)
            if not files:
                self._not_found(head)
                return
            if sub is None:
                prefix = f"/{_FILES}/"
            elif sub in server.prefix_paths:
                prefix = f"/{_FILES}/@{quote(sub)}/"
            else:
                prefix = f"/{_FILES}/{quote(sub)}/"
            entries = [(p.name, prefix + quote(p.name), hashes.sha256(p)) for p in files]
            if fmt == JSON_TYPE:
                body = json.dumps({
                    "meta": {"api-version": "1.0"}, "name": canon,
                    "files": [{"filename": fn, "url": url, "hashes": {"sha256": digest}}
                              for fn, url, digest in entries]}).encode()
            else:
                links = "".join(f'    <a href="{url}#sha256={digest}">{html.escape(fn)}</a><br/>\n'
                                for fn, url, digest in entries)
                body = ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" "
                        f"content=\"1.0\"><title>Links for {html.escape(canon)}</title></head>\n"
                        f"  <body>\n    <h1>Links for {html.escape(canon)}</h1>\n{links}"
                        "  </body>\n</html>\n").encode()
            self._send(200, body, fmt, head=head)

        def _file(self, rest: list[str], head: bool) -> None:
            if len(rest) == 1:
                folder: Path | None = server.wheels_dir
            elif len(rest) == 2 and rest[0].startswith("@"):
                folder = server.prefix_paths.get(rest[0][1:])
            elif len(rest) == 2:
                folder = server.folder_for(rest[0])
            else:
                folder = None
            fname = rest[-1] if rest else ""
            bad_name = not fname.endswith((".whl", ".tar.gz")) or "/" in fname or fname.startswith(".")
            if folder is None or bad_name:
                self._not_found(head)
                return
            path = folder / fname
            if not path.is_file():
                self._not_found(head)
                return
            data = b"" if head else path.read_bytes()
            if head:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(path.stat().st_size))
                self.end_headers()
                server.requests.append(Request(self.command, self.path, 200,
                                               self.headers.get("Accept", "")))
                return
            self._send(200, data, "application/octet-stream")

    return Handler


# The ports this process's indexes were given. uv's cache keys a wheel by the index URL and the
# file name: an index started later on a port an earlier one had would have its `toypkg-2.0.0`
# mistaken for the earlier folder's (other bytes, same name), and the install fail its hash.
_PORTS_GIVEN: set[tuple[str, int]] = set()


def _bind(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """Port 0: a free port this process has not served an index from before."""
    held: list[ThreadingHTTPServer] = []
    try:
        while True:
            httpd = ThreadingHTTPServer((host, port), handler)
            if port or (host, httpd.server_address[1]) not in _PORTS_GIVEN:
                _PORTS_GIVEN.add((host, httpd.server_address[1]))
                return httpd
            held.append(httpd)  # kept open while the next one binds, so the kernel skips it
    finally:
        for h in held:
            h.server_close()


def start_index(wheels_dir: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0,
                prefix_paths: Mapping[str, str | os.PathLike[str]] | None = None,
                auth: tuple[str, str] | None = None) -> IndexServer:
    """Start serving `wheels_dir` in a background thread; port 0 picks a free port (one no
    earlier index of this process had)."""
    root = Path(wheels_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"wheels folder {root} does not exist")
    prefixes = {k.strip("/"): (Path(v) if Path(v).is_absolute() else root / v)
                for k, v in (prefix_paths or {}).items()}
    server = IndexServer(wheels_dir=root, host=host, port=0, auth=auth, prefix_paths=prefixes)
    httpd = _bind(host, port, _make_handler(server, _HashCache()))
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    server._httpd = httpd
    server._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                      name=f"localindex:{server.port}", daemon=True)
    server._thread.start()
    return server


@contextmanager
def serve_index(wheels_dir: str | os.PathLike[str], *,
                prefix_paths: Mapping[str, str | os.PathLike[str]] | None = None,
                auth: tuple[str, str] | None = None, host: str = "127.0.0.1",
                port: int = 0) -> Iterator[IndexServer]:
    """Serve `wheels_dir` as a package index for the duration of the `with` block."""
    server = start_index(wheels_dir, host=host, port=port, prefix_paths=prefix_paths, auth=auth)
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.localindex",
                                 description="Serve a folder of wheels as a PEP 503/691 index.")
    ap.add_argument("wheels_dir", help="folder of wheels; its sub-folders become sub-indexes")
    ap.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--prefix", action="append", default=[], metavar="NAME=FOLDER",
                    help="serve FOLDER as the sub-index /NAME/ (e.g. nightly=<sha>)")
    ap.add_argument("--auth", metavar="USER:PASSWORD", help="require basic auth")
    args = ap.parse_args(argv)
    prefixes: dict[str, str] = {}
    for item in args.prefix:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            ap.error(f"--prefix expects NAME=FOLDER, got {item!r}")
        prefixes[name] = folder
    auth = None
    if args.auth:
        user, sep, password = args.auth.partition(":")
        if not sep:
            ap.error("--auth expects USER:PASSWORD")
        auth = (user, password)
    try:
        server = start_index(args.wheels_dir, host=args.host, port=args.port,
                             prefix_paths=prefixes, auth=auth)
    except (FileNotFoundError, OSError) as exc:
        print(f"localindex: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # The URL on stdout, flushed, so a script can read it and wait for it.
    print(server.url, flush=True)
    print(f"serving {server.wheels_dir} at {server.url} (sub-indexes at {server.base}/<folder>/)",
          file=sys.stderr, flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
