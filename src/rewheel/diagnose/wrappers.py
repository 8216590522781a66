"""What stands before each line of a log, and how it is taken off.

Collectors put a wrapper on every line (journald's output modes and `journalctl -o json`,
syslog files, docker compose, Docker Desktop's log view, `kubectl logs --prefix`, CI runners'
timestamps, `srun -l`, a reply's `> `); processes put prefixes (Ray's `(Label pid=N, ip=A)`,
vLLM's `(Worker_TP4 pid=N)`, SkyPilot's `(worker1, rank=1, pid=N, ip=A)`, torch's `[rankN]:`,
repeated); loggers put headers (vLLM's `ERROR 07-28 15:07:00 [file.py:12]`, sglang's
`[2025-07-28 15:07:00 DP0 TP1]`). Each is stripped, in any mix and order, and what it names
is kept: the node, the journal's pid, the process's label and pid, the level. A wrapper
nobody listed is learnt from the log (see `wrapper_pattern`). Also: what a terminal showed
of a line (`\r` progress bars, colours, colours that lost their ESC) and a traceback inside
one escaped string.
"""

from __future__ import annotations

import html
import re
from typing import Any, NamedTuple

from rewheel.diagnose.limits import TB_HEAD

HTML_ESCAPE_RE = re.compile(r"&(?:quot|lt|gt|amp|#39|#x27);")
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Colour codes whose ESC byte was lost on the way into a paste ("[1;36m(VllmWorker ...)").
BARE_SGR_RE = re.compile(r"\[[0-9;]{0,15}m")
JOURNAL_RE = re.compile(
    r"(?:<\d{1,3}>)?"                                        # a syslog priority, in syslog files
    r"(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d(?:\.\d+)?"     # short, short-precise, syslog
    # short-iso(-precise): journald writes the offset (+0000); a bare Z is a CI runner's stamp
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d)?"
    r"|\[ *\d+\.\d+\]|\d{9,11}\.\d+"                         # short-monotonic, short-unix
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [A-Z][A-Za-z0-9+\-]{0,5})"  # short-full, with-unit
    # (a host is never a log level: "2025-08-12 07:37:57,002 INFO x.py:21 -- ..." is a logger's line)
    r" (?!(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b)(?P<host>[^\s:()\[\]|]+)"
    r" (?P<ident>[^\s\[\]:()]+)(?:\[(?P<pid>\d+)\])?: ?")
# Collector wrappers: what a log collector puts before each line of a process's output.
# Each is stripped (any mix, in any order) and what it names is kept as the line's node.
WRAPPER_RE = re.compile(
    # RFC 5424 syslog: <PRI>1 TIMESTAMP HOST APP PID MSGID SD MSG
    r"<\d{1,3}>1 \S+ (?P<s_host>\S+) (?P<s_app>\S+) (?P<s_pid>\d+|-) \S+ (?:-|\[.*?\]) "
    # Docker Desktop's log view (and other viewers): 2025-10-14 09:12:33.412 | (local time, no zone)
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? +\|(?: |$)"
    # CI runners: 2025-07-28T15:07:00.9685040Z (GitLab adds a stream tag, 00O / 01E+)
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z(?: \d\d[OE]\+?)?(?: |$)"
    # kubectl logs --prefix: [pod/NAME/CONTAINER]
    r"|\[pod/(?P<k_pod>[^/\]\s]+)/(?P<k_container>[^\]\s]+)\](?: |$)"
    # docker compose: service-1  | (padded to the longest service name)
    # (never a log level: "ERROR    | module:func:12 - ..." is loguru's record, see HEADER_RE)
    r"|(?!(?:TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) +\|)(?P<d_service>[A-Za-z0-9][\w.\-]*) +\|(?: |$)"
    # srun -l: the task number
    r"|(?P<task>\d{1,5}):(?: |$)"
    # a log quoted in a reply (markdown / e-mail): "> ", "> > "
    r"|(?P<quote>(?:> ?)+)")
