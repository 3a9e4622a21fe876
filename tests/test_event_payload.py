"""The payload parser (orjson first, the stdlib behind it) decides every event as the stdlib did."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.event_payload import Refused, decode_payload

LIMIT = 1 << 20


def stdlib_only(value: bytes) -> Any:
    """The parser before orjson: its value, or the reason it refused."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "bad_encoding"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return "bad_json"
    return obj if isinstance(obj, dict) else "not_an_object"


def fate(value: bytes) -> Any:
    try:
        return decode_payload(value, LIMIT)
    except Refused as exc:
        return exc.reason


TRICKY = [
    b'{"ts": 1767225600000, "user_id": "\\u00e9", "features": {"site": "caf\xc3\xa9"}}',
    b'{"ts": 100000000000000000000000000000}',  # past 64 bits: orjson reads a float
    b'{"ts": -9223372036854775809}',
    b'{"ts": 18446744073709551615}',
    b'{"ts": 1.5}',
    b'{"features": {"site": "\\ud800"}}',  # a lone surrogate: orjson refuses it
    b'{"dense": {"x": NaN}}',
    b'{"dense": {"x": 1e400}}',
    b'{"dense": {"x": -0.0, "y": 1e-400}}',
    b'\xef\xbb\xbf{"ts": 1}',  # a byte-order mark
    b'{"ts": 1, "ts": 2}',  # duplicate keys: the last one
    b'{"ts": "\xff"}',  # not UTF-8
    b'{"ts": 1} x',
    b"[1]",
    b"null",
    b"",
    b" \n{} \t",
    b"[" * 30_000 + b"]" * 30_000,
]


@pytest.mark.parametrize("value", TRICKY)
def test_tricky_payloads_meet_the_fate_the_stdlib_gave_them(value: bytes) -> None:
    got, want = fate(value), stdlib_only(value)
    assert got == want or (got != got and want != want)  # NaN never equals itself
    assert type(got) is type(want)
    if isinstance(got, dict) and isinstance(got.get("ts"), int | float):
        assert type(got["ts"]) is type(want["ts"])  # an integer stays one


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def as_numbers(value: Any) -> Any:
    """``value`` with its integers past 64 bits as floats: how orjson reads them outside ``ts``."""
    if isinstance(value, dict):
        return {k: as_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_numbers(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return float(value)
    return value


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["ts", "user_id", "dense", "x"]), _json, max_size=4))
def test_any_json_object_decodes_to_the_stdlibs_value(obj: dict[str, Any]) -> None:
    """The same value, except that an integer past 64 bits outside ``ts`` is a float (validation
    only takes numbers as floats there: dense values, a conversion's value, a score)."""
    value = json.dumps(obj).encode()
    want = stdlib_only(value)
    if not isinstance(want.get("ts"), float):
        want = {k: v if k == "ts" else as_numbers(v) for k, v in want.items()}
    assert fate(value) == want


def test_numbers_past_64_bits_validate_as_the_stdlib_read_them() -> None:
    from pipeline.core.config import ValidationConfig
    from pipeline.core.types import ManualClock
    from pipeline.core.validation import Validator

    v = Validator(ValidationConfig(), clock=ManualClock(1_767_225_600_000))
    event = {"impression_id": "i1", "ts": 1_767_225_599_000, "user_id": "a", "item_id": "b"}
    event["dense"] = {"big": 10**29, "u64": 2**64, "neg": -(10**25)}
    assert v.impression(json.dumps(event).encode()) == v.impression(json.loads(json.dumps(event)))
    click = {"conversion_id": "c1", "impression_id": "i1", "ts": 1_767_225_599_000, "user_id": "a"}
    for value in (10**29, 2**64):
        raw = json.dumps(click | {"value": value})
        assert v.conversion(raw.encode()) == v.conversion(json.loads(raw))


def test_too_large_and_not_bytes_are_refused_before_parsing() -> None:
    with pytest.raises(Refused, match="limit 4"):
        decode_payload(b'{"a": 1}', 4)
    with pytest.raises(Refused, match="expected bytes") as exc:
        decode_payload("{}", LIMIT)
    assert exc.value.reason == "bad_type"
