"""The version 3 manifest on disk (`manifest.bin`): what is written reads back the same, and
bytes that are not a whole manifest — cut anywhere, a byte changed anywhere, counts that lie —
are refused as damaged (ValueError), never read as a partial manifest and never a crash of
another kind. Hostile input is a class: every cut and every header field, and a random sweep."""

from __future__ import annotations

import json
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewheel.snapshot import manifest_codec
from rewheel.snapshot.manifest import Folder, Manifest, shab_of
from rewheel.snapshot.tree import Root

SHA = "ab" * 32


def folders() -> list[tuple[int, str, Folder]]:
    top = Folder(["bin", "lib", "pyvenv.cfg"], "ddf", [0o755, 0o755, 0o644], [0, 0, 120], [1, 2, 3], "--C",
                 [None, None, 77], None, [0, 0, 99], shab_of([None, None, SHA]), None)
    bin_ = Folder(["python", "tool"], "lf", [0o777, 0o755], [0, 9], [0, 4], "-L", [None, 88], None, [0, 101],
                  shab_of([None, "cd" * 32]), ["python3.11", None])
    empty = Folder([], "", [], [], [], "", [], None, [], b"", None)
    return [(0, "", top), (0, "bin", bin_), (0, "lib", empty)]


def encoded() -> bytes:
    return manifest_codec.encode({"roots": [{"path": "/e", "whole": True}], "real_roots": ["/e"], "exclude": []},
                                 folders())


def test_what_is_written_reads_back_the_same() -> None:
    head, items = manifest_codec.decode(encoded())
    assert head["roots"] == [{"path": "/e", "whole": True}] and head["entries"] == 5 and head["links"] == 1
    want = {(ri, rel): f for ri, rel, f in folders()}
    assert [(ri, rel) for ri, rel, _ in items] == list(want)
    for ri, rel, c in items:
        f = want[(ri, rel)]
        assert c["names"] == f.names and c["types"] == f.types and c["stored"] == f.stored
        assert list(c["modes"]) == f.modes and list(c["sizes"]) == f.sizes and list(c["mtimes"]) == f.mtimes
        assert list(c["inos"]) == [x or 0 for x in f.inos] and list(c["ctimes"]) == f.ctimes
        assert c["shab"] == f.shab and c["targets"] == f.targets


def test_a_manifest_round_trips_through_the_folder_api(tmp_path) -> None:
    man = Manifest([Root("/e", True)], {(ri, rel): f for ri, rel, f in folders()}, ["/e"], [])
    man.save(tmp_path)
    back = Manifest._from_binary((tmp_path / "manifest.bin").read_bytes())
    assert back.uses_objects and back.raw == (tmp_path / "manifest.bin").read_bytes()
    assert [e for e in back.entries] == [e for e in man.entries]
    assert back.objects() == {f"ab/{'ab' * 31}", f"cd/{'cd' * 31}-4"}


def test_every_cut_is_refused() -> None:
    data = encoded()
    for n in range(len(data)):
        with pytest.raises(ValueError):
            manifest_codec.decode(data[:n])


def test_a_changed_byte_anywhere_is_refused_or_reads_as_entries_of_the_same_shape() -> None:
    """A byte changed inside a column of numbers is not detectable by shape (that is what
    `verify`'s checks of the stored bytes are for): it must still read as a whole manifest.
    Anywhere else, the file is refused. Every byte of the file is tried, with two values."""
    data = encoded()
    refused = read = 0
    for i in range(len(data)):
        for flip in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= flip
            try:
                head, items = manifest_codec.decode(bytes(bad))
            except ValueError:
                refused += 1
                continue
            read += 1
            assert sum(len(c["names"]) for _, _, c in items) == head["entries"]
    assert refused > 0 and read > 0 and refused + read == 2 * len(data)


@pytest.mark.parametrize("field,value", [
    ("folders", -1), ("folders", 10**12), ("entries", -1), ("entries", 10**12), ("links", 99), ("links", "1"),
    ("parts", None), ("parts", [1] * 13), ("parts", [0] * 12), ("parts", [-1] * 13), ("entries", 1.5),
])
def test_a_header_that_lies_is_refused(field: str, value: object) -> None:
    data = encoded()
    at = len(manifest_codec.MAGIC)
    hl = int.from_bytes(data[at:at + 4], "little")
    head = json.loads(data[at + 4:at + 4 + hl])
    head[field] = value
    raw = json.dumps(head).encode()
    forged = data[:at] + len(raw).to_bytes(4, "little") + raw + data[at + 4 + hl:]
    with pytest.raises(ValueError):
        manifest_codec.decode(forged)


def test_a_newer_manifest_names_its_version() -> None:
    with pytest.raises(ValueError, match="manifest version 4; this rewheel reads versions 1 to 3"):
        manifest_codec.decode(encoded().replace(b"rewheel manifest 3\n", b"rewheel manifest 4\n", 1))


def test_bad_codes_and_counts_are_refused() -> None:
    data = bytearray(encoded())
    types_at = data.index(b"ddflf")
    data[types_at] = ord("x")  # an entry type no manifest has
    with pytest.raises(ValueError, match="unknown entry type"):
        manifest_codec.decode(bytes(data))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=2000))
def test_random_bytes_after_the_magic_line_are_refused_or_read_whole(noise: bytes, at: int) -> None:
    """300 random tails, spliced at a random place after the magic line."""
    data = encoded()
    at = len(manifest_codec.MAGIC) + at % (len(data) - len(manifest_codec.MAGIC))
    try:
        head, items = manifest_codec.decode(data[:at] + noise)
    except ValueError:
        return
    assert sum(len(c["names"]) for _, _, c in items) == head["entries"]


def test_a_large_manifest_round_trips() -> None:
    rng = random.Random(7)
    names = [f"f{i}.py" for i in range(3000)]
    f = Folder(names, "f" * 3000, [0o644] * 3000, [rng.randrange(10**9) for _ in names],
               [rng.randrange(2**62) for _ in names], "C" * 3000, [rng.randrange(2**63) for _ in names], None,
               [rng.randrange(2**62) for _ in names], bytes(rng.randrange(256) for _ in range(32 * 3000)), None)
    head, items = manifest_codec.decode(manifest_codec.encode({"roots": []}, [(0, "pkg", f)]))
    (ri, rel, c), = items
    assert c["names"] == names and list(c["sizes"]) == f.sizes and c["shab"] == f.shab
    assert isinstance(c["inos"], array)