# grep -n's line number ("88410:" on a match, "88411-" on a context line), after the file's
# path with -r ("logs/w-3.log:8812:", "logs/w-3.log-8813-"): taken off where a wrapper or
# prefix we know follows it
# (one lazy run, bounded: linear in the line's first word)
GREP_N_RE = re.compile(r"(?:[^\s:]{1,400}?[:-])?\d{1,10}[:-](?=\S)")
PROC_RE = re.compile(r"\((?:(?P<label>[A-Za-z][^()]*?) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^,)\s]*)[^)]*)?\) ?")
# Ray's de-duplication of lines printed by many workers
RAY_REPEAT_RE = re.compile(r"\s*\[repeated \d+x across cluster\]$")
RANK_RE = re.compile(r"\[rank(?P<rank>\d+)\]: ?")
# mpirun --tag-output (Horovod, DeepSpeed over MPI): "[1,3]<stderr>:" (the job and the rank)
MPI_TAG_RE = re.compile(r"\[\d+,(?P<rank>\d+)\]<std(?:out|err|diag)>: ?")
# torchrun's --tee / --redirects: "[default3]:" (the role and the local rank) before every line
TEE_RE = re.compile(r"\[(?!rank\d)(?P<role>[A-Za-z_]+\d+)\]:")
# sglang's logger header: [2025-07-28 15:07:00 DP0 TP1] (ranks absent in the main process)
SGLANG_RE = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?(?P<ranks>(?: (?:DP|TP|PP|EP|CP)\d+)*)\] ")
HEADER_RE = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +(?:\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"
    r" (?:\[[^\]]*\]|[\w.\-]+:\d+\]) ?"
    # loguru (after its "DATE TIME.ms | " stamp): "ERROR    | module:function:12 - "
    r"|\| [\w.<>\-]+:[\w.<>\-]+:\d+ - )")
