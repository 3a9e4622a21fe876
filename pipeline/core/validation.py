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

Payload bytes are parsed by :mod:`pipeline.core.event_payload` (orjson, the stdlib behind it).

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
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.core.config import ValidationConfig
from pipeline.core.event_payload import Refused as _Reject
from pipeline.core.event_payload import decode_payload
from pipeline.core.events import Click, Conversion, DeadLetter, Impression
from pipeline.core.pseudonyms import Pseudonymizer, identifier_pattern
from pipeline.core.types import Clock, ManualClock, RawEvent

__all__ = ["Validator"]

_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
_MIN_TS = 946_684_800_000  # 2000-01-01: anything earlier is certainly a unit or parsing mistake
_MAX_TS = 253_402_300_799_999  # 9999-12-31, whatever the clock (a replay may judge against none)
_RAW_PREFIX = 1_024  # bytes of a rejected event kept in its dead letter


_IMPRESSION_FIELDS = {"impression_id", "ts", "user_id", "item_id", "features", "dense"}
_IMPRESSION_FIELDS |= {"model_version", "score"}  # optional: what served it (the A/B readout)
_CLICK_FIELDS = {"click_id", "impression_id", "ts", "user_id"}
_CONVERSION_FIELDS = {"conversion_id", "impression_id", "ts", "user_id", "value"}
_CONVERSION_REQUIRED = ("conversion_id", "impression_id", "ts", "user_id")
_KNOWN_KEYS_MAX = 10_000  # feature keys remembered as valid (a stream has tens; bounds a hostile one)


