"""The version 3 manifest on disk: `manifest.bin`, columns of fixed-size numbers.

Owns: `encode` and `decode` of a manifest's folders as one header (JSON: roots, counts, the
length of each part) followed by columns over every entry of every folder, in folder order:
types and stored codes (a byte each), modes, sizes, mtimes, inodes, ctimes (8 bytes each,
little-endian), sha256 digests (32 bytes each, zeros for none), names and symlink targets
(NUL-separated UTF-8). A snapshot of a vLLM environment (57,000 files) reads in tens of
milliseconds and writes in less — as JSON it took a quarter of a second each way, more than
the walk of an unchanged environment that the snapshot is.

Everything read is checked for shape before it is believed — the magic line, the header's
types, every count against the file's length, every code, every name's count — and a file
that does not add up is a damaged manifest (ValueError), never a partial one.
"""

from __future__ import annotations

import json
import sys
from array import array
from typing import Any

MAGIC = b"rewheel manifest 3\n"
_NUM = ("modes", "sizes", "mtimes", "inos", "ctimes")
_CODES = {"modes": "q", "sizes": "q", "mtimes": "q", "inos": "Q", "ctimes": "q"}
_ZERO = bytes(32)


def _le(a: array[Any]) -> bytes:
    if sys.byteorder != "little":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def encode(header: dict[str, Any], folders: list[tuple[int, str, Any]]) -> bytes:
    """The file for `folders` [(root, rel, Folder)], with `header` (roots, real_roots,
    exclude) added to. Folders hold lists; their `shab` is 32 bytes an entry."""
    f_root = array("q", (ri for ri, _, _ in folders))
    f_count = array("q", (len(f.names) for _, _, f in folders))
    rels = "\0".join(rel for _, rel, _ in folders).encode("utf-8", "surrogateescape")
    types = "".join(f.types for _, _, f in folders).encode("ascii")
    stored = "".join(f.stored for _, _, f in folders).encode("ascii")
    cols = {k: array(_CODES[k]) for k in _NUM}
    names: list[str] = []
    shab: list[bytes] = []
    targets: list[str] = []
    for _, _, f in folders:
        n = len(f.names)
        names.extend(f.names)
        cols["modes"].extend(f.modes)
        cols["sizes"].extend(f.sizes)
        cols["mtimes"].extend(f.mtimes)
        cols["inos"].extend([0 if x is None else x for x in f.inos] if None in f.inos else f.inos)
        cols["ctimes"].extend(f.ctimes if f.ctimes is not None else [0] * n)
        shab.append(f.sha_bytes())
        if "l" in f.types:
            tg = f.link_targets()
            targets.extend(tg[i] or "" for i, k in enumerate(f.types) if k == "l")
    name_blob = "\0".join(names).encode("utf-8", "surrogateescape")
    target_blob = "\0".join(targets).encode("utf-8", "surrogateescape")
    parts = [_le(f_root), _le(f_count), rels, types, stored, *(_le(cols[k]) for k in _NUM), b"".join(shab),
             name_blob, target_blob]
    head = {**header, "version": 3, "folders": len(folders), "entries": len(names), "links": len(targets),
            "parts": [len(p) for p in parts]}
    raw = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([MAGIC, len(raw).to_bytes(4, "little"), raw, *parts])


def decode(data: bytes) -> tuple[dict[str, Any], list[tuple[int, str, dict[str, Any]]]]:
    """(header, [(root, rel, columns)]) of a file `encode` wrote; ValueError when it is not
    one, or does not add up. Columns: names, types, stored (str), modes, sizes, mtimes,
    inos, ctimes (arrays of 64-bit numbers), shab (bytes), targets (list, or None without
    symlinks)."""
    if not data.startswith(MAGIC):
        version = _version_of(data)
        raise ValueError(f"manifest version {version}; this rewheel reads versions 1 to 3" if version
                         else "not a manifest (no magic line)")
    at = len(MAGIC)
    hl = int.from_bytes(data[at:at + 4], "little")
    try:
        head = json.loads(data[at + 4:at + 4 + hl])
    except RecursionError:  # a header nested thousands deep: not one `encode` wrote
        raise ValueError("a malformed header (nested too deeply)") from None
    at += 4 + hl
    if not isinstance(head, dict):
        raise ValueError("the header is not an object")
    nf, n, nl, parts = head.get("folders"), head.get("entries"), head.get("links"), head.get("parts")
    if not (type(nf) is int and type(n) is int and type(nl) is int and 0 <= nf and 0 <= nl <= n
            and isinstance(parts, list) and len(parts) == 13 and all(type(p) is int and p >= 0 for p in parts)):
        raise ValueError("a malformed header")
    if at + sum(parts) != len(data):
        raise ValueError(f"its parts make {at + sum(parts)} bytes, the file has {len(data)}")
    want = [8 * nf, 8 * nf, None, n, n, 8 * n, 8 * n, 8 * n, 8 * n, 8 * n, 32 * n, None, None]
    views: list[bytes] = []
    for size, expect in zip(parts, want, strict=True):
        if expect is not None and size != expect:
            raise ValueError("a column of the wrong length")
        views.append(data[at:at + size])
        at += size
    f_root, f_count = _arr("q", views[0]), _arr("q", views[1])
    rels = views[2].decode("utf-8", "surrogateescape").split("\0") if nf else []
    types, stored = views[3].decode("ascii"), views[4].decode("ascii")
    nums = {k: _arr(_CODES[k], views[5 + j]) for j, k in enumerate(_NUM)}
    shab = views[10]
    names = views[11].decode("utf-8", "surrogateescape").split("\0") if n else []
    targets = views[12].decode("utf-8", "surrogateescape").split("\0") if nl else []
    if len(rels) != nf or len(names) != n or sum(f_count) != n or min(f_count, default=0) < 0:
        raise ValueError("the folders and their entries do not add up")
    if types.strip("fdlo") or stored.strip("LRC-") or types.count("l") != nl or len(targets) != nl:
        raise ValueError("an unknown entry type or stored code")
    out: list[tuple[int, str, dict[str, Any]]] = []
    a = t = 0
    for k in range(nf):
        b = a + f_count[k]
        tp = types[a:b]
        links = tp.count("l")
        tg: list[str | None] | None = None
        if links:
            it = iter(targets[t:t + links])
            tg = [next(it) if c == "l" else None for c in tp]
            t += links
        out.append((f_root[k], rels[k], {
            "names": names[a:b], "types": tp, "stored": stored[a:b],
            **{c: nums[c][a:b] for c in _NUM}, "shab": shab[32 * a:32 * b], "targets": tg}))
        a = b
    return head, out


def _arr(code: str, raw: bytes) -> array[Any]:
    a = array(code)
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def _version_of(data: bytes) -> Any:
    """The version a manifest from a newer rewheel says it is (`rewheel manifest N`), if any."""
    line = data[:64].split(b"\n", 1)[0]
    if line.startswith(b"rewheel manifest "):
        return line[len(b"rewheel manifest "):].decode("ascii", "replace")
    return None