# A traceback printed inside an exception's message (the message is the formatted traceback
# of the process that really failed): PyTorch DataLoader's "Original Traceback", Ray Serve's
# "RuntimeError: Traceback ...", concurrent.futures' quoted _RemoteTraceback.
# Prefixes that name a process, found after text we do not know: that text is a wrapper.
KNOWN_INNER_RE = re.compile(r"\((?:[A-Za-z][^()]*? )?pid=\d+|\[rank\d+\]:"
                            r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d")
MAX_WRAPPER_CHARS = 80
ESCAPED_TB = TB_HEAD + ":\\n"     # the same, inside an escaped string: its newlines are "\n"
NEXT_STRING_RE = re.compile(r"\s*,\s*(['\"])")   # the next string of a list repr
MAX_LIST_STRINGS = 400
# A tqdm bar that another writer's line was glued to ("...| 5/10 [00:01<00:01, 3.2it/s]ERROR ...").
TQDM_TAIL_RE = re.compile(r".*?\d+%(?:\|[^|]*\|| Completed \|)[^\[\]]*\[[^\]]*\]")


class Prefixes(NamedTuple):
    """A line without what stood before it, and what that named."""
    line: str
    jpid: int | None
    ident: str | None
    node: str | None
    label: str | None              # the process: its prefixes' names joined, a logger header's ranks
    pid: int | None
    level: str | None              # a logger header's level
    header: str                    # the logger header itself ("" if none)
    prefix_label: str | None       # what the process prefixes alone named


def journal_message(entry: dict[str, Any]) -> str | None:
    """A journal entry's MESSAGE as text (journald writes one that is not UTF-8 as a list of
    bytes); None where it has none."""
    msg = entry.get("MESSAGE")
    if isinstance(msg, list):
        try:
            return bytes(msg).decode("utf-8", "replace")
        except (TypeError, ValueError):
            return None
    return msg if isinstance(msg, str) else None


def journal_pid(entry: dict[str, Any], default: int | None) -> int | None:
    """A journal entry's _PID, or `default`."""
    try:
        return int(entry["_PID"]) if entry.get("_PID") is not None else default
    except (TypeError, ValueError):
        return default


def clean(raw: str) -> str:
    """What a terminal shows of a line: right padding, CRLF and `\r` progress bars (the text
    after the last carriage return), Ray's de-duplication note, colours (with or without ESC),
    and a paste that kept the HTML escapes of the page it came from (`File &quot;x.py&quot;`)."""
    line = raw.rstrip()
    if "&" in line and HTML_ESCAPE_RE.search(line):
        line = html.unescape(line)
    if "\r" in line:
        line = _after_carriage(line)
    if line.endswith("across cluster]"):
        line = RAY_REPEAT_RE.sub("", line)
    if "\x1b" in line:
        line = ANSI_RE.sub("", line)
    if "m" in line and "[" in line:
        line = BARE_SGR_RE.sub("", line)
    return line


def read_prefixes(line: str, *, jpid: int | None, ident: str | None, node: str | None,
                  learned: re.Pattern[str] | None) -> Prefixes:
    """Strip the wrappers, process prefixes and logger header before `line`."""
    task: str | None = None
    for _ in range(6):
        if learned is not None:
            m = learned.match(line)
            if m:
                # a wrapper this log puts on every line, learnt at its first traceback
                line = line[m.end():]
                learned = None
                continue
        c = line[:1]
        if not (c.isalnum() or c in "<[>./"):
            break
        if jpid is None:
            m = JOURNAL_RE.match(line)
            if m:
                ident = m.group("ident")
                jpid = int(m.group("pid")) if m.group("pid") else None
                node = node or m.group("host")
                line = line[m.end():]
                continue
        m = WRAPPER_RE.match(line)
        if not m:
            g = GREP_N_RE.match(line)
            if g is None or not _known_after(line[g.end():], jpid):
                break
            line = line[g.end():]
            continue
        if m.group("task") is not None:
            task = task or m.group("task")
        elif m.group("quote") is not None:
            pass
        else:
            node = m.group("k_pod") or m.group("d_service") or m.group("s_host") or node
            if m.group("s_pid") and m.group("s_pid") != "-" and jpid is None:
                jpid = int(m.group("s_pid"))
        line = line[m.end():]
    label: str | None = None
    pid: int | None = None
    tee: str | None = None
    rank_tag: str | None = None
    for _ in range(6):
        c = line[:1]
        if c == "(":
            m = PROC_RE.match(line)
            if m:
                # SkyPilot over Ray: "(worker1, rank=1, pid=N, ip=A)": the label without its comma
                name = (m.group("label") or "").strip().rstrip(",").strip()
                label = _rank_name(name, m.group("pid"), m.group("ip")) if name else f"pid={m.group('pid')}"
                pid = int(m.group("pid"))
                node = m.group("ip") or node
                line = line[m.end():]
                continue
        elif c == "[" and line.startswith("[rank"):
            # torch's `[rankN]:`, repeated when a launcher prefixes it again; a process label
            # around it (Ray, SkyPilot) names the node's process, the tag the torch rank
            m = RANK_RE.match(line)
            if m:
                rank_tag = f"rank{m.group('rank')}"
                line = line[m.end():]
                continue
        elif c == "[" and line[1:2].isdigit() and "]<std" in line[:20]:
            m = MPI_TAG_RE.match(line)
            if m:
                rank_tag = f"rank{m.group('rank')}"
                line = line[m.end():]
                continue
        elif c == "[" and line[1:2].isalpha():
            m = TEE_RE.match(line)
            if m:
                tee = m.group("role")
                line = line[m.end():]
                continue
        break
    if rank_tag is not None or tee is not None:
        # (torch's own rank tag, where there is one, says more than torchrun's local one)
        label = _join_label(label, rank_tag or tee)
    level: str | None = None
    header = ""
    prefix_label = label
    if line[:1] in ("D", "I", "W", "E", "C"):
        m = HEADER_RE.match(line)
        if m:
            level = m.group("level")
            header = m.group(0)
            line = line[m.end():]
    elif line.startswith("[") and line[1:2].isdigit():
        m = SGLANG_RE.match(line)
        if m:
            header = m.group(0)
            label = _join_label(label, m.group("ranks").strip() or None)
            line = line[m.end():]
    if task is not None and label is None:
        label = f"rank{task}"
    return Prefixes(line, jpid, ident, node, label, pid, level, header, prefix_label)


def _known_after(rest: str, jpid: int | None) -> bool:
    """Whether what follows a number is a wrapper or prefix we know (then the number is grep's)."""
    if rest[:1] in "[(" or (jpid is None and JOURNAL_RE.match(rest) is not None):
        return True
    m = WRAPPER_RE.match(rest)
    return m is not None and m.group("task") is None


def _after_carriage(line: str) -> str:
    """What a terminal shows of a line with `\r` progress bars: the text after the last
    carriage return, without a progress bar that a logger line was written straight after."""
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return ""
    last = parts[-1]
    m = TQDM_TAIL_RE.match(last)
    if m and m.end() < len(last):
        last = last[m.end():]
    return last


def escaped_traceback(line: str) -> str:
    """The traceback held in an escaped string of `line` (a JSON field, a repr), unescaped:
    from its start to the string's closing quote (the rest of the line is not its); in a list
    of strings (`traceback.format_exception`'s, printed: `['Traceback ...\\n', '  File ...']`),
    the strings that follow it too."""
    start = line.index(ESCAPED_TB)
    quote = line[start - 1] if start and line[start - 1] in "\"'" else None
    if quote is None:
        return _unescape(line[start:])
    parts: list[str] = []
    i = start
    in_list = line[: start - 1].rstrip().endswith("[")
    while len(parts) < MAX_LIST_STRINGS:
        end = _closing_quote(line, i, quote)
        parts.append(line[i:end])
        m = NEXT_STRING_RE.match(line, end + 1) if in_list and end < len(line) else None
        if m is None:
            break
        quote, i = m.group(1), m.end()
    return _unescape("".join(parts))


def _closing_quote(line: str, i: int, quote: str) -> int:
    """Where the string literal whose text starts at `i` ends (its closing quote; the line's
    end if it has none)."""
    while True:
        i = line.find(quote, i)
        if i < 0:
            return len(line)
        backslashes = len(line[:i]) - len(line[:i].rstrip("\\"))
        if backslashes % 2 == 0:
            return i
        i += 1


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": ""}.get(m.group(1), m.group(1)), text)


def _rank_name(label: str, pid: str, ip: str | None) -> str:
    """The process a prefix names. A label with a rank in it (`Worker_TP4`, `VllmWorker
    rank=3`) names one process; a pool's label (`RayWorkerWrapper`, `VllmWorkerProcess`,
    anything on another node) does not, so its pid is part of the name."""
    if (ip or "Worker" in label or label.startswith("Ray")) and not any(ch.isdigit() for ch in label):
        return f"{label} pid={pid}"
    return label


def _join_label(outer: str | None, inner: str | None) -> str | None:
    """One name for a process that two stacked prefixes name: `WorkerDict pid=7 TP1`,
    `worker1, rank=1 rank4` (the same name twice stays one)."""
    if not outer or not inner or inner in outer:
        return outer or inner
    return f"{outer} {inner}"


def wrapper_pattern(text: str) -> re.Pattern[str]:
    """A wrapper seen once as a pattern for every line: its numbers (times, counters, a host's
    index) may change from line to line, the rest may not."""
    return re.compile(re.sub(r"\d+", lambda _: r"\d+", re.escape(text)))
