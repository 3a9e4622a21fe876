"""Structured logs: one JSON object per line on stderr (journald stores each line as one entry).

``daemon.log_format = "json"`` (``CTR_DAEMON_LOG_FORMAT=json``, set in ctr.env) switches the daemons
to it. Every record carries the daemon's context -- its name, the model version, the offsets of
its last checkpoint -- which the daemons update with :func:`set_context`.

>>> import logging
>>> set_context(daemon="trainer", version="7")
>>> rec = logging.LogRecord("t", logging.INFO, __file__, 1, "block %d", (3,), None)
>>> sorted(json.loads(JsonFormatter().format(rec)))
['daemon', 'level', 'logger', 'msg', 'ts', 'version']
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "JsonFormatter",
    "LogSetup",
    "dump_stacks_on_sigusr1",
    "restore",
    "set_context",
    "snapshot",
    "use_json_logs",
]

_context: dict[str, Any] = {}
_lock = threading.Lock()


def set_context(**values: Any) -> None:
    """Fields added to every later record (None removes one)."""
    with _lock:
        for k, v in values.items():
            if v is None:
                _context.pop(k, None)
            else:
                _context[k] = v


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        with _lock:
            context = dict(_context)
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **context,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def use_json_logs(level: int) -> None:
    """Replace the root handlers with one JSON-lines handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kafka-python logs every connection step at INFO: journald would drown in it
    logging.getLogger("kafka").setLevel(max(level, logging.WARNING))


LogSetup = tuple[int, str | None, bool]  # level, format string, JSON lines


def snapshot() -> LogSetup:
    """The root logger's level and its first handler's format, for :func:`restore` in a process
    started with ``multiprocessing``'s spawn (which starts with logging unconfigured)."""
    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    fmt = getattr(formatter, "_fmt", None)
    return root.level, fmt if isinstance(fmt, str) else None, isinstance(formatter, JsonFormatter)


def restore(setup: LogSetup) -> None:
    """Log as the process that took ``setup`` did: same level, same format, on stderr."""
    level, fmt, json_lines = setup
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` then writes every thread's stack to stderr (the daemon's log, the journal
    under systemd): what a process that stopped making progress is waiting on, without stopping it."""
    err = sys.__stderr__  # the process's own stderr: sys.stderr may be a capture without a file
    if err is not None:
        faulthandler.register(signal.SIGUSR1, file=err, all_threads=True)
