"""Event schemas: the records that travel through the pipeline.

Four records (../shared/DESIGN.md, "Events"):

- :class:`Impression` and :class:`Click`, as :class:`pipeline.core.validation.Validator` decodes and
  validates them from raw bytes or mappings;
- :class:`LabelledExample`, the joiner's output: an impression, its label and the point-in-time
  streaming feature values it was scored with;
- :class:`DeadLetter`, what a rejected event becomes: a safe prefix of the raw bytes (identifiers
  pseudonymized), where it came from and a reason (one of :data:`REASONS`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.types import EventKind

__all__ = ["REASONS", "Click", "DeadLetter", "Impression", "LabelledExample", "kind_of"]

# json.dumps with any option builds a new JSONEncoder per call (~4 µs); examples reuse this one
_EXAMPLE_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)

# Every reason a dead letter can carry; counters are keyed by these.
REASONS = (
    "too_large",  # raw event over max_event_bytes
    "bad_encoding",  # not UTF-8
    "bad_json",  # not parseable JSON
    "not_an_object",  # JSON but not an object
    "missing_field",
    "unknown_field",
    "bad_type",
    "bad_id",  # id empty, too long or outside [A-Za-z0-9_.:-]
    "bad_value",  # feature key/value out of bounds, non-finite number
    "ts_too_old",
    "ts_in_future",
    "wrong_partition",  # not on the partition its user id routes to: keyed by something else
    "user_mismatch",  # a click whose user differs from its impression's (joiner)
    "orphan_click",  # a click whose impression never arrived on its partition within the hold (joiner)
)


@dataclass(frozen=True, slots=True)
class Impression:
    impression_id: str
    ts: int  # event time, epoch ms
    user_id: str  # pseudonymized
    item_id: str
    features: dict[str, str] = field(default_factory=dict)
    dense: dict[str, float] = field(default_factory=dict)
    model_version: str | None = None  # the version that served it (A/B readout)
    score: float | None = None  # the probability that version returned for it, in [0, 1]

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Impression:
        """The inverse of :meth:`to_dict` for trusted, already validated data (checkpoints, examples)."""
        return Impression(
            d["impression_id"],
            d["ts"],
            d["user_id"],
            d["item_id"],
            d.get("features", {}),
            d.get("dense", {}),
            d.get("model_version"),
            d.get("score"),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "impression_id": self.impression_id,
            "ts": self.ts,
            "user_id": self.user_id,
            "item_id": self.item_id,
            "features": self.features,
        }
        if self.dense:
            d["dense"] = self.dense
        if self.model_version is not None:
            d["model_version"] = self.model_version
        if self.score is not None:
            d["score"] = self.score
        return d


@dataclass(frozen=True, slots=True)
class Click:
    click_id: str
    impression_id: str
    ts: int
    user_id: str  # pseudonymized

    def to_dict(self) -> dict[str, Any]:
        return {
            "click_id": self.click_id,
            "impression_id": self.impression_id,
            "ts": self.ts,
            "user_id": self.user_id,
        }


@dataclass(frozen=True, slots=True)
class LabelledExample:
    """An impression with its label and the feature values as of its impression time."""

    impression: Impression
    label: int  # 1 if a click came within the attribution window
    label_ts: int  # event time the label became final: the click's ts, or the window's end
    stream_features: dict[str, Any] = field(default_factory=dict)  # floats; sequences are lists

    @property
    def example_id(self) -> str:
        return self.impression.impression_id

    def to_json(self) -> bytes:
        return _EXAMPLE_ENCODER.encode(
            {
                "impression": self.impression.to_dict(),
                "label": self.label,
                "label_ts": self.label_ts,
                "stream_features": self.stream_features,
            }
        ).encode()

    @staticmethod
    def from_json(data: bytes | str) -> LabelledExample:
        d = json.loads(data)
        imp = Impression.from_dict(d["impression"])
        return LabelledExample(imp, d["label"], d["label_ts"], d.get("stream_features", {}))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected event: why, where from, and a safe prefix of what it was."""

    reason: str
    detail: str
    kind: str
    raw: bytes
    source: str
    partition: int
    offset: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "reason": self.reason,
                "detail": self.detail,
                "kind": self.kind,
                "raw": self.raw.decode("utf-8", "backslashreplace"),
                "source": self.source,
                "partition": self.partition,
                "offset": self.offset,
            },
            separators=(",", ":"),
        ).encode()


def kind_of(event: Impression | Click) -> EventKind:
    return "impression" if isinstance(event, Impression) else "click"
