"""The lines a Python traceback is made of, and what each one says: a frame (also without
quotes or indentation), an exception line, a chain's marker, an exception group's margins and
separators, the record that ends a message, Ray's wrapper of a remote failure, IPython's and
pytest's forms, and the functions of a shutdown path. `tracebacks.TracebackReader` puts them
together."""

from __future__ import annotations

import re

# A frame line; pastes that lost the quotes ("File /x.py, line 5, in f") are frames too.
# (Pastes that lost their indentation have them at column 0: read there only inside a traceback.)
FRAME_RE = re.compile(r'\s*File (?:"(?P<file>[^"]+)"|(?P<bare>[^\s",][^",]*)), line (?P<line>\d+)(?:, in (?P<func>.+))?$')
# Statements that can be a frame's source line but look like a bare exception name
NOT_EXCEPTIONS = {"return", "pass", "break", "continue", "raise", "yield", "else", "try", "finally"}
WRAPPED_FRAME_MIN = 60          # a frame line this long that does not parse was cut by a wrap
NESTED_TB_RE = re.compile(r'(?:Original |Remote )?Traceback \(most recent call last\):?\s*$')
# Ray's wrapper of a remote task's exception; the remote frames and exception follow it.
# (also an actor whose creation task raised: "ActorDiedError: The actor died because of an error
# raised in its creation task, ray::WorkerDict.__init__() (pid=N, ip=A, ...)", then its frames)
RAY_WRAP_RE = re.compile(
    r"(?:ray\.exceptions\.)?(?:Ray(?:Task|Actor)Error(?:\((?P<inner>[\w.]+)\))?:"
    r"|(?P<died>ActorDiedError|RayActorError): The actor died because of an error raised in its creation task,)"
    r" ray::(?P<call>\S*?) \(pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^,)\s]+))?")
# torch.multiprocessing.spawn's ProcessRaisedException: its message is the child's traceback
SPAWN_CHILD_RE = re.compile(r"-- Process (?P<rank>\d+) terminated with the following error:$")
# an exception's name in a sentence (no message after it): "运行后报 ValueError 错误"
PROSE_TYPE_RE = re.compile(r"(?<![A-Za-z0-9_.])(?<!::)(?P<type>[A-Z]\w*(?:Error|Exception))(?![\w.])")
# IPython / Jupyter tracebacks.
IPY_HEAD_RE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)\s{2,}$")
IPY_FRAME_RE = re.compile(
    r"(?:\[(?P<f1>[^\]]+)\]\([^)]*\)|File (?P<f2>\S.*?):(?P<l2>\d+),|(?P<f3>(?:/|~|[A-Za-z]:\\|<ipython-input)\S*)"
    r"|Input In \[\d+\],)"
    r" in (?P<func>[^(]+)\(|Cell In ?\[\d+\], line (?P<l4>\d+)")
IPY_SKIP_RE = re.compile(r"\d+ frames?$|\[\.\.\. skipping|\.\.\.$")
IPY_ARROW_RE = re.compile(r"-*> ?(?P<line>\d+) ?(?P<src>.*)$")
# pytest: the exception's `E   ` lines and the `path.py:LINE: Type` location after them.
PYTEST_E_RE = re.compile(r"E(?: {3,}|\t)(?P<text>.*)$")
PYTEST_LOC_RE = re.compile(r"(?P<file>[^\s:][^:]*\.py):(?P<line>\d+): (?P<what>.*)$")
PYTEST_DEF_RE = re.compile(r"\s*(?:async )?def (?P<name>\w+)\(")
# pytest --tb=short: `path.py:LINE: in func` before each frame's source line
PYTEST_SHORT_RE = re.compile(r"(?P<file>[^\s:][^:]*\.py):(?P<line>\d+): in (?P<func>[\w<>.]+)$")
# Functions of a shutdown or clean-up path: a traceback through them after a failure is its
# consequence, not its cause.
SHUTDOWN_FUNCS = {"shutdown", "_shutdown", "__del__", "cleanup", "_cleanup", "close_all", "atexit_handler",
                  "_exit_function", "destroy_process_group", "destroy_model_parallel",
                  "destroy_distributed_environment", "_python_exit", "terminate"}
