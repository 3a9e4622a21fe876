"""Strict validation: raw events become an :class:`~pipeline.core.events.Impression`, a
:class:`~pipeline.core.events.Click` or a :class:`~pipeline.core.events.Conversion`, or a
:class:`~pipeline.core.events.DeadLetter` with a reason.
Validation never raises on bad input.

User ids and the configured device/IP feature values are replaced at ingest by a keyed hash
(:mod:`pipeline.core.pseudonyms`). A dead letter keeps a prefix of what was refused with the same
identifiers replaced by the same pseudonyms, whether the payload parsed or not, so the dead-letter
topic holds no raw user id, device id or IP either.

Clock skew and age are judged against the time each event entered the system
(:attr:`RawEvent.entered_ms`: the Kafka record's timestamp in the daemons, the replay's reference
time in replays), never against an unrelated wall clock; a gap in event time is no reason to reject.

Two paths, one verdict. An impression's or click's bytes are first decoded by msgspec into a
typed shape (:class:`_ImpressionShape`, :class:`_ClickShape`: types, required and unknown fields
checked in C), then given the checks a schema cannot express (the id and key patterns, time against
the event's entry, partition, limits from the config); that is the whole cost of a valid event
(~1.7x faster than the hand-written checks alone). Anything that path does not accept, for whatever
reason, is decided again from scratch by the descriptive path (:mod:`pipeline.core.event_rules`),
written by hand because each refusal must carry its reason code and a detail saying what to fix.
The first path only ever accepts what the second accepts, with the same result
(``tests/test_validation_paths.py`` holds them to it).

>>> v = Validator(ValidationConfig(), clock=ManualClock(1_767_225_600_000))
>>> imp = v.impression({"impression_id": "i1", "ts": 1_767_225_599_000, "user_id": "alice", "item_id": "ad7",
...                     "features": {"site": "news"}})
>>> imp.user_id.startswith("u_") and imp.user_id != "alice"
True
>>> v.impression({"impression_id": "i1", "ts": "yesterday", "user_id": "a", "item_id": "b"}).reason
'bad_type'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec

from pipeline.core.config import ValidationConfig
from pipeline.core.event_payload import Refused as _Reject
from pipeline.core.event_rules import ID_PATTERN, MODEL_VERSION_MAX_CHARS, FieldChecks
from pipeline.core.events import Click, Conversion, DeadLetter, Impression
from pipeline.core.pseudonyms import Pseudonymizer, identifier_pattern
from pipeline.core.types import Clock, ManualClock, RawEvent

__all__ = ["Validator"]

_RAW_PREFIX = 1_024  # bytes of a rejected event kept in its dead letter


class _ImpressionShape(msgspec.Struct, forbid_unknown_fields=True):
    """An impression's JSON as msgspec checks it; the rest is :meth:`Validator._fast`'s."""

    impression_id: str
    ts: int
    user_id: str
    item_id: str
    features: dict[str, str] = {}
    dense: dict[str, float] = {}  # an integer comes back as a float, 1e400 is refused
    model_version: Annotated[str, msgspec.Meta(max_length=MODEL_VERSION_MAX_CHARS)] | None = None
    score: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None


class _ClickShape(msgspec.Struct, forbid_unknown_fields=True):
    """A click's JSON as msgspec checks it."""

    click_id: str
    impression_id: str
    ts: int
    user_id: str


_FAST_KINDS = frozenset({"impression", "click"})  # conversions are rare: the descriptive path
_IMPRESSION_DECODER = msgspec.json.Decoder(_ImpressionShape)
_CLICK_DECODER = msgspec.json.Decoder(_ClickShape)


