"""`rewheel why`, fourth round: tracebacks that are not where a parser expects them, and the
failing process named only by a launcher.

The corpus logs of the round (tests/logs, written by build_round4.py) are checked by
test_diagnose.py's corpus tests like every other log; here: the process each names and what
named it (`rank_source`, `evidence`), the rules for launchers' statements, and sweeps of each
shape as a class — real Rich boxes at many widths, their paths folded at every position, cut
anywhere above the last frame, with and without locals; real `traceback.format_exception`
lists behind any mix of prefixes; an error quoted in prose in several scripts; every corpus
log pasted with a blank line after each line.
"""

from __future__ import annotations

import importlib.util
import itertools
import io
import json
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.traceback import Traceback

from rewheel import diagnose
from rewheel.diagnose.processes import launcher_statement

LOGS = Path(__file__).parents[1] / "logs"
ROUND4 = {  # log: (rank, pid, node, rank_source, the evidence's sources in order)
    "rich_box_traceback": (None, None, None, None, []),
    "rich_box_cut_at_top": (None, None, "vllm-7d9f", None, []),
    "traceback_in_list_repr": ("rank0", None, None, "prefix", ["prefix"]),
    "traceback_in_quoted_message": ("WorkerDict pid=2791", 2791, "10.0.0.3", "prefix", ["prefix"]),
    "cut_traceback_error_in_prose": (None, None, None, None, []),
    "blank_line_after_every_line": ("TP1", None, None, "nearby", ["nearby"]),
    "launcher_names_rank_lmdeploy": ("rank2", None, None, "launcher", ["launcher"]),
    "launcher_names_rank_torchrun_table": ("rank6", 4402, "gpu-09", "launcher", ["launcher", "launcher", "launcher"]),
    "launcher_names_rank_tgi_repeat": ("rank=1", None, None, "same-error", ["same-error", "launcher"]),
    "ray_actor_died_without_traceback": ("WorkerDict pid=5120", 5120, "10.0.3.7", "actor", ["actor", "raylet"]),
    "bare_exception_then_teardown": (None, None, None, None, []),
    "cann_traceback_block_after_message": ("Worker_TP0", 3442, None, "prefix", ["prefix"]),
}


def rc_of(lines: list[str]) -> dict:
    return diagnose.analyse_lines(lines).to_json()["root_cause"]


@pytest.mark.parametrize("name", sorted(ROUND4))
def test_the_process_and_what_named_it(name: str) -> None:
    rank, pid, node, source, sources = ROUND4[name]
    rc = diagnose.analyse_file(LOGS / f"{name}.log", package="vllm").to_json()["root_cause"]
    assert (rc["rank"], rc["pid"], rc["node"], rc["rank_source"]) == (rank, pid, node, source)
    assert [e["source"] for e in rc["evidence"]] == sources
    if rc["evidence"]:
        first = rc["evidence"][0]
        assert first["rank"] == rank and all(e["log_line"] for e in rc["evidence"])


def test_the_torchrun_table_names_the_root_cause_entry_first() -> None:
    rc = diagnose.analyse_file(LOGS / "launcher_names_rank_torchrun_table.log").to_json()["root_cause"]
    text = (LOGS / "launcher_names_rank_torchrun_table.log").read_text().splitlines()
    said = [(e["rank"], e["pid"], text[e["log_line"] - 1].strip()) for e in rc["evidence"]]
    assert said == [("rank6", 4402, "rank      : 6 (local_rank: 2)"),
                    ("local_rank2", 4402, text[7].strip()),            # "failed (exitcode: 1) local_rank: 2 ..."
                    ("rank7", 4403, "rank      : 7 (local_rank: 3)")]  # under "Failures:": another child


