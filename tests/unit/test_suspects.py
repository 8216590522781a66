"""Suspects: the changes of an upgrade that a crash's frames point at (rewheel.suspects).

Built from small real texts: an old and a new version of a module, the frames a traceback
gives, the file changes a diff gives, and the patch records a snapshot keeps.
"""

from __future__ import annotations

from rewheel import diagnose, suspects
from rewheel.diff import FileChange

SP = "/opt/env/lib/python3.12/site-packages"

OLD_MODEL = "".join(f"# line {i}\n" for i in range(1, 61))
NEW_MODEL = OLD_MODEL.replace(
    "# line 1\n", "# line 1\nfrom vllm.layers.head_layout import mla_head_range\n").replace(
    "# line 40\n", "# line 40\ndef __init__(self):\n    self.head_range = mla_head_range(num_heads, tp_size, tp_rank)\n"
                   "    if len(self.head_range) * 8 != q_out:\n        raise RuntimeError('cannot reshape')\n")
HELPER = ("\"\"\"head layout\"\"\"\n\n\ndef mla_head_range(num_heads, tp_size, tp_rank):\n"
          "    per_rank = num_heads // tp_size\n    return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)\n\n\n"
          "def other():\n    return 1\n")
OLD_UTILS = "".join(f"u{i}\n" for i in range(1, 200))
NEW_UTILS = OLD_UTILS.replace("u150\n", "u150 changed\n")


def change(path: str, kind: str, dist: str = "vllm") -> FileChange:
    return FileChange(path, f"{SP}/{path}", kind, dist)


CHANGES = [change("vllm/models/deepseek_v2.py", "changed"), change("vllm/layers/head_layout.py", "added"),
           change("vllm/models/utils.py", "changed"), change("vllm/unrelated.py", "changed")]
TEXTS = {"vllm/models/deepseek_v2.py": (OLD_MODEL, NEW_MODEL), "vllm/layers/head_layout.py": (None, HELPER),
         "vllm/models/utils.py": (OLD_UTILS, NEW_UTILS), "vllm/unrelated.py": ("a\n", "b\n")}


def texts(fc: FileChange) -> tuple[str | None, str | None]:
    return TEXTS[fc.path]


def frames(*spec: tuple[str, int, str]) -> list[diagnose.Frame]:
    """Innermost first, as RootCause.frames holds them."""
    return [diagnose.Frame(f"{SP}/{p}", line, fn) for p, line, fn in spec]


def test_the_changed_frame_and_the_helper_its_hunk_calls_are_suspects() -> None:
    fr = frames(("torch/nn/modules/module.py", 1751, "_call_impl"),        # not changed: skipped
                ("vllm/models/deepseek_v2.py", 45, "__init__"),             # the raise
                ("vllm/models/utils.py", 20, "make_layers"))
    patches = [suspects.SavedPatch.from_json({"path": "vllm/models/deepseek_v2.py",
                                              "abs_path": f"{SP}/vllm/models/deepseek_v2.py",
                                              "added_lines": 4, "removed_lines": 0})]
    got = suspects.find_suspects(fr, CHANGES, texts, patches=patches,
                                 patch_files=["/runs/r1/patches/vllm__models__deepseek_v2.py.patch"],
                                 compare_urls={"vLLM": "https://example.invalid/compare/a...b"})
    assert [s.path for s in got] == ["vllm/models/deepseek_v2.py", "vllm/layers/head_layout.py",
                                     "vllm/models/utils.py"]
    top, helper, far = got
    # the hunk that covers the failing line (the new side: the crash ran the new code)
    assert top.distance_lines == 0 and top.change == "changed" and top.frame["line"] == 45
    assert any("+        raise RuntimeError('cannot reshape')" in h.text for h in top.hunks)
    h = next(h for h in top.hunks if "raise" in h.text)
    assert h.new_start <= 45 < h.new_start + h.new_lines
    assert top.patch_removed is not None and top.patch_removed.patch.endswith("deepseek_v2.py.patch")
    assert top.patch_removed.added_lines == 4
    assert top.compare_url == "https://example.invalid/compare/a...b"
    # the new helper the hunk calls, with its definition
    assert helper.change == "added" and helper.reason == "called from deepseek_v2.py:45 (mla_head_range)"
    assert helper.hunks and helper.hunks[0].text.startswith("+def mla_head_range(")
    assert "def other" not in helper.hunks[0].text and helper.patch_removed is None
    # a changed file whose hunk is far from the line: the nearest hunk and its distance
    assert far.distance_lines == 150 - 20 and "+u150 changed" in far.hunks[0].text
    doc = top.to_json()
    assert set(doc) == {"path", "package", "change", "frame", "hunks", "distance_lines", "patch_removed",
                        "compare_url", "reason"}
    assert set(doc["hunks"][0]) == {"old_start", "old_lines", "new_start", "new_lines", "text"}


def test_frames_from_another_host_match_by_site_packages_path() -> None:
    fr = [diagnose.Frame("/usr/local/lib/python3.12/dist-packages/vllm/models/utils.py", 150, "f")]
    got = suspects.find_suspects(fr, CHANGES, texts)
    assert [(s.path, s.distance_lines) for s in got] == [("vllm/models/utils.py", 0)]


def test_nothing_changed_on_the_path_means_no_suspects() -> None:
    fr = frames(("torch/nn/modules/module.py", 1751, "_call_impl"))
    assert suspects.find_suspects(fr, CHANGES, texts) == []
    assert suspects.find_suspects([], CHANGES, texts) == []


def test_without_texts_a_suspect_is_still_named() -> None:
    got = suspects.find_suspects(frames(("vllm/models/deepseek_v2.py", 45, "__init__")), CHANGES, None)
    assert [(s.path, s.hunks, s.distance_lines) for s in got] == [("vllm/models/deepseek_v2.py", [], None)]


def test_hunks_of_added_removed_and_long_hunks_are_clipped() -> None:
    (added,) = suspects.hunks_of(None, "a\nb\n")
    assert (added.old_start, added.old_lines, added.new_start, added.new_lines) == (0, 0, 1, 2)
    assert added.text == "+a\n+b\n"
    (removed,) = suspects.hunks_of("a\n", None)
    assert (removed.old_lines, removed.new_lines, removed.text) == (1, 0, "-a\n")
    new = "".join(f"n{i}\n" for i in range(500))
    hunks, dist = suspects.near_hunks(suspects.hunks_of("x\n", new), 300)
    assert dist == 0 and len(hunks[0].text.splitlines()) <= suspects.MAX_HUNK_LINES + 1
    assert "n299" in hunks[0].text


def test_the_root_cause_keeps_its_frames_innermost_first() -> None:
    text = "\n".join(["Traceback (most recent call last):",
                      f'  File "{SP}/vllm/models/utils.py", line 20, in make_layers',
                      "    layer = fn()",
                      f'  File "{SP}/vllm/models/deepseek_v2.py", line 45, in __init__',
                      "    raise RuntimeError('cannot reshape')",
                      "RuntimeError: cannot reshape"])
    rc = diagnose.analyse_lines(text.splitlines(), package="vllm").root
    assert rc is not None and [f.line for f in rc.frames] == [45, 20]
    got = suspects.find_suspects(rc.frames, CHANGES, texts)
    assert [s.path for s in got][:2] == ["vllm/models/deepseek_v2.py", "vllm/layers/head_layout.py"]
    assert rc.to_json()["suspects"] == []  # set by the caller that knows the upgrade
    rc.suspects = got
    assert rc.to_json()["suspects"][0]["path"] == "vllm/models/deepseek_v2.py"