class Validator(FieldChecks):
    """Turns raw events into :class:`Impression`/:class:`Click`/:class:`Conversion`, or a
    :class:`DeadLetter` with a reason.

    Timestamps are judged against each event's :attr:`RawEvent.entered_ms`; ``clock`` is the
    fallback for events that carry none (a record without a timestamp, a direct call).
    ``partition_of``, when given, maps a raw user id to the partition its events must be on: an
    event found elsewhere (keyed by something else) is a ``wrong_partition`` dead letter, since
    the joiner of its partition would never see its impression or clicks.
    """

    def __init__(
        self,
        cfg: ValidationConfig,
        clock: Clock | None = None,
        partition_of: Callable[[str], int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock or ManualClock(0)
        self.partition_of = partition_of
        self.pseudonymize = Pseudonymizer(cfg.pseudonym_key.get_secret_value(), "u_")
        self.pseudonymize_device = Pseudonymizer(cfg.pseudonym_key.get_secret_value(), "d_")
        self._pii = frozenset(cfg.pii_feature_keys)
        self._known_keys: set[str] = set()  # feature and dense keys that matched the key pattern
        self._scrub_re = identifier_pattern(self._pii)
        self.rejected: dict[str, int] = {}

    # -- public API ------------------------------------------------------------------------------
    def validate(self, raw: RawEvent) -> Impression | Click | Conversion | DeadLetter:
        """Decode and check one raw event; never raises on bad input."""
        ref = raw.entered_ms if raw.entered_ms is not None else self.clock.now_ms()
        if type(raw.value) is bytes and raw.kind in _FAST_KINDS:
            fast = self._fast(raw.kind, raw.value, ref, raw.partition)
            if fast is not None:
                return fast
        return self._descriptive(raw, ref)

    def _descriptive(self, raw: RawEvent, ref: int) -> Impression | Click | Conversion | DeadLetter:
        """Every check by hand, in order: the event, or a dead letter saying what is wrong."""
        try:
            obj = self._decode(raw.value)
            if raw.kind == "impression":
                return self._impression(obj, ref, raw.partition)
            if raw.kind == "conversion":
                return self._conversion(obj, ref, raw.partition)
            return self._click(obj, ref, raw.partition)
        except _Reject as rej:
            return self._dead(raw, rej.reason, rej.detail)

    def impression(self, value: bytes | Mapping[str, Any]) -> Impression | DeadLetter:
        out = self.validate(RawEvent("impression", value, "direct"))
        assert isinstance(out, Impression | DeadLetter)
        return out

    def click(self, value: bytes | Mapping[str, Any]) -> Click | DeadLetter:
        out = self.validate(RawEvent("click", value, "direct"))
        assert isinstance(out, Click | DeadLetter)
        return out

    def conversion(self, value: bytes | Mapping[str, Any]) -> Conversion | DeadLetter:
        out = self.validate(RawEvent("conversion", value, "direct"))
        assert isinstance(out, Conversion | DeadLetter)
        return out

    def dead_letter(self, raw: RawEvent, reason: str, detail: str) -> DeadLetter:
        """A dead letter decided outside validation (e.g. by the joiner), counted here too.

        ``raw.value`` is then a validated event's dict: its identifiers are pseudonyms already.
        """
        return self._dead(raw, reason, detail, scrub=False)

    def scrub(self, text: str) -> str:
        """``text`` with every ``user_id`` and PII feature value replaced by its pseudonym.

        Works on a prefix of anything JSON-like, parseable or not (a dead letter's raw bytes): a
        value cut off by the prefix is replaced too.

        >>> v = Validator(ValidationConfig())
        >>> out = v.scrub('{"user_id":"alice","features":{"ip":"10.0.0.1"},"x":1')
        >>> "alice" in out or "10.0.0.1" in out, out.count('"u_'), out.count('"d_')
        (False, 1, 1)
        """

        def replace(m: re.Match[str]) -> str:
            name, value = m.group(1), m.group(2)
            value = value.strip('"') if value.startswith('"') else value
            hashed = self.pseudonymize(value) if name == "user_id" else self.pseudonymize_device(value)
            return f'"{name}":"{hashed}"'

        return self._scrub_re.sub(replace, text)

    # -- internals -------------------------------------------------------------------------------
    def _fast(self, kind: str, value: bytes, now: int, partition: int) -> Impression | Click | None:
        """The valid event ``value`` holds, through msgspec; None whenever anything is off (or
        new, like a feature key not seen before): the descriptive path then decides."""
        if len(value) > self.cfg.max_event_bytes:
            return None
        fullmatch = ID_PATTERN.fullmatch
        try:
            if kind == "click":
                c = _CLICK_DECODER.decode(value)
                if not (fullmatch(c.click_id) and fullmatch(c.impression_id) and fullmatch(c.user_id)):
                    return None
                return Click(
                    c.click_id, c.impression_id, self._check_ts(c.ts, now), self._user(c.user_id, partition)
                )
            e = _IMPRESSION_DECODER.decode(value)
            if not (fullmatch(e.impression_id) and fullmatch(e.user_id) and fullmatch(e.item_id)):
                return None
            features, dense, known = e.features, e.dense, self._known_keys
            if not (features.keys() <= known and dense.keys() <= known):
                return None
            limit = self.cfg.max_value_chars
            if len(features) > self.cfg.max_features or len(dense) > self.cfg.max_features:
                return None
            for v in features.values():
                if len(v) > limit:
                    return None
            if not self._pii.isdisjoint(features):
                pii, device = self._pii, self.pseudonymize_device
                features = {k: device(v) if k in pii else v for k, v in features.items()}
            ts = self._check_ts(e.ts, now)
            user = self._user(e.user_id, partition)
        except (msgspec.MsgspecError, _Reject):
            return None
        return Impression(e.impression_id, ts, user, e.item_id, features, dense, e.model_version, e.score)

    def _dead(self, raw: RawEvent, reason: str, detail: str, scrub: bool = True) -> DeadLetter:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        value = raw.value
        if isinstance(value, bytes | bytearray):
            text = bytes(value[:_RAW_PREFIX]).decode("utf-8", "backslashreplace")
        else:
            try:
                text = json.dumps(value, default=repr)[:_RAW_PREFIX]
            except (TypeError, ValueError, RecursionError):
                text = repr(value)[:_RAW_PREFIX]
        if scrub:
            text = self.scrub(text)
        data = text.encode("utf-8", "backslashreplace")[:_RAW_PREFIX]  # pseudonyms may be longer
        return DeadLetter(reason, detail[:300], raw.kind, data, raw.source, raw.partition, raw.offset)