@pytest.mark.parametrize(("line", "said"), [
    ("E0301 10:00:05.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
     "local_rank: 2 (pid: 4402) of binary: /usr/bin/python", ("local_rank2", 4402, None, 2)),
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 11) of binary: x",
     ("local_rank0", 11, None, 2)),
    ("2025-03-01 10:00:07,551 - lmdeploy - ERROR - model_agent.py:489 - Rank[2] failed.", ("rank2", None, None, 2)),
    ("lmdeploy - ERROR - TP process 3 failed with exitcode 1.", ("rank3", None, None, 2)),
    ("[2024-06-11 09:21:16,524] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
     "'--local_rank=2', '--deepspeed', 'ds.json'] exits with return code = 1", ("local_rank2", None, None, 2)),
    ("srun: error: gpu-node-13: task 11: Exited with exit code 1", ("rank11", None, "gpu-node-13", 2)),
    ("2024-09-02T12:42:05.418744Z ERROR text_generation_launcher: Shard 1 failed to start", ("rank=1", None, None, 2)),
    # not a statement about one failed child
    ("srun: error: gpu-03: tasks 0-1: Exited with exit code 1", None),
    ("[...] ['/usr/bin/python', '--local_rank=2'] exits with return code = 0", None),
    ("INFO text_generation_launcher: Shard 1 ready in 12.3s", None),
])
def test_launcher_statements(line: str, said: tuple | None) -> None:
    assert launcher_statement(line) == said


TB = ["Traceback (most recent call last):", '  File "/work/a.py", line 3, in f', "    g()",
      "ValueError: bad shape"]


def test_a_prefixed_root_keeps_its_prefix_and_lists_what_the_launcher_said() -> None:
    rc = rc_of([f"[rank1]: {ln}" for ln in TB] + ["srun: error: n1: task 4: Exited with exit code 1"])
    assert (rc["rank"], rc["rank_source"]) == ("rank1", "prefix")
    assert [(e["source"], e["rank"]) for e in rc["evidence"]] == [("prefix", "rank1"), ("launcher", "rank4")]


def test_a_launcher_statement_far_from_the_failure_names_nothing() -> None:
    # read well after the traceback ended (not in the lines both readers read after it) ...
    rc = rc_of(TB + [f"2025-03-01 10:00:{i:02d} step {i}" for i in range(60)]
               + ["2025-03-01 10:01:07 - lmdeploy - ERROR - x.py:1 - Rank[2] failed."])
    assert (rc["rank"], rc["evidence"]) == (None, [])
    # ... or about a later crash: more than two tracebacks later
    other = ["Traceback (most recent call last):", '  File "/work/b.py", line 9, in h', "    k()", "OSError: x{}"]
    lines = TB + [ln.format(i) for i in range(3) for ln in other] + ["lmdeploy - ERROR - x.py:1 - Rank[2] failed."]
    assert rc_of(lines)["rank"] is None


def test_several_processes_read_as_one_are_not_named_by_a_launcher() -> None:
    # two ranks' tracebacks interleaved line by line: which of them the launcher means is unknown
    lines = [ln for ln in TB[:3] for _ in (0, 1)] + ["ValueError: bad shape", "ValueError: bad shape",
                                                       "srun: error: n1: task 1: Exited with exit code 1"]
    assert rc_of(lines)["rank"] is None


def test_raylet_names_a_dead_actor_whose_error_has_no_pid() -> None:
    rc = rc_of(["(raylet) A worker died or was killed ... Worker IP address: 10.0.0.9 Worker port: 1 Worker PID: 77",
                "Traceback (most recent call last):", '  File "/x/ray/_private/worker.py", line 919, in get_objects',
                "    raise value", "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task."])
    assert (rc["rank"], rc["pid"], rc["node"], rc["rank_source"]) == ("pid=77", 77, "10.0.0.9", "raylet")


def test_an_ignored_exception_is_never_the_cause() -> None:
    # Python's "Exception ignored in" report (a destructor, an atexit hook): whatever its frames
    rc = rc_of(["RuntimeError: CUDA error: misaligned address", "Exception ignored in: <object repr() failed>",
                "Traceback (most recent call last):", '  File "/x/pool.py", line 3, in join', "    w.join()",
                "OSError: [Errno 9] Bad file descriptor"])
    assert rc["type"] == "RuntimeError"


