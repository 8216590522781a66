"""The JSON document a command writes with `--json`, character for character what
`json.dumps(doc, indent=2, default=str)` writes, made faster.

Python's JSON encoder is written in C only for output without indentation; with it, every
value goes through the pure-Python one (a third of a second for the 9,000 files of a real
upgrade's `diff`). Here a container whose values are all plain scalars — each file of a diff,
each patch — is encoded by the C encoder, its item separator carrying the line break and the
indentation; anything else is laid out here around its parts, or, when it is not a plain
container, left to `json.dumps` and indented to its depth (a JSON text has no line break but
between its items, so every line break there can be indented).
"""

from __future__ import annotations

import json
from functools import cache
from json.encoder import encode_basestring_ascii
from typing import Any

INDENT = "  "
_SCALARS = frozenset((str, int, float, bool, type(None)))
_STR_ONLY = frozenset((str,))


def dumps(doc: Any) -> str:
    """`json.dumps(doc, indent=2, default=str)`."""
    out: list[str] = []
    _put(doc, 0, out)
    return "".join(out)


@cache
def _flat_encoder(pad: str) -> json.JSONEncoder:
    """The C encoder, separating items by a line break and the indentation `pad`."""
    return json.JSONEncoder(separators=("," + pad, ": "), default=str)


def _put(o: Any, level: int, out: list[str]) -> None:
    kind = type(o)
    if kind is dict and o and _STR_ONLY.issuperset(map(type, o)):
        values = o.values()
    elif (kind is list or kind is tuple) and o:
        values = o
    else:  # a scalar, an empty or unusual container (keys that are not str), another type
        text = json.dumps(o, indent=len(INDENT), default=str)
        out.append(text.replace("\n", "\n" + INDENT * level) if level and "\n" in text else text)
        return
    pad = "\n" + INDENT * (level + 1)
    close = pad[:-len(INDENT)] + ("}" if kind is dict else "]")
    if _SCALARS.issuperset(map(type, values)):
        text = _flat_encoder(pad).encode(o)
        out.append(text[0] + pad + text[1:-1] + close)
        return
    out.append("{" if kind is dict else "[")
    sep = pad
    if kind is dict:
        for k, v in o.items():
            out.append(sep + encode_basestring_ascii(k) + ": ")
            _put(v, level + 1, out)
            sep = "," + pad
    else:
        for v in o:
            out.append(sep)
            _put(v, level + 1, out)
            sep = "," + pad
    out.append(close)
