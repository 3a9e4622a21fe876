"""Validation's descriptive path: every check of an event's fields by hand, in order, each refusal
raised as :class:`~pipeline.core.event_payload.Refused` with its dead-letter reason and a detail
saying what to fix. :class:`pipeline.core.validation.Validator` takes it as a base; it decides every
event msgspec's path did not accept (see that module).

Written by hand, not with a schema library, because each refusal must carry one of
:data:`~pipeline.core.events.REASONS` and a precise detail, which a library's error text does not
give; msgspec's path in front of it keeps its cost off valid events.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.core.config import ValidationConfig
from pipeline.core.event_payload import Refused as _Reject
from pipeline.core.event_payload import decode_payload
from pipeline.core.events import Click, Conversion, Impression
from pipeline.core.pseudonyms import Pseudonymizer

__all__ = ["FieldChecks"]

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
_MIN_TS = 946_684_800_000  # 2000-01-01: anything earlier is certainly a unit or parsing mistake
_MAX_TS = 253_402_300_799_999  # 9999-12-31, whatever the clock (a replay may judge against none)
MODEL_VERSION_MAX_CHARS = 64  # an impression's optional model_version (both validation paths)


_IMPRESSION_FIELDS = {"impression_id", "ts", "user_id", "item_id", "features", "dense"}
_IMPRESSION_FIELDS |= {"model_version", "score"}  # optional: what served it (the A/B readout)
_CLICK_FIELDS = {"click_id", "impression_id", "ts", "user_id"}
_CONVERSION_FIELDS = {"conversion_id", "impression_id", "ts", "user_id", "value"}
_CONVERSION_REQUIRED = ("conversion_id", "impression_id", "ts", "user_id")
_KNOWN_KEYS_MAX = 10_000  # feature keys remembered as valid (a stream has tens; bounds a hostile one)


def _finite(x: int | float) -> bool:
    """Whether ``x`` is a finite float, or an integer that is one (10**400 is not: it overflows)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


class FieldChecks:
    """The descriptive checks, as methods over the validator's config and state."""

    cfg: ValidationConfig
    partition_of: Callable[[str], int] | None
    pseudonymize: Pseudonymizer
    pseudonymize_device: Pseudonymizer
    _pii: frozenset[str]
    _known_keys: set[str]  # feature and dense keys that matched the key pattern

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
        if not ID_PATTERN.fullmatch(value):
            raise _Reject("bad_id", f"'{name}' must be 1-128 chars of [A-Za-z0-9_.:-]")
        return value

    def _user(self, user: str, partition: int) -> str:
        """The pseudonym of a valid ``user`` id, checked against the partition it came on."""
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
        return self._check_ts(ts, now)

    def _check_ts(self, ts: int, now: int) -> int:
        """``ts`` if it is plausible epoch milliseconds judged against ``now`` (0: no clock)."""
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
            if not _finite(v):
                raise _Reject("bad_value", f"dense '{k}' is not finite")
            out[k] = float(v)
        return out

    def _impression(self, obj: Mapping[str, Any], now: int, partition: int) -> Impression:
        self._check_fields(obj, _IMPRESSION_FIELDS, ("impression_id", "ts", "user_id", "item_id"))
        version = obj.get("model_version")
        if version is not None and (not isinstance(version, str) or len(version) > MODEL_VERSION_MAX_CHARS):
            raise _Reject(
                "bad_type",
                f"'model_version' must be a string of at most {MODEL_VERSION_MAX_CHARS} chars or null",
            )
        score = obj.get("score")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0
        ):  # nan fails the range test too
            raise _Reject("bad_type", "'score' must be a probability in [0, 1] or null")
        return Impression(
            impression_id=self._id(obj, "impression_id"),
            ts=self._ts(obj, now),
            user_id=self._user(self._id(obj, "user_id"), partition),
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
            user_id=self._user(self._id(obj, "user_id"), partition),
        )

    def _conversion(self, obj: Mapping[str, Any], now: int, partition: int) -> Conversion:
        self._check_fields(obj, _CONVERSION_FIELDS, _CONVERSION_REQUIRED)
        value = obj.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _Reject("bad_type", f"'value' is {type(value).__name__}, expected number or null")
        if value is not None and not (_finite(value) and value >= 0):
            raise _Reject("bad_value", f"'value' must be finite and >= 0, got {value!r}")
        return Conversion(
            conversion_id=self._id(obj, "conversion_id"),
            impression_id=self._id(obj, "impression_id"),
            ts=self._ts(obj, now),
            user_id=self._user(self._id(obj, "user_id"), partition),
            value=None if value is None else float(value),
        )
