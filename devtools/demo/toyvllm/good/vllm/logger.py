"""Logging like vLLM's: `LEVEL MM-DD HH:MM:SS [file.py:NN] message`, on stdout, one
header per line (a traceback is logged one record line per line)."""

import logging
import sys

_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


class NewLineFormatter(logging.Formatter):
    """Adds the record's header to every line of a multi-line message."""

    def format(self, record):
        msg = super().format(record)
        if record.message != "":
            header = msg.split(record.message)[0]
            msg = msg.replace("\n", "\n" + header)
        return msg


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is now (worker processes decorate theirs)."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


_root = logging.getLogger("vllm")
if not _root.handlers:
    _handler = _StdoutHandler()
    _handler.setFormatter(NewLineFormatter(_FORMAT, datefmt=_DATE_FORMAT))
    _root.addHandler(_handler)
    _root.setLevel(logging.INFO)
    _root.propagate = False


def init_logger(name):
    return logging.getLogger(name)