# a line that no exception's line starts like: a word, then a space ("Error executing job ...")
NOT_AN_EXC_LINE_RE = re.compile(r"[A-Za-z_][\w.]* ")
EXC_RE = re.compile(r"(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?: (?P<msg>.*))?)?$")
CHAIN_CONTEXT = "During handling of the above exception, another exception occurred:"
CHAIN_CAUSE = "The above exception was the direct cause of the following exception:"
# Lines that start a new record, so they end an exception message instead of continuing it.
RECORD_START_RE = re.compile(
    # a structured logger's record without its timestamp (tracing: " INFO target: ...")
    r"(?: ?(?:TRACE|DEBUG|INFO|WARN|ERROR) [\w:.\-]+: "
    r"|Process [\w\-]+:$|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s|\[[WEIF]\d{4} |\[rank\d+\]:\["
    r"|[WEIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]"
    r"|\S+\.py:\d+: \w*Warning|\s*warnings\.warn\(|\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\[\d{4}-\d\d-\d\d"
    r"|Exception ignored |Fatal Python error|Current thread 0x|Thread 0x|\S+ \[\d+\] NCCL "
    # rewheel's own annotations in the logs it keeps (smoke.log: "[rewheel] smoke failed: ...")
    r"|\[rewheel\] "
    # torchrun's failure summary and mpirun's, drawn between rules
    r"|={20,}$|-{20,}$"
    # rich.logging.RichHandler's records: "[03/04/25 11:20:19] INFO     ...", the time left out
    # when it is the previous record's
    r"|\[\d\d/\d\d/\d{2,4} \d\d:\d\d:\d\d\] |(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) {2,}\S"
    # the smoke runner's own status lines after the error it reports ("vllm_init: FAILED ...")
    r"|\w+: (?:FAILED\b|timings |OK: )"
    # systemd's own lines about the unit, when journald prefixes were stripped (`-o cat`)
    r"|[\w@.\-]+\.service: |(?:Started|Stopped|Starting|Stopping|Failed to start) [\w@.\-]+\.service)")
SPAN_FIELD_RE = re.compile(r"\s+(?:rank|shard)=(?P<rank>\d+)$")
# A block after a message that imitates Python's header but is not a traceback: Ascend CANN's
# indented "TraceBack (most recent call last):" and the C++ call sites under it, after its
# "EI9999: Inner Error!" report. It ends the message; its indented lines are skipped.
FOREIGN_TB_RE = re.compile(r"\s+TraceBack \(most recent call last\)")
IGNORABLE_IN_TB_RE = re.compile(r"(?:INFO|WARNING|DEBUG):\s|\S+:\s+\d+%\|")
# Python 3.11+ exception groups (asyncio.TaskGroup): the group's traceback is drawn inside
# `| ` margins, `+ Exception Group Traceback` opens it, `+-+---- 1 ----` / `+---- 2 ----`
# separate the sub-exceptions and `+------` closes the group.
EG_START_RE = re.compile(r"\s*\+ Exception Group Traceback \(most recent call last\):?\s*$")
EG_MARGIN_RE = re.compile(r"\s*\|(?: |$)")
EG_SEP_RE = re.compile(r"\s*\+(?:-\+)?-+ (?:\d+|\.\.\.) -+\s*$")
EG_END_RE = re.compile(r"\s*\+-{8,}\s*$")
GROUP_TYPES = {"ExceptionGroup", "BaseExceptionGroup"}


def decoration(text: str) -> bool:
    """Python 3.11+ caret/tilde markers and 3.13's elided-lines marker: not source."""
    return (not text.strip("^~ ")) or (text.startswith("...<") and text.endswith(">...")) \
        or text.startswith("[Previous line repeated")


def ungroup(line: str) -> tuple[str, str | None]:
    """An exception-group line as a plain traceback line: margins stripped, the group's
    header as a traceback header; separators come back as "sep", the closing rule as "end"."""
    while True:
        m = EG_MARGIN_RE.match(line)
        if not m:
            break
        line = line[m.end():]
    if EG_START_RE.match(line):
        return "Traceback (most recent call last):", None
    if EG_SEP_RE.match(line):
        return line, "sep"
    if EG_END_RE.match(line):
        return line, "end"
    return line, None


def exception_line(line: str) -> bool:
    """Whether an unindented line inside a traceback is its exception line rather than a
    frame's source line that lost its indentation: `Type: message`, `pkg.Type`, `Type`."""
    m = EXC_RE.match(line)
    if not m:
        return bool(RAY_WRAP_RE.match(line))
    t = m.group("type")
    return t not in NOT_EXCEPTIONS and (":" in line or "." in t or t[:1].isupper())


def func_name(name: str | None) -> str | None:
    """A frame's function: `PreTrainedModel.to` (IPython, 3.11 qualified names) -> `to`."""
    if not name:
        return None
    name = name.strip()
    if name.startswith("<"):
        return name
    return name.rsplit(".", 1)[-1] or name


def ray_actor(call: str) -> str:
    """The actor (or task) of Ray's `ray::NAME` call: `_Inner.train()` -> `_Inner`,
    `ServeReplica:app:Model.handle_request()` -> `ServeReplica:app:Model`, `MapBatches(f)()`
    -> `MapBatches(f)`, `IDLE` -> `IDLE`."""
    if call.endswith("()"):
        call = call[:-2]
        head, dot, method = call.rpartition(".")
        if dot and head and method.isidentifier():
            call = head
    return call or "ray"


def in_package(path: str, package: str | None) -> bool:
    if not package:
        return False
    return f"/{package}/" in path.replace("\\", "/")