class Validator:
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
        try:
            obj = self._decode(raw.value)
            ref = raw.entered_ms if raw.entered_ms is not None else self.clock.now_ms()
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

    def _decode(self, value: bytes | Mapping[str, Any]) -> Mapping[str, Any]:
        return value if isinstance(value, Mapping) else decode_payload(value, self.cfg.max_event_bytes)

    @staticmethod
    def _check_fields(obj: Mapping[str, Any], allowed: set[str], required: tuple[str, ...]) -> None:
        keys = obj.keys()
        if keys <= allowed and all(map(keys.__contains__, required)):  # the common case, in C
            return
        for name in required:
            if name not in obj:
                raise _Reject("missing_field", f"missing field '{name}'")
        for name in obj:
            if name not in allowed:
                raise _Reject("unknown_field", f"unknown field '{str(name)[:64]}'")

    @staticmethod
    def _id(obj: Mapping[str, Any], name: str) -> str:
        value = obj[name]
        if not isinstance(value, str):
            raise _Reject("bad_type", f"'{name}' is {type(value).__name__}, expected string")
        if not _ID.fullmatch(value):
            raise _Reject("bad_id", f"'{name}' must be 1-128 chars of [A-Za-z0-9_.:-]")
        return value

    def _user(self, obj: Mapping[str, Any], partition: int) -> str:
        user = self._id(obj, "user_id")
        if self.partition_of is not None:
            home = self.partition_of(user)
            if home != partition:
                raise _Reject(
                    "wrong_partition",
                    f"on partition {partition}, but its user_id routes to partition {home}: "
                    "key impressions, clicks and conversions by user_id",
                )
        return self.pseudonymize(user)

    def _ts(self, obj: Mapping[str, Any], now: int) -> int:
        ts = obj["ts"]
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise _Reject("bad_type", f"'ts' is {type(ts).__name__}, expected integer epoch ms")
        if ts < _MIN_TS or (now and ts < now - self.cfg.max_past_age_s * 1000):
            raise _Reject("ts_too_old", f"ts {ts} is older than {self.cfg.max_past_age_s:g}s before {now}")
        if ts > _MAX_TS:
            raise _Reject("ts_in_future", f"ts {ts} is after the year 9999: not epoch milliseconds")
        if now and ts > now + self.cfg.max_future_skew_s * 1000:
            raise _Reject("ts_in_future", f"ts {ts} is more than {self.cfg.max_future_skew_s:g}s after {now}")
        return ts

    def _features(self, obj: Mapping[str, Any]) -> dict[str, str]:
        raw = obj.get("features", {})
        if not isinstance(raw, dict):
            raise _Reject("bad_type", f"'features' is {type(raw).__name__}, expected object")
        if len(raw) > self.cfg.max_features:
            raise _Reject("bad_value", f"'features' has {len(raw)} entries, limit {self.cfg.max_features}")
        if raw.keys() <= self._known_keys and self._pii.isdisjoint(raw):  # the common case, fast
            for v in raw.values():
                if type(v) is not str or len(v) > self.cfg.max_value_chars:
                    break  # the loop below says what is wrong
            else:
                return dict(raw)
        out: dict[str, str] = {}
        for k, v in raw.items():
            if not _KEY.fullmatch(k):
                raise _Reject("bad_value", f"feature key {str(k)[:64]!r} must match [A-Za-z0-9_]{{1,64}}")
            if len(self._known_keys) < _KNOWN_KEYS_MAX:
                self._known_keys.add(k)
            if not isinstance(v, str):
                raise _Reject("bad_type", f"feature '{k}' is {type(v).__name__}, expected string")
            if len(v) > self.cfg.max_value_chars:
                raise _Reject(
                    "bad_value", f"feature '{k}' is {len(v)} chars, limit {self.cfg.max_value_chars}"
                )
            out[k] = self.pseudonymize_device(v) if k in self._pii else v
        return out

    def _dense(self, obj: Mapping[str, Any]) -> dict[str, float]:
        raw = obj.get("dense", {})
        if not isinstance(raw, dict):
            raise _Reject("bad_type", f"'dense' is {type(raw).__name__}, expected object")
        if len(raw) > self.cfg.max_features:
            raise _Reject("bad_value", f"'dense' has {len(raw)} entries, limit {self.cfg.max_features}")
        if raw.keys() <= self._known_keys:  # the common case, fast
            for v in raw.values():
                if type(v) is not float or not math.isfinite(v):
                    break  # the loop below says what is wrong
            else:
                return dict(raw)
        out: dict[str, float] = {}
        for k, v in raw.items():
            if not _KEY.fullmatch(k):
                raise _Reject("bad_value", f"dense key {str(k)[:64]!r} must match [A-Za-z0-9_]{{1,64}}")
            if len(self._known_keys) < _KNOWN_KEYS_MAX:
                self._known_keys.add(k)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise _Reject("bad_type", f"dense '{k}' is {type(v).__name__}, expected number")
            if not math.isfinite(v):
                raise _Reject("bad_value", f"dense '{k}' is not finite")
            out[k] = float(v)
        return out

    def _impression(self, obj: Mapping[str, Any], now: int, partition: int) -> Impression:
        self._check_fields(obj, _IMPRESSION_FIELDS, ("impression_id", "ts", "user_id", "item_id"))
        version = obj.get("model_version")
        if version is not None and (not isinstance(version, str) or len(version) > 64):
            raise _Reject("bad_type", "'model_version' must be a string of at most 64 chars or null")
        score = obj.get("score")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0
        ):  # nan fails the range test too
            raise _Reject("bad_type", "'score' must be a probability in [0, 1] or null")
        return Impression(
            impression_id=self._id(obj, "impression_id"),
            ts=self._ts(obj, now),
            user_id=self._user(obj, partition),
            item_id=self._id(obj, "item_id"),
            features=self._features(obj),
            dense=self._dense(obj),
            model_version=version,
            score=None if score is None else float(score),
        )

    def _click(self, obj: Mapping[str, Any], now: int, partition: int) -> Click:
        self._check_fields(obj, _CLICK_FIELDS, ("click_id", "impression_id", "ts", "user_id"))
        return Click(
            click_id=self._id(obj, "click_id"),
            impression_id=self._id(obj, "impression_id"),
            ts=self._ts(obj, now),
            user_id=self._user(obj, partition),
        )

    def _conversion(self, obj: Mapping[str, Any], now: int, partition: int) -> Conversion:
        self._check_fields(obj, _CONVERSION_FIELDS, _CONVERSION_REQUIRED)
        value = obj.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _Reject("bad_type", f"'value' is {type(value).__name__}, expected number or null")
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise _Reject("bad_value", f"'value' must be finite and >= 0, got {value!r}")
        return Conversion(
            conversion_id=self._id(obj, "conversion_id"),
            impression_id=self._id(obj, "impression_id"),
            ts=self._ts(obj, now),
            user_id=self._user(obj, partition),
            value=None if value is None else float(value),
        )