# ---- Rich boxes, as Rich draws them ----------------------------------------------------
SRC = '''def load(cfg):
    return build(cfg["model"], cfg)


def build(name, cfg):
    layers = cfg.get("layers", 0)
    if layers % 3:
        raise ValueError(f"{name}: {layers} layers do not split over 3 ranks, choose another tensor parallel size")
    return layers
'''


SUFFIX = "/site-packages/serving_framework_with_a_long_name/models/tensor_parallel_configuration.py"
Raised = tuple[BaseException, str]


@pytest.fixture(scope="module")
def raise_from(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Raised]:
    """The ValueError of SRC (behind `lead` comment lines) raised from a file whose path is
    `length` characters long (where pytest's tmp folder leaves room). The path is padded on
    the left, so that its characters from a box line's width on, and so where each fold of
    it falls, are the same wherever pytest's tmp folder is (if its name is shorter than the
    narrowest box line drawn, 52 characters)."""
    base = tmp_path_factory.mktemp("r")
    made: dict[tuple[int, int], Raised] = {}

    def make(length: int, lead: int) -> Raised:
        if (length, lead) in made:
            return made[(length, lead)]
        # a pad of its own for each lead: a file's lines are cached by its path
        pad = (f"/lead{lead:03d}" * (length // 8 + 1))[-max(length - len(str(base)) - 1 - len(SUFFIX), 1):]
        path = Path(f"{base}/p{pad[1:]}{SUFFIX}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#\n" * lead + SRC)
        spec = importlib.util.spec_from_file_location(f"tp_config_for_rich_{length}_{lead}", path)
        assert spec and spec.loader
        mod: ModuleType = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        try:
            mod.load({"model": "Qwen/Qwen3-14B", "layers": 40})
        except ValueError as exc:
            made[(length, lead)] = exc, str(path)
            return made[(length, lead)]
        raise AssertionError("no exception")

    return make


@pytest.fixture(scope="module")
def raised(raise_from: Callable[[int, int], Raised]) -> Raised:
    return raise_from(160, 0)


MESSAGE = "Qwen/Qwen3-14B: 40 layers do not split over 3 ranks, choose another tensor parallel size"
WRAPS = ["", "vllm-1  | ", "Jul 28 15:07:00 gpu-07 tgi[4700]: ", "[pod/tgi-0/tgi] ", "2025-07-28T15:07:00.9685040Z "]


def rich_lines(exc: BaseException, width: int, locals_: bool) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(
        Traceback.from_exception(type(exc), exc, exc.__traceback__, width=width, show_locals=locals_))
    return out.getvalue().splitlines()


def last_header(lines: list[str], path: str, width: int) -> int:
    """The box line the last frame's header begins on (a fold may begin a line with a `/`)."""
    first = path[:width - 4]
    return max(i for i, ln in enumerate(lines) if ln.startswith("│ " + first))


def assert_read(lines: list[str], path: str, line: int) -> None:
    rc = rc_of(["INFO loading"] + lines)
    assert rc["type"] == "ValueError" and " ".join(rc["message"].split()) == MESSAGE
    assert (rc["frame"]["file"], rc["frame"]["function"], rc["frame"]["line"]) == (path, "build", line)
    assert rc["frame"]["source"].startswith("raise ValueError(")


LEADS = [0, 2, 92]            # the raise on line 8, 10, 100: a fold between any two digits


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(width=st.integers(min_value=56, max_value=200), length=st.integers(140, 460), lead=st.sampled_from(LEADS),
       locals_=st.booleans(), cut=st.floats(0, 1), wrap=st.sampled_from(WRAPS))
# the path folded just before a `/` (its second box line begins with "/models/"), read from
# that header's first line
@example(width=99, length=230, lead=0, locals_=False, cut=1.0, wrap="")
def test_a_rich_box_at_any_width_cut_anywhere_above_its_last_frame(
        raise_from: Callable[[int, int], Raised], width: int, length: int, lead: int, locals_: bool, cut: float,
        wrap: str) -> None:
    exc, path = raise_from(length, lead)
    lines = rich_lines(exc, width, locals_)
    lines = lines[int(cut * last_header(lines, path, width)):]
    assert_read([wrap + ln for ln in lines], path, 8 + lead)


def test_a_path_folded_at_every_position(raise_from: Callable[[int, int], Raised]) -> None:
    # at one width, paths one character longer each time over a whole line: the folds fall on
    # every character of the header's end (each `/`, `:`, digit of the line number, `in`), read
    # as drawn, from the header's first line (the box's top cut off), and without the right
    # border (a paste that lost it)
    width, seen = 80, set()
    for length in range(200, 200 + width - 4):
        exc, path = raise_from(length, 92)
        lines = rich_lines(exc, width, False)
        head = last_header(lines, path, width)
        seen.update(ln[2] for ln in itertools.takewhile(lambda ln: ln[2:-2].strip(), lines[head + 1:]))
        for cut in (0, head):
            assert_read(lines[cut:], path, 100)
            assert_read([ln[:-2] if ln.startswith("│") else ln for ln in lines[cut:]], path, 100)
    assert {"/", ":", "0", "1", "i"} <= seen


@pytest.mark.parametrize("folder", ["My Models/run 2", "模型/张三的文件夹", "x" * 40 + "/" + "模" * 30],
                         ids=["spaces", "wide", "wide-folded"])
@pytest.mark.parametrize("func", ["f", "build_" + "x" * 70], ids=["short", "long"])
def test_a_header_with_spaces_wide_characters_or_a_long_function(tmp_path: Path, folder: str, func: str) -> None:
    # Rich breaks at a space in the path, leaves a cell free where a wide character does not
    # fit, and folds a function name wider than the line over several lines
    path = tmp_path / folder / "mod.py"
    path.parent.mkdir(parents=True)
    path.write_text(f"def {func}():\n    raise ValueError({MESSAGE!r})\n")
    spec = importlib.util.spec_from_file_location("odd_header", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(ValueError) as info:
        getattr(mod, func)()
    for width in range(40, 130, 9):
        lines = rich_lines(info.value, width, False)
        for drawn in (lines, [ln[:-2] if ln.startswith("│") else ln for ln in lines]):
            rc = rc_of(drawn)
            assert (rc["frame"]["file"], rc["frame"]["function"], rc["frame"]["line"]) == (str(path), func, 2), \
                (width, drawn is lines)


# ---- tracebacks that survive only in a string --------------------------------------------
# (in the order they stand in: grep's number, Ray's prefix, torchrun's tee, torch's rank tag, a logger's header)
ORDER = ["{n}:", "(WorkerDict pid={p}) ", "[default{r}]:", "[rank{r}]: ", "ERROR 07-28 15:07:00 [x.py:3] "]
PREFIXES = st.lists(st.sampled_from(ORDER), unique=True, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefixes=PREFIXES, lead=st.sampled_from(["", "step 12 failed: ", "retrying after: "]),
       r=st.integers(0, 15), n=st.integers(1, 10 ** 6), quoted=st.booleans())
def test_a_traceback_in_a_list_repr_or_a_quoted_string_behind_any_prefixes(
        raised: tuple[BaseException, str], prefixes: list[str], lead: str, r: int, n: int, quoted: bool) -> None:
    exc, path = raised
    parts = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = repr("".join(parts)) if quoted else repr(parts)
    order = sorted(prefixes, key=ORDER.index)
    prefix = "".join(order).format(n=n, r=r, p=4000 + r)
    rc = rc_of([prefix + "step 11 ok", prefix + lead + text])
    assert (rc["type"], rc["message"]) == ("ValueError", MESSAGE)
    assert (rc["frame"]["file"], rc["frame"]["line"], rc["frame"]["function"]) == (path, 8, "build")
    want = f"rank{r}" if "[rank{r}]: " in order else f"WorkerDict pid={4000 + r}" if "(WorkerDict pid={p}) " in order \
        else f"default{r}" if "[default{r}]:" in order else None
    assert want is None or want in (rc["rank"] or "")


# ---- a traceback cut before its exception line, the error told in prose ------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.sampled_from(["最后报错", "エラーは", "오류 메시지:", "Ошибка — ", "Fehler: ", "and it says "]),
       quotes=st.sampled_from([("", ""), (" ", ""), ("「", "」"), ("`", "`"), ("\"", "\""), ("：", ""), ("“", "”")]),
       after=st.sampled_from(["", "，请问怎么解决？", "。谢谢", "でした。", " — any idea?"]))
def test_an_error_quoted_in_prose_after_a_cut_traceback(
        raised: tuple[BaseException, str], before: str, quotes: tuple[str, str], after: str) -> None:
    exc, path = raised
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()[:-1]
    rc = rc_of(lines + ["…", "", f"{before}{quotes[0]}ValueError: {MESSAGE}{quotes[1]}{after}"])
    assert rc["type"] == "ValueError" and MESSAGE in rc["message"]
    if quotes[1] or after[:1] in ("，", "。"):
        # the prose after the error is not its message
        assert rc["message"].endswith(MESSAGE)
    assert (rc["frame"]["file"], rc["frame"]["function"]) == (path, "build")


# ---- a paste with a blank line after every line ------------------------------------------
CORPUS = sorted(p.stem for p in LOGS.glob("*.log"))


@pytest.mark.parametrize("name", CORPUS)
def test_a_blank_line_after_every_line_gives_the_same_answer(name: str) -> None:
    exp = json.loads((LOGS / f"{name}.expected.json").read_text())["root_cause"]
    text = (LOGS / f"{name}.log").read_text(errors="replace")
    got = diagnose.analyse_lines([x for ln in text.split("\n") for x in (ln, "")], package="vllm").to_json()["root_cause"]
    if exp is None:
        assert got is None
        return
    assert (got["type"], got["rank"], got["kind"]) == (exp["type"], exp["rank"], exp["kind"])
    assert got["message"].split("\n")[0] == exp["message"].split("\n")[0]
    assert (got["frame"] or {}).get("line") == (exp["frame"] or {}).get("line")


def test_the_report_says_what_named_the_process() -> None:
    from rewheel import report

    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None, force_terminal=False)
    report.render_why(console, diagnose.analyse_file(LOGS / "launcher_names_rank_torchrun_table.log"))
    assert "process: rank6 on gpu-09 (named by the launcher's summary, log line 27)" in out.getvalue()
    out = io.StringIO()
    report.render_why(Console(file=out, width=120, color_system=None),
                      diagnose.analyse_file(LOGS / "cann_traceback_block_after_message.log"))
    assert "process: Worker_TP0\n" in out.getvalue()     # its own prefix: nothing more to say


@pytest.mark.parametrize("path", ["", "train.log", "logs/node-1/worker-3.log", "./run-2.out"])
@pytest.mark.parametrize("prefix", ["[rank3]: ", "Mar 03 14:21:09 inf-07 python[9021]: [rank3]: ",
                                    "(RayTrainWorker pid=3, ip=10.0.0.3) [rank3]: "])
def test_grep_numbers_with_and_without_file_names(path: str, prefix: str) -> None:
    # `grep -n` / `grep -rn -A8`: "N:" (or "path:N:") on the match, "N-" ("path-N-") on context lines
    out = []
    for i, ln in enumerate(TB, 8812):
        sep = ":" if i == 8812 else "-"
        out.append((f"{path}{sep}" if path else "") + f"{i}{sep}{prefix}{ln}")
    rc = rc_of(out)
    assert (rc["type"], rc["message"], rc["frame"]["line"], rc["frame"]["source"]) == ("ValueError", "bad shape", 3, "g()")
    assert "rank3" in rc["rank"]
