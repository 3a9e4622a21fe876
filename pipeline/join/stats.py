"""What the joiner counts and what it refuses: :class:`JoinStats`, :class:`Rejection`.

Both leave the joiner: the counters in every checkpoint and in ``/metrics`` (summed over the
partition tasks by :func:`click_outcomes`), a rejection as a dead letter with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.core.events import Click, Conversion

__all__ = ["JoinStats", "Rejection", "click_outcomes", "conversion_outcomes"]


@dataclass
class JoinStats:
    impressions: int = 0
    clicks: int = 0
    examples: int = 0
    positives: int = 0
    duplicate_impressions: int = 0
    duplicate_clicks: int = 0
    late_clicks: int = 0  # came after the impression's window: not attributed
    early_clicks: int = 0  # came before their impression and waited for it
    orphan_clicks: int = 0  # their impression never came within the hold time
    # conversions (joiner.conversion_window_s > 0; else every one is ignored_conversions)
    conversions: int = 0  # conversion events taken
    converted: int = 0  # attributed to a clicked impression: corrections with conversion 1
    corrections: int = 0  # correction examples emitted (one per clicked impression)
    duplicate_conversions: int = 0  # a second conversion for one impression
    late_conversions: int = 0  # came after the conversion window of the impression's click
    unclicked_conversions: int = 0  # their impression had no attributed click (yet): post-view
    orphan_conversions: int = 0  # their impression unknown here: dead letters
    ignored_conversions: int = 0  # conversions not joined (joiner.conversion_window_s = 0)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def click_outcomes(stats: Iterable[JoinStats]) -> dict[str, int]:
    """Clicks by what the join made of them, summed over partitions (``/metrics``, ``ctr status``).

    ``early`` clicks waited for their impression (they end attributed, late or orphaned);
    ``orphan`` ones became dead letters; ``attributed`` ones made a positive example.
    """
    out = dict.fromkeys(("attributed", "late", "early", "orphan", "duplicate"), 0)
    for s in stats:
        out["attributed"] += s.positives
        out["late"] += s.late_clicks
        out["early"] += s.early_clicks
        out["orphan"] += s.orphan_clicks
        out["duplicate"] += s.duplicate_clicks
    return out


def conversion_outcomes(stats: Iterable[JoinStats]) -> dict[str, int]:
    """Conversions by what the join made of them, summed over partitions; ``attributed`` ones made
    a correction with conversion 1 or are held for one (``pending``)."""
    names = ("attributed", "duplicate", "late", "unclicked", "orphan", "ignored")
    out = dict.fromkeys(names, 0)
    for s in stats:
        for name in names[1:]:
            out[name] += getattr(s, f"{name}_conversions")
        out["attributed"] += s.conversions - sum(getattr(s, f"{n}_conversions") for n in names[1:])
    return out


@dataclass(frozen=True, slots=True)
class Rejection:
    """A click or conversion the joiner refused for a reason that makes it a dead letter."""

    event: Click | Conversion
    reason: str
    detail: str
