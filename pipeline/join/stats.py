"""What the joiner counts and what it refuses: :class:`JoinStats`, :class:`Rejection`.

Both leave the joiner: the counters in every checkpoint and in ``/metrics`` (summed over the
partition tasks by :func:`click_outcomes`), a rejection as a dead letter with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.core.events import Click

__all__ = ["JoinStats", "Rejection", "click_outcomes"]


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


@dataclass(frozen=True, slots=True)
class Rejection:
    """A click the joiner refused for a reason that makes it a dead letter."""

    click: Click
    reason: str
    detail: str
