"""Validation: every rejection has a reason, nothing raises, identifiers are pseudonymized."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config import ValidationConfig
from pipeline.core.events import REASONS, Click, Conversion, DeadLetter, Impression, LabelledExample
from pipeline.core.pseudonyms import Pseudonymizer
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator

NOW = 1_767_225_600_000
GOOD_IMP = {
    "impression_id": "i-1",
    "ts": NOW - 1_000,
    "user_id": "alice",
    "item_id": "ad:7",
    "features": {"site": "news", "device_ip": "10.0.0.1"},
    "dense": {"bid": 0.5},
}
GOOD_CLICK = {"click_id": "c-1", "impression_id": "i-1", "ts": NOW, "user_id": "alice"}


@pytest.fixture
def v() -> Validator:
    return Validator(ValidationConfig(), clock=ManualClock(NOW))


def test_valid_events_decode_from_dicts_and_bytes(v: Validator) -> None:
    a = v.impression(GOOD_IMP)
    b = v.impression(json.dumps(GOOD_IMP).encode())
    assert isinstance(a, Impression) and a == b
    assert a.dense == {"bid": 0.5} and a.features["site"] == "news"
    c = v.click(GOOD_CLICK)
    assert isinstance(c, Click) and c.user_id == a.user_id  # same pseudonym: the join still works


def test_personal_identifiers_are_pseudonymized(v: Validator) -> None:
    a = v.impression(GOOD_IMP)
    assert isinstance(a, Impression)
    assert "alice" not in a.user_id and a.user_id.startswith("u_")
    assert a.features["device_ip"].startswith("d_") and "10.0.0.1" not in json.dumps(a.to_dict())
    other = Validator(ValidationConfig(pseudonym_key="another key"), clock=ManualClock(NOW))
    b = other.impression(GOOD_IMP)
    assert isinstance(b, Impression) and b.user_id != a.user_id


def test_pseudonymizer_refuses_an_empty_key() -> None:
    with pytest.raises(ValueError, match="CTR_VALIDATION_PSEUDONYM_KEY"):
        Pseudonymizer("")


BAD = [
    (b"\xff\xfe", "bad_encoding"),
    (b"{not json", "bad_json"),
    (b"[1, 2]", "not_an_object"),
    (b"x" * 70_000, "too_large"),
    ({**GOOD_IMP, "extra": 1}, "unknown_field"),
    ({k: v for k, v in GOOD_IMP.items() if k != "user_id"}, "missing_field"),
    ({**GOOD_IMP, "ts": "yesterday"}, "bad_type"),
    ({**GOOD_IMP, "ts": True}, "bad_type"),
    ({**GOOD_IMP, "ts": 12}, "ts_too_old"),
    ({**GOOD_IMP, "ts": NOW - 30 * 86_400_000}, "ts_too_old"),
    ({**GOOD_IMP, "ts": NOW + 3_600_000}, "ts_in_future"),
    ({**GOOD_IMP, "impression_id": ""}, "bad_id"),
    ({**GOOD_IMP, "impression_id": "a b"}, "bad_id"),
    ({**GOOD_IMP, "user_id": "x" * 200}, "bad_id"),
    ({**GOOD_IMP, "item_id": 7}, "bad_type"),
    ({**GOOD_IMP, "features": {"site": 3}}, "bad_type"),
    ({**GOOD_IMP, "features": {"bad key": "x"}}, "bad_value"),
    ({**GOOD_IMP, "features": {"site": "v" * 300}}, "bad_value"),
    ({**GOOD_IMP, "features": {f"k{i}": "v" for i in range(65)}}, "bad_value"),
    ({**GOOD_IMP, "features": []}, "bad_type"),
    ({**GOOD_IMP, "dense": {"bid": "high"}}, "bad_type"),
    ({**GOOD_IMP, "model_version": 3}, "bad_type"),
    ({**GOOD_IMP, "score": 1.5}, "bad_type"),
    ({**GOOD_IMP, "score": -0.01}, "bad_type"),
    ({**GOOD_IMP, "score": "0.3"}, "bad_type"),
    ({**GOOD_IMP, "score": True}, "bad_type"),
    (
        b'{"impression_id": "i-1", "ts": 1767225599000, "user_id": "a", "item_id": "b", "score": NaN}',
        "bad_type",
    ),
]


@pytest.mark.parametrize(("value", "reason"), BAD)
def test_bad_impressions_become_dead_letters_with_a_reason(v: Validator, value: object, reason: str) -> None:
    raw = RawEvent("impression", value if isinstance(value, bytes) else json.dumps(value).encode(), "t", 2, 9)
    out = v.validate(raw)
    assert isinstance(out, DeadLetter), out
    assert out.reason == reason and out.reason in REASONS
    assert (out.source, out.partition, out.offset) == ("t", 2, 9)
    assert len(out.raw) <= 1_024 and out.detail
    assert v.rejected == {reason: 1}


def test_non_finite_dense_value_from_a_mapping_is_rejected(v: Validator) -> None:
    out = v.impression({**GOOD_IMP, "dense": {"bid": float("nan")}})
    assert isinstance(out, DeadLetter) and out.reason == "bad_value"


def test_bad_click_is_rejected(v: Validator) -> None:
    out = v.click({**GOOD_CLICK, "click_id": None})
    assert isinstance(out, DeadLetter) and out.reason == "bad_type" and out.kind == "click"


GOOD_CONVERSION = {
    "conversion_id": "v-1",
    "impression_id": "i-1",
    "ts": NOW,
    "user_id": "alice",
    "value": 12.5,
}


def test_conversions_validate_with_an_optional_value(v: Validator) -> None:
    out = v.conversion(GOOD_CONVERSION)
    assert isinstance(out, Conversion) and out.value == 12.5 and out.user_id.startswith("u_")
    bare = v.conversion(json.dumps({k: x for k, x in GOOD_CONVERSION.items() if k != "value"}).encode())
    assert isinstance(bare, Conversion) and bare.value is None and "value" not in bare.to_dict()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"value": -1}, "bad_value"),
        ({"value": float("inf")}, "bad_value"),
        ({"value": "12"}, "bad_type"),
        ({"value": True}, "bad_type"),
        ({"conversion_id": ""}, "bad_id"),
        ({"impression_id": None}, "bad_type"),
        ({"click": 1}, "unknown_field"),
    ],
)
def test_bad_conversions_are_dead_letters(v: Validator, change: dict, reason: str) -> None:
    out = v.conversion({**GOOD_CONVERSION, **change})
    assert isinstance(out, DeadLetter) and (out.reason, out.kind) == (reason, "conversion")
    missing = v.conversion({k: x for k, x in GOOD_CONVERSION.items() if k != "impression_id"})
    assert isinstance(missing, DeadLetter) and missing.reason == "missing_field"


def test_corrections_round_trip_with_their_own_example_id(v: Validator) -> None:
    a = v.impression(GOOD_IMP)
    assert isinstance(a, Impression)
    first, fix = LabelledExample(a, 1, NOW, {}, None), LabelledExample(a, 1, NOW + 5, {}, 1, True, 30.0)
    assert (first.example_id, fix.example_id) == ("i-1", "i-1#cv")
    assert [LabelledExample.from_json(e.to_json()) for e in (first, fix)] == [first, fix]
    assert b"conversion" not in first.to_json()  # examples without conversions read as before


def test_deep_nesting_is_a_dead_letter_not_a_crash(v: Validator) -> None:
    out = v.validate(RawEvent("click", b"[" * 50_000 + b"]" * 50_000, "t"))
    assert isinstance(out, DeadLetter) and out.reason in ("bad_json", "too_large")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    v = Validator(ValidationConfig(), clock=ManualClock(NOW))
    out = v.validate(RawEvent("impression", data, "fuzz"))
    assert isinstance(out, Impression | DeadLetter)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*GOOD_IMP, "other"]), json_values, max_size=8))
def test_arbitrary_objects_are_valid_or_dead_letters_with_known_reasons(obj: dict[str, object]) -> None:
    v = Validator(ValidationConfig(), clock=ManualClock(NOW))
    out = v.validate(RawEvent("impression", json.dumps(obj).encode(), "fuzz"))
    assert isinstance(out, Impression) or out.reason in REASONS


def test_labelled_example_json_round_trip(v: Validator) -> None:
    a = v.impression(GOOD_IMP)
    assert isinstance(a, Impression)
    ex = LabelledExample(a, 1, NOW, {"user_ctr_1h": 0.25})
    assert LabelledExample.from_json(ex.to_json()) == ex


def test_an_example_with_what_orjson_refuses_round_trips_by_the_stdlib(v: Validator) -> None:
    # a lone surrogate passes validation (the stdlib decodes "\ud800"); orjson can neither write nor
    # read it, so fast_json falls back for that example, and it still reads back equal
    raw = json.dumps({**GOOD_IMP, "features": {"site": "\ud800x", "slot": "é"}}).encode()
    a = v.impression(raw)
    assert isinstance(a, Impression) and a.features["site"] == "\ud800x"
    ex = LabelledExample(a, 0, NOW, {"user_ctr_1h": 0.25, "user_clicked_items": ["b", "a"]})
    assert LabelledExample.from_json(ex.to_json()) == ex
    plain = LabelledExample(v.impression({**GOOD_IMP, "features": {"slot": "é"}}), 1, NOW)  # type: ignore[arg-type]
    assert "é".encode() in plain.to_json() and LabelledExample.from_json(plain.to_json()) == plain
    keys = list(json.loads(ex.to_json()))
    assert keys == sorted(keys)  # sorted keys on both paths


def test_a_timestamp_past_9999_is_refused_even_with_no_clock_to_judge_it() -> None:
    no_clock = Validator(ValidationConfig(), clock=ManualClock(0))
    for ts in (10**30, 2**64, 253_402_300_800_000):
        out = no_clock.impression({**GOOD_IMP, "ts": ts})
        assert isinstance(out, DeadLetter) and out.reason == "ts_in_future", ts
    assert isinstance(no_clock.impression({**GOOD_IMP, "ts": 253_402_300_799_999}), Impression)


@pytest.mark.parametrize("score", [0, 0.0, 0.37, 1])
def test_served_version_and_score_are_carried_into_the_example(v: Validator, score: float) -> None:
    a = v.impression({**GOOD_IMP, "model_version": "12", "score": score})
    assert isinstance(a, Impression) and (a.model_version, a.score) == ("12", score)
    assert isinstance(a.score, float)
    back = LabelledExample.from_json(LabelledExample(a, 0, NOW).to_json()).impression
    assert (back.model_version, back.score) == ("12", score)
    plain = v.impression({**GOOD_IMP, "score": None})
    assert isinstance(plain, Impression) and plain.score is None and "score" not in plain.to_dict()


def test_skew_and_age_are_judged_against_when_the_event_entered() -> None:
    v = Validator(ValidationConfig(), clock=ManualClock(NOW))  # the clock is only the fallback
    old = {**GOOD_IMP, "ts": NOW - 30 * 86_400_000}  # a month before the clock: fine if it entered then
    assert isinstance(v.validate(RawEvent("impression", old, "t", entered_ms=old["ts"] + 5)), Impression)
    assert v.impression(old).reason == "ts_too_old"  # judged by the clock: too old
    ahead = {**GOOD_IMP, "ts": NOW + 3_600_000}
    assert v.validate(RawEvent("impression", ahead, "t", entered_ms=NOW)).reason == "ts_in_future"


def test_an_event_on_another_partition_than_its_users_is_a_dead_letter() -> None:
    v = Validator(ValidationConfig(), clock=ManualClock(NOW), partition_of=lambda user: len(user) % 3)
    home = len("alice") % 3
    assert isinstance(v.validate(RawEvent("click", GOOD_CLICK, "t", partition=home)), Click)
    dead = v.validate(RawEvent("click", GOOD_CLICK, "clicks", partition=home + 1))
    assert isinstance(dead, DeadLetter) and dead.reason == "wrong_partition"
    assert (
        f"routes to partition {home}" in dead.detail
        and "key impressions, clicks and conversions by user_id" in dead.detail
    )


@pytest.mark.parametrize(
    "value",
    [
        {**GOOD_IMP, "ts": "yesterday"},  # refused after parsing
        json.dumps({**GOOD_IMP, "ts": "yesterday"}).encode(),
        json.dumps({**GOOD_IMP, "junk": 1}).encode()[:-1] + b",",  # not JSON at all
        json.dumps({**GOOD_IMP, "blob": "x" * 70_000}).encode(),  # too large: only a prefix is kept
        b'{"user_id": "alice", "features": {"ip": "192.168.7.7", "device_id": "dev-99"}, "ts": 1.5',
    ],
)
def test_dead_letters_carry_pseudonyms_never_raw_identifiers(v: Validator, value: object) -> None:
    dead = v.validate(RawEvent("impression", value, "t"))  # type: ignore[arg-type]
    assert isinstance(dead, DeadLetter)
    text = dead.to_json().decode()
    for raw in ("alice", "10.0.0.1", "192.168.7.7", "dev-99"):
        assert raw not in text
    assert v.pseudonymize("alice") in text  # the same pseudonym as the accepted events carry
