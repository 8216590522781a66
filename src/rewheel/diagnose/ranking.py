"""Which of everything found is the root: crashes (service restarts), occurrences and their
signatures, cascades (consequences of another failure), the scoring of `Type: message`
lines, and the choice among categories (`Ranking`, a part of `Analyser`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rewheel.diagnose.limits import MAX_EPOCH_OCCURRENCES, MAX_PROCS_PER_SIG, MAX_SECONDARY, MAX_SIGNATURES
from rewheel.diagnose.results import Frame, Secondary, first_line

CASCADE_TYPES = {
    "SystemExit", "KeyboardInterrupt", "EOFError", "BrokenPipeError", "ConnectionResetError",
    "ConnectionAbortedError", "CancelledError", "asyncio.CancelledError",
    "asyncio.exceptions.CancelledError", "concurrent.futures._base.CancelledError",
    "EngineDeadError", "EngineGenerateError", "AsyncEngineDeadError",
    # torchrun's summary of a child that failed: the child's own error is the cause
    "ChildFailedError",
}
CASCADE_MESSAGE_RE = re.compile(
    r"WorkerProc initialization failed|Engine core initialization failed|See root cause above"
    r"|See stack trace for root cause|stack trace above for the (?:root|actual) cause"
    r"|See stack trace \(above\) for the root cause|EngineCore encountered (?:an issue|a fatal error)"
    r"|^Executor failed\.?$|Background loop has errored already|Task finished unexpectedly"
    r"|died unexpectedly|WorkerProc was terminated|Engine process failed to start"
    r"|Context was terminated|Socket operation on non-socket"
    # lmdeploy's main process after a rank's failure ("rank[0] failed with error: ..." before it)
    r"|^Rank\[\d+\] failed\.?$", re.I)
LOOKUP_TYPES = {"KeyError", "StopIteration", "IndexError"}
# a launcher's report that its child failed (torchrun, accelerate's simple launcher)
LAUNCHER_TYPES = {"ChildFailedError", "CalledProcessError"}
EXC_LINE_RE = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault)): (?P<msg>.+)")


@dataclass
class Occ:
    kind: str                         # "traceback" | "error-line"
    category: int                     # lower is better, see _CATEGORY_*
    type: str | None
    message: str
    sig: tuple
    rank: str | None
    pos: int
    frame: Frame | None
    chained: list[tuple[str | None, str, int]]  # other chain members: (type, message, pos)
    cascade: bool
    pid: int | None = None
    node: str | None = None
    frames: list[Frame] = field(default_factory=list)
    score: int = 0                    # error lines: how clean a `Type: message` line it is
    span: tuple[int, int] = (0, 0)    # tracebacks: the ticks it was read between
    rank_source: str | None = None    # what named `rank` (see processes.RankSource)
    tracebacks: int = 0               # tracebacks closed when it was found (see processes)
    merged: bool = False              # several processes' tracebacks read as one: names none of them


# Categories, in order of preference for the root.
# A clean `Type: message` line (no traceback) beats a keyword found in prose.
TB_ERROR, LINE_EXC, LINE_STRONG, TB_WARN, TB_CASCADE, LINE_ERROR, LINE_CASCADE = range(7)


def norm_sig(type_: str | None, message: str) -> tuple:
    text = first_line(message, 400)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x", text)
    text = re.sub(r"\d+(?:\.\d+)?", "N", text)
    return (type_ or "", text)


GARBLE_RE = re.compile(r"(?:Error|Exception).*(?:Error|Exception)")


def exc_line_score(type_: str, message: str, *, at_start: bool = True) -> int:
    """How much a `Type: message` line looks like what the failing code raised, in its words
    (higher is better). Writers interleaved into one line, a type in the middle of prose, a
    bare `Exception`, an empty message all lower it."""
    base = type_.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    score = 4 if at_start else 0
    if re.fullmatch(r"[A-Z][A-Za-z0-9_]*", base) and not GARBLE_RE.search(base):
        score += 2
    if base and (base in message[:300] or EXC_LINE_RE.search(message[:300])):
        score -= 3        # another exception's text run into this one
    if base in ("Exception", "Error", "BaseException"):
        score -= 1
    if not message.strip():
        score -= 1
    return score


def is_cascade(type_: str | None, message: str) -> bool:
    if type_:
        if type_ in CASCADE_TYPES or type_.rsplit(".", 1)[-1] in CASCADE_TYPES:
            return True
    return bool(CASCADE_MESSAGE_RE.search((message or "")[:2000]))


class Ranking:
    """`Analyser`'s part that keeps what was found, by crash, and chooses the root."""

    # (state set up by Analyser.__init__)
    epoch: int
    _epochs_seen: int
    epoch_of_jpid: dict[int, int]
    epoch_labels: dict[str, int | None]
    epoch_terminal: bool
    epoch_unlabeled_died: bool
    cur_list: list[Occ]
    first: dict[int, tuple[int, list[Occ]]]
    lists: dict[int, list[Occ]]
    sig_procs: dict[tuple, set]
    sig_epochs: dict[tuple, set]
    tracebacks: int

    def _epoch_for(self, jpid: int | None, ident: str | None, label: str | None,
                   pid: int | None, terminal: bool) -> int:
        if ident == "systemd" or (jpid == 1):
            return max(self.epoch, 0) if self.epoch >= 0 else self._new_epoch()
        if jpid is not None:
            e = self.epoch_of_jpid.get(jpid)
            if e is None:
                e = self._new_epoch()
                if len(self.epoch_of_jpid) < 100000:
                    self.epoch_of_jpid[jpid] = e
            elif e != self.epoch:
                self._switch(e)
            return e
        if self.epoch < 0:
            self._new_epoch()
        if terminal and label is None and self.epoch_unlabeled_died:
            # Without journald or process prefixes, a main process dies once per start:
            # a second uncaught traceback at top level is the next start's.
            self._new_epoch()
        if label is not None:
            known = self.epoch_labels.get(label, pid)
            if known != pid and self.epoch_terminal:
                self._new_epoch()
            self.epoch_labels[label] = pid
        if terminal:
            self.epoch_terminal = True
            if label is None:
                self.epoch_unlabeled_died = True
        return self.epoch

    def _new_epoch(self) -> int:
        self._epochs_seen += 1
        self.epoch = self._epochs_seen
        self.epoch_labels = {}
        self.epoch_terminal = False
        self.epoch_unlabeled_died = False
        self.cur_list = []
        self.lists = {k: v for k, v in self.lists.items()
                      if any(v is lst for _, lst in self.first.values())}
        self.lists[self.epoch] = self.cur_list
        return self.epoch

    def _switch(self, epoch: int) -> None:
        # Back to an earlier crash's pid (rare: overlapping shutdown): keep its list if kept.
        self.epoch = epoch
        self.cur_list = self.lists.setdefault(epoch, [])

    def _register(self, occ: Occ, jpid: int | None, ident: str | None, label: str | None,
                  pid: int | None) -> None:
        # (a launcher's own traceback about its child is the same crash, never the next start's)
        terminal = occ.kind == "traceback" and (occ.type or "").rsplit(".", 1)[-1] not in LAUNCHER_TYPES and (
            label is None or label == "APIServer" or label.startswith("EngineCore"))
        epoch = self._epoch_for(jpid, ident, label, pid, terminal)
        occ.tracebacks = self.tracebacks
        proc_key = (epoch, jpid, label, pid)
        procs = self.sig_procs.get(occ.sig)
        if procs is None:
            if len(self.sig_procs) >= MAX_SIGNATURES:
                return
            procs = self.sig_procs[occ.sig] = set()
            self.sig_epochs[occ.sig] = set()
        if proc_key in procs:
            return  # the same exception printed twice by one process (logger + multiprocessing)
        if len(procs) < MAX_PROCS_PER_SIG:
            procs.add(proc_key)
        epochs = self.sig_epochs[occ.sig]
        if len(epochs) < MAX_PROCS_PER_SIG:
            epochs.add(epoch)
        lst = self.lists.setdefault(epoch, self.cur_list if epoch == self.epoch else [])
        if len(lst) < MAX_EPOCH_OCCURRENCES:
            lst.append(occ)
        if occ.category not in self.first:
            self.first[occ.category] = (epoch, lst)

    def _choose(self) -> tuple[Occ, list[Occ]] | None:
        for category in (TB_ERROR, LINE_EXC, LINE_STRONG, TB_WARN, TB_CASCADE, LINE_ERROR, LINE_CASCADE):
            if category in self.first:
                _, lst = self.first[category]
                cands = [o for o in lst if o.category == category]
                if category == TB_ERROR:
                    # a traceback whose exception line was lost (garbled by another writer
                    # printing at the same time) names no type: one printed alongside it does
                    typed = [o for o in cands if o.type]
                    cands = [o for o in cands if o.type or not any(
                        t.span[0] <= o.span[1] and o.span[0] <= t.span[1] for t in typed)]
                elif category == LINE_EXC:
                    # the best-scored `Type: message` line, not the first one
                    best = max(o.score for o in cands)
                    cands = [o for o in cands if o.score == best]
                if not cands:
                    continue
                occ = min(cands, key=lambda o: o.pos)
                if occ.type is None and category == TB_ERROR and LINE_EXC in self.first:
                    # The floor: no traceback says what was raised (cut off, or not understood);
                    # the best `Type: message` line does, and the traceback's frames go with it
                    # when it names the same process.
                    line_occ, line_lst = self._choose_in(LINE_EXC)
                    if line_occ.rank in (None, occ.rank) and line_occ.frame is None:
                        line_occ.frame, line_occ.frames = occ.frame, occ.frames
                        line_occ.rank, line_occ.pid = occ.rank, occ.pid if line_occ.pid is None else line_occ.pid
                    return line_occ, line_lst
                return occ, lst
        return None

    def _choose_in(self, category: int) -> tuple[Occ, list[Occ]]:
        _, lst = self.first[category]
        cands = [o for o in lst if o.category == category]
        best = max(o.score for o in cands)
        return min((o for o in cands if o.score == best), key=lambda o: o.pos), lst

    def _secondaries(self, root: Occ, epoch_list: list[Occ], mapping: dict[int, int]) -> list[Secondary]:
        out: list[Secondary] = []
        seen: set[tuple] = {root.sig}
        for type_, message, pos in root.chained:
            out.append(Secondary(type_, message, root.rank, mapping.get(pos), 1, "chained"))
        only_tracebacks = root.kind == "traceback"
        for o in sorted(epoch_list, key=lambda o: o.pos):
            if o.sig in seen or (only_tracebacks and o.kind != "traceback"):
                continue
            if o.type is None and o.frame is not None and o.frame is root.frame:
                continue    # the traceback whose frames the root took (its exception line was cut off)
            if o.category in (TB_WARN,) and o.pos < root.pos:
                continue
            seen.add(o.sig)
            relation = "cascade" if o.cascade else ("later" if o.pos >= root.pos else "earlier")
            out.append(Secondary(o.type, o.message, o.rank, mapping.get(o.pos),
                                 max(1, len(self.sig_procs.get(o.sig, ()))), relation))
            if len(out) >= MAX_SECONDARY:
                break
        return out
