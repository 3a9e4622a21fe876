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

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any

__all__ = ["JsonFormatter", "set_context", "use_json_logs"]

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
