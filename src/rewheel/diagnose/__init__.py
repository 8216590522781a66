"""The root cause of a crash, from its log: `rewheel why` and every failed run's report.

A vLLM crash buries its real error under cascades: the worker that raised is followed by
"WorkerProc was terminated" on every other rank, the engine core's "WorkerProc
initialization failed ... See stack trace for root cause", the API server's "Engine core
initialization failed. See root cause above", and with `Restart=always` the same again for
every restart. This package reads such a log as users have it — plain vLLM output, journald
lines (`Feb 20 23:31:36 host vllm-kimi[216054]: ...` or `journalctl -o json`), process
prefixes (`(Worker_TP4 pid=216061) `), ANSI colours, a logger header on every traceback
line, several processes' tracebacks interleaved, chained exceptions, truncated logs — and
names the root exception, the failing rank, the deepest frame inside the upgraded package,
where in the log it starts, how often it repeats, and the secondary errors it caused. It
reads logs as people collect and paste them too: collector wrappers, damaged pastes, other
runtimes' shapes (sglang, Ray, IPython, pytest, torchrun, TGI, Rich), and a wrapper nobody
listed is learnt from the log itself; the failing process is named also where only a launcher
names it.

The package, by what each module recognises (each imports only those above it):

- `limits`      — the bounds that keep memory flat however large or hostile the log is
- `results`     — `Frame`, `Secondary`, `RootCause`, `Diagnosis`: what `why` answers
- `wrappers`    — what stands before each line: collectors (journald, syslog, docker
                  compose, Docker Desktop, kubectl, CI, srun, quotes), process prefixes (Ray,
                  vLLM, SkyPilot, `[rankN]:`), logger headers (vLLM, sglang), a wrapper learnt
                  from the log; colours, `\r` progress bars, tracebacks in escaped strings
- `ranking`     — crashes (restarts) and occurrences, cascades, the scoring of `Type: message`
                  lines, and the choice of the root among everything found
- `processes`   — where a log names the failing process (prefixes, a launcher's summary, a dead
                  actor's fields, raylet, a logger's field, the same error elsewhere) and which
                  naming the answer takes (`rank_source`, `evidence`)
- `tblines`     — what each line of a traceback is (frames, exception lines, chain markers,
                  group margins, the records that end a message)
- `boxes`       — tracebacks drawn in a box by Rich, as the plain lines they stand for
- `boxwrap`     — Rich's line wrap in a box, undone: whether a box line goes on with the one
                  before, and with or without a space
- `tracebacks`  — Python tracebacks in every shape: chains, exception groups, a traceback
                  begun mid-line, tracebacks inside an exception's message (Ray Serve,
                  DataLoader, torch.multiprocessing.spawn), ranks interleaved line by line, Ray's
                  remote frames, IPython, pytest, lost indentation, CANN's foreign block
- `errorlines`  — crashes without a (complete) traceback: C++'s terminate and `what()`,
                  faulthandler dumps, torchrun's summary, strong error lines (OOM, NCCL, CUDA,
                  signals) and the floor: the best `Type: message` line, its process from the
                  prefixes around it
- `analyser`    — `Analyser`: one line at a time through the above
- `readers`     — the entry points: a file (fast, bounded), lines, stdin, a unit's journal

Design:
- Streaming and bounded. Lines are demultiplexed into streams (journald pid, process
  label and pid, logger-header or raw); each stream holds at most one traceback in flight,
  capped in frames and message size; completed tracebacks are folded into per-signature
  aggregates and per-crash ("epoch") lists that are capped too. The whole log is never held.
- Fast on large files. `analyse_file` reads 1 MiB binary chunks and jumps between
  occurrences of "Traceback (most recent call last)" with `bytes.find` (C speed); only
  lines near an in-flight traceback are decoded and parsed. Line numbers are resolved at
  the end by one newline-counting pass up to the furthest reported position. Only when no
  traceback names what was raised does it re-read the file line by line for error lines
  (CUDA/NCCL/OOM/undefined-symbol/...), which tracebacks make unnecessary otherwise.
- Ranking. Cascade exceptions (see `ranking.CASCADE_*`) are secondary. The root is the
  earliest non-cascade exception logged at error level (or raw) in the first crash that has
  one; within a chain the original exception, unless it is a cascade, a wrapper whose
  message is the real failure's traceback, or a bare lookup failure (KeyError, StopIteration,
  IndexError) that the code turned into a more telling error. Failing that: the best
  `Type: message` line (never worse than the first one grep would find), the strongest error
  line, then warning-level tracebacks, then cascades.
"""

from rewheel.diagnose.limits import MAX_MESSAGE_CHARS
from rewheel.diagnose.readers import analyse_file, analyse_journal, analyse_lines, analyse_stream
from rewheel.diagnose.results import Diagnosis, Evidence, Frame, RootCause, Secondary, first_line, short_path

__all__ = ["MAX_MESSAGE_CHARS", "Diagnosis", "Evidence", "Frame", "RootCause", "Secondary", "analyse_file",
           "analyse_journal", "analyse_lines", "analyse_stream", "first_line", "short_path"]
