"""An event's payload bytes -> its JSON object, or :class:`Refused` with the dead-letter reason.

Payloads are parsed by orjson (~1 us an event here against the stdlib's ~3.5 us). Whatever orjson
refuses (bad UTF-8, a lone surrogate, NaN, 1e400, a byte-order mark, nesting past 1,024 levels) and
a ``ts`` it read as a float (it reads an integer past 64 bits so) go through the stdlib, whose
reading and error messages decide the event's fate as they always did: a ``ts`` of 10**30 stays an
integer, refused as ``ts_in_future`` by :mod:`pipeline.core.validation`, not as ``bad_type``.
Elsewhere such an integer comes back as the float validation would make of it anyway (a dense
value, a conversion's value, a score); every other field refuses a number whatever its size.

>>> decode_payload(b'{"ts": 1}', 100)
{'ts': 1}
>>> decode_payload(b'{"ts": 100000000000000000000000000000}', 100)["ts"] == 10**29
True
>>> decode_payload(b"[1]", 100)
Traceback (most recent call last):
...
pipeline.core.event_payload.Refused: JSON list, expected an object
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["Refused", "decode_payload"]


class Refused(Exception):
    """An event refused: ``reason`` (a dead letter's reason) and ``detail`` (what to fix)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def decode_payload(value: object, max_bytes: int) -> dict[str, Any]:
    """The JSON object of ``value`` (bytes of at most ``max_bytes``); :class:`Refused` otherwise."""
    if not isinstance(value, bytes | bytearray):
        raise Refused("bad_type", f"event payload is {type(value).__name__}, expected bytes")
    if len(value) > max_bytes:
        raise Refused("too_large", f"event is {len(value)} bytes, limit {max_bytes}")
    try:
        fast = orjson.loads(value)
    except orjson.JSONDecodeError:
        fast = None
    if isinstance(fast, dict) and not isinstance(fast.get("ts"), float):
        return fast
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused("bad_encoding", f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Refused("bad_json", f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise Refused("not_an_object", f"JSON {type(obj).__name__}, expected an object")
    return obj
