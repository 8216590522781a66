"""The bounds that keep `why`'s memory flat however large or hostile the log is, and the
one header every reader looks for."""

from __future__ import annotations

MAX_MESSAGE_LINES = 40          # continuation lines of one exception message
MAX_MESSAGE_CHARS = 8000
MAX_CHAIN = 8                   # exceptions in one chain
MAX_FRAMES_KEPT = 64            # innermost frames kept of one exception (for the suspects)
MAX_SOURCE_RUN = 20             # unindented lines read as one frame's source, at most
MAX_TWINS = 16                  # interleaved tracebacks read as one
MAX_STREAMS = 512               # concurrent in-flight tracebacks
MAX_EPOCH_OCCURRENCES = 400     # occurrences kept for one crash
MAX_SIGNATURES = 5000
MAX_PROCS_PER_SIG = 10000
MAX_SECONDARY = 20
IDLE_CLOSE_LINES = 1000         # an in-flight traceback untouched this long is closed
CONTEXT_LINES = 8               # lines before a traceback the fast path reads too (they may name it)
EARLY_LINES = 1000              # a traceback cut off at the log's start is recognised here
TAIL_LINES = 40                 # lines after a traceback both readers read (a launcher's summary)
LAUNCHER_TRACEBACKS = 2         # a launcher's summary names a failure at most this many tracebacks back
MAX_EVIDENCE = 8                # places naming the failing process, reported
MAX_SAID = 256                  # launchers' statements and raylet's lines kept while reading
CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 20        # longer "lines" are cut (journald's own LineMax is 48 KiB)

TB_NEEDLE = b"Traceback (most recent call last)"
TB_HEAD = "Traceback (most recent call last)"
