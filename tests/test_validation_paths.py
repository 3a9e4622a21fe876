"""Validation's two paths give one verdict: what msgspec's path accepts, the descriptive path accepts
with the same result; everything else is decided by the descriptive path alone."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config import Config, ValidationConfig
from pipeline.core.events import Click, DeadLetter, Impression
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from pipeline.sources.simulator import Simulator

NOW = 1_767_225_600_000
KEYS = ["site", "slot", "device_id", "ip", "bad key", "x" * 70]  # device_id and ip: PII by default


def validator() -> Validator:
    """Features of at most 3 entries and 8 chars; the usual keys known already (valid events carried
    them), so that valid events take the fast path."""
    v = Validator(ValidationConfig(max_features=3, max_value_chars=8), clock=ManualClock(NOW))
    for features in ({"site": "s", "slot": "1", "device_id": "d"}, {"ip": "1"}):
        primer = {"impression_id": "i0", "ts": NOW, "user_id": "u", "item_id": "a", "features": features}
        assert isinstance(v.impression(json.dumps(primer).encode()), Impression)
    return v


_ids = st.sampled_from(["i1", "user-7", "a:b.c_d", "", "has space", "é", "x" * 129, "x" * 128])
_numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**64, 0, 1, True, False]),
    st.floats(allow_nan=False, allow_infinity=False),
)
_ts = st.one_of(
    st.integers(min_value=NOW - 10**9, max_value=NOW + 10**9),
    st.sampled_from([NOW, 946_684_799_999, 10**30, 1.5, float(NOW), "soon", True, None]),
)
_values = st.one_of(st.sampled_from(["ok", "12345678", "123456789", ""]), _numbers, st.none())
_fields = {
    "impression_id": _ids,
    "click_id": _ids,
    "ts": _ts,
    "user_id": _ids | _numbers,
    "item_id": _ids,
    "features": st.dictionaries(st.sampled_from(KEYS), _values, max_size=4) | st.sampled_from([[], "x"]),
    "dense": st.dictionaries(st.sampled_from(KEYS), _numbers | _values, max_size=4),
    "model_version": st.sampled_from([None, "v1", "v" * 65, 3]),
    "score": st.one_of(st.none(), _numbers, st.sampled_from([0.0, 1.0, 0.5, 1.0000001, "0.5"])),
    "other": st.just(1),
}


_near = {
    "impression_id": st.sampled_from(["i1", "a:b.c_d", "x" * 128]),
    "ts": st.integers(min_value=NOW - 10**6, max_value=NOW + 10**6),
    "features": st.dictionaries(
        st.sampled_from(KEYS[:4]), st.sampled_from(["ok", "12345678", "", "123456789"]), max_size=3
    ),
    "dense": st.dictionaries(
        st.sampled_from(KEYS[:4]), st.integers(-(10**6), 10**6) | st.floats(-1e300, 1e300), max_size=3
    ),
    "model_version": st.sampled_from([None, "v1", "v" * 64, "v" * 65]),
    "score": st.sampled_from([None, 0, 1, 0.25, 1.0000001, -0.0]),
}
_near["click_id"] = _near["user_id"] = _near["item_id"] = _near["impression_id"]


@st.composite
def events(draw: Any, kind: str) -> dict[str, Any]:
    """Fields mostly valid or just past a limit (so that both paths accept some events), each
    sometimes wild or absent."""
    common = ["impression_id", "ts", "user_id"]
    usual = common + (["item_id", "features", "dense"] if kind == "impression" else ["click_id"])
    rare = ["model_version", "score", "other", "click_id" if kind == "impression" else "item_id"]
    out = {}
    for name in usual:
        roll = draw(st.integers(0, 29))
        if roll:  # mostly present, mostly valid
            out[name] = draw(_near[name] if roll > 3 and name in _near else _fields[name])
    for name in rare:
        if not draw(st.integers(0, 6)):
            out[name] = draw(_near[name] if name in _near and draw(st.booleans()) else _fields[name])
    return out


def fates(v: Validator, kind: str, value: bytes) -> tuple[Any, Any]:
    raw = RawEvent(kind, value, "t", 0, 1)
    return v._fast(kind, value, NOW, 0), v._descriptive(raw, NOW)


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(["impression", "click"]).flatmap(lambda k: st.tuples(st.just(k), events(k))))
def test_what_the_fast_path_accepts_the_descriptive_one_accepts_the_same(case: Any) -> None:
    kind, event = case
    v = validator()
    value = json.dumps(event).encode()
    fast, slow = fates(v, kind, value)
    if fast is not None:
        assert not isinstance(slow, DeadLetter), (event, slow)
        assert fast == slow
        assert type(fast.ts) is int and all(type(x) is float for x in getattr(fast, "dense", {}).values())
    assert v.validate(RawEvent(kind, value, "t", 0, 1, entered_ms=NOW)) == (fast if fast else slow)


def test_near_events_take_the_fast_path_and_equal_the_descriptive_result() -> None:
    """Not vacuous: every simulated event after the first of its shape is accepted by msgspec's path."""
    v = Validator(Config().validation, clock=ManualClock(0))
    taken = 0
    for kind, event in Simulator(Config().simulator, 3).stream(2_000):
        value = json.dumps(event).encode()
        v.validate(RawEvent(kind, value, "t", 0, 1))  # learns the feature keys
        fast, slow = v._fast(kind, value, 0, 0), v._descriptive(RawEvent(kind, value, "t", 0, 1), 0)
        assert fast is not None and fast == slow and isinstance(fast, Impression | Click)
        taken += 1
    assert taken > 2_000


