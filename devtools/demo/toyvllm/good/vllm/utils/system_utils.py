import os
import sys
import threading
import time


def _add_prefix(file, prefix):
    """Prefix every line written to `file` (vLLM's `(Worker_TP4 pid=…) `). A forked child
    replaces its parent's prefix rather than adding to it."""
    file_write = getattr(file, "_undecorated_write", None) or file.write
    file._undecorated_write = file_write
    state = {"start": True}

    def write_with_prefix(s):
        # One write per call, prefix included: processes share the descriptor, and a
        # prefix written apart from its line could land in front of another process's.
        if not s:
            return
        out = []
        for piece in s.splitlines(keepends=True):
            if state["start"]:
                out.append(prefix)
            out.append(piece)
            state["start"] = piece.endswith("\n")
        file_write("".join(out))
        if state["start"]:
            file.flush()

    file.write = write_with_prefix


def decorate_logs(process_name):
    prefix = f"({process_name} pid={os.getpid()}) "
    _add_prefix(sys.stdout, prefix)
    _add_prefix(sys.stderr, prefix)


def exit_with_parent():
    """Child processes go when their parent goes, however it went."""
    parent = os.getppid()

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.2)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
