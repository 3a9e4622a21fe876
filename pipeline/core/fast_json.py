"""JSON of the hot paths (labelled examples, the joiner's state records) by orjson, the stdlib behind it.

The joiner encodes every example it emits and the trainer decodes every example it reads: with the
stdlib ``json`` an example cost ~10 us to encode and ~8 us to decode here, a fifth of the joiner's
whole per-event budget; orjson (maintained, Rust) does each in ~1 us. Its output is compact JSON,
keys sorted when asked, UTF-8 as is (the stdlib escapes non-ASCII as ``\\uXXXX``; both read the same).

orjson is stricter than the stdlib on two things validation lets through, so each call falls back
to the stdlib for exactly those (never silently different data):

- a string holding a lone surrogate (JSON ``"\\ud800"`` in an impression's feature value): orjson
  refuses to encode or decode it, the stdlib writes and reads the escape;
- an integer beyond 64 bits: orjson refuses to encode it. None reaches an example (validation
  bounds timestamps; dense values are floats, counts small); orjson would read one back as a float.

orjson writes a NaN or an infinity as ``null``: validation refuses non-finite inputs, and the stream
features are finite by construction, so none is written here.

Either path gives the same value back from :func:`loads`; for a given value the path is fixed, so
encoding stays deterministic (replays re-send byte-identical examples).

>>> dumps({"b": 1, "a": [0.5, "\\u00e9"]}, sort_keys=True)
b'{"a":[0.5,"\\xc3\\xa9"],"b":1}'
>>> loads(dumps({"v": "\\ud800"})) == {"v": "\\ud800"}  # the stdlib's path, both ways
True
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]

_SORTED = orjson.OPT_SORT_KEYS
# the stdlib fallbacks, built once (json.dumps with options builds an encoder per call)
_COMPACT = json.JSONEncoder(separators=(",", ":"))
_COMPACT_SORTED = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON of ``value`` (dicts, lists, str, int, float, bool, None) as UTF-8 bytes."""
    try:
        return orjson.dumps(value, option=_SORTED if sort_keys else 0)
    except TypeError:  # a lone surrogate, an integer past 64 bits, a key that is not a str
        return (_COMPACT_SORTED if sort_keys else _COMPACT).encode(value).encode()


def loads(data: bytes | str) -> Any:
    """The value of one JSON document; raises ``ValueError`` (``json.JSONDecodeError``) if invalid."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # the stdlib reads what it wrote, or gives its own error
        return json.loads(data)