def test_pii_features_are_pseudonymized_on_the_fast_path_too() -> None:
    v = validator()
    event = {"impression_id": "i1", "ts": NOW, "user_id": "alice", "item_id": "a"}
    event["features"] = {"device_id": "dev-1", "site": "s"}
    value = json.dumps(event).encode()
    fast, slow = fates(v, "impression", value)
    assert fast is not None and fast == slow
    assert fast.features["device_id"].startswith("d_") and fast.user_id.startswith("u_")
    assert "dev-1" not in repr(fast) and "alice" not in repr(fast)


def test_integers_too_large_for_a_float_are_dead_letters_not_crashes() -> None:
    v = validator()
    event: dict[str, Any] = {"impression_id": "i1", "ts": NOW, "user_id": "a", "item_id": "b"}
    for bad in ({"dense": {"site": 10**400}}, {"score": 10**400}):
        for value in (json.dumps(event | bad).encode(), event | bad):
            out = v.impression(value)
            assert isinstance(out, DeadLetter) and out.reason in {"bad_value", "bad_type"}
    conversion = {"conversion_id": "c1", "impression_id": "i1", "ts": NOW, "user_id": "a", "value": 10**400}
    out = v.conversion(json.dumps(conversion).encode())
    assert isinstance(out, DeadLetter) and out.reason == "bad_value"


VALID_IMPRESSION = {
    "impression_id": "i1",
    "ts": NOW,
    "user_id": "u1",
    "item_id": "a",
    "features": {"site": "s"},
}
ONE_FIELD_OFF = [
    ("impression_id", "x" * 129),
    ("user_id", "has space"),
    ("item_id", ""),
    ("ts", 946_684_799_999),
    ("ts", 10**30),
    ("ts", float(NOW)),
    ("features", {"site": "123456789"}),
    ("features", {"site": "s", "slot": "1", "ip": "1", "device_id": "d"}),
    ("features", {"new_key": "s"}),
    ("features", {"bad key": "s"}),
    ("dense", {"site": True}),
    ("dense", {"site": 1e300, "slot": 1, "ip": 2, "device_id": 3.5}),
    ("dense", {"site": 10**400}),
    ("model_version", "v" * 65),
    ("model_version", 7),
    ("score", 1.0000001),
    ("score", -1e-9),
    ("score", True),
    ("other", 1),
]


def test_events_one_field_off_get_the_descriptive_verdict() -> None:
    v = validator()
    fast, slow = fates(v, "impression", json.dumps(VALID_IMPRESSION).encode())
    assert fast is not None and fast == slow
    for name, value in ONE_FIELD_OFF:
        fast, slow = fates(v, "impression", json.dumps(VALID_IMPRESSION | {name: value}).encode())
        assert fast is None or fast == slow, (name, value, fast, slow)
        assert fast is None, (name, value)  # each is refused, or new: the descriptive path's to say
