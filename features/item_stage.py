"""Item statistics over all traffic, point in time, the same whatever the partition count.

The joiner's partition tasks are keyed by user: a task sees only its own users' impressions, so
item counters kept there (``<item>@p<p>``) estimate an item's CTR from 1/P of its traffic, and a
change of P changes every item feature. This stage counts items where every labelled example
passes once, in an order that does not depend on P: the
:class:`~pipeline.join.example_merge.ExampleMerge` order (impression time, impression id), in
which the trainer cuts its blocks, in the daemon and in a replay alike.

**Definition.** For an example of item *i* at impression time *T*, with *D* = ``delay_ms`` (the
attribution window plus the watermark lag): the impressions of *i* with time in
``[T - D - w, T - D)`` for each window *w* of ``features.windows_s``, their clicks (the labels of
those impressions) and the smoothed CTR. Every impression before ``T - D`` has its final label
by the time *T* is served (its window closed), and the merge hands every example before *T* to
the stage before the one at *T*, so the value depends on the set of examples alone: not on the
partition count, not on how partitions were read. It is also what a replica can read at *T*:
the stage's rows reach the online store as the examples pass, standing *D* (plus the trainer's
lag) behind the impressions.

Counts are per impression (a click counts at its impression's time, once, as its label), where
the joiner's shard counters count clicks at the click's time.

A correction (a clicked impression's second emission, with its conversion label:
:class:`~pipeline.core.events.LabelledExample`) is not counted again; it gets the item features its
first emission got, which the stage keeps from one to the other (in its checkpoint too): the
conversion task learns from the inputs the impression was scored with.

>>> from pipeline.core.config import FeatureConfig
>>> from pipeline.core.events import Impression, LabelledExample
>>> stage = ItemStage(FeatureConfig(), delay_ms=60_000)
>>> ex = lambda i, ts, label: LabelledExample(Impression(i, ts, "u", "ad-1"), label, ts)
>>> first = stage.attach([ex("a", 0, 1), ex("b", 30_000, 0)])  # nothing of ad-1 before -60 s, -30 s
>>> [(e.stream_features["item_impressions_1h"], e.stream_features["item_clicks_1h"]) for e in first]
[(0.0, 0.0), (0.0, 0.0)]
>>> later = stage.attach([ex("c", 60_001, 0)])[0]  # sees "a" (before 1 ms), not "b" (30 s)
>>> later.stream_features["item_impressions_1h"], later.stream_features["item_clicks_1h"]
(1.0, 1.0)
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from features.aggregations import FeatureRow, StreamingFeatures, next_forget_at
from pipeline.core.config import Config, FeatureConfig
from pipeline.core.events import LabelledExample

__all__ = ["ItemStage"]

_STATE_VERSION = 1


class ItemStage:
    """Global item statistics attached to examples in merge order; see the module docstring."""

    def __init__(self, cfg: FeatureConfig, delay_ms: int, corrections: bool = False) -> None:
        """``corrections``: the joiner joins conversions, so every clicked example has a correction."""
        if delay_ms < 0:
            raise ValueError(f"ItemStage: delay_ms must be >= 0, got {delay_ms}")
        self.delay_ms = delay_ms
        self.corrections = corrections
        self.stats = StreamingFeatures(cfg)  # only its items are used
        # examples attached but not yet counted: (impression time, impression id, item, label)
        self._waiting: list[tuple[int, str, str, int]] = []
        # what clicked examples whose correction is still to come were given, by impression id
        self._to_correct: dict[str, dict[str, float]] = {}
        self._next_forget = 0  # when idle items are next forgotten (next_forget_at)
        self._visible = 0  # the newest visible_ms of advance(): the time of the rows drained

    @classmethod
    def of(cls, cfg: Config, state: Mapping[str, Any] | None = None) -> ItemStage:
        """The stage of a configuration (delay = ``joiner.attribution_window_s + watermark_lag_s``),
        fresh or restored from ``state`` (:meth:`to_state`)."""
        j = cfg.joiner
        if state is None:
            return cls(cfg.features, j.label_delay_ms, j.conversion_window_s > 0)
        return cls.from_state(state, cfg.features, j.label_delay_ms, j.conversion_window_s > 0)

    def attach(self, examples: list[LabelledExample]) -> list[LabelledExample]:
        """Set each example's item features (in place, merge order) and count it for later ones."""
        for ex in examples:
            imp = ex.impression
            visible = imp.ts - self.delay_ms
            if ex.correction:
                given = self._to_correct.pop(imp.impression_id, None)
                # its first emission passed before this stage's state began: the nearest we have
                ex.stream_features.update(given or self.stats.lookup_item(imp.item_id, visible))
                continue
            self.advance(visible)
            item = self.stats.lookup_item(imp.item_id, visible)
            ex.stream_features.update(item)
            if self.corrections and ex.label:  # its correction follows
                self._to_correct[imp.impression_id] = item
            heapq.heappush(self._waiting, (imp.ts, imp.impression_id, imp.item_id, ex.label))
        return examples

    def advance(self, visible_ms: int) -> None:
        """Count every example attached so far whose impression came before ``visible_ms``."""
        waiting, stats = self._waiting, self.stats
        while waiting and waiting[0][0] < visible_ms:
            ts, _, item, label = heapq.heappop(waiting)
            stats.record_item(item, ts, bool(label))
        if visible_ms > self._visible:
            self._visible = visible_ms
        if visible_ms >= self._next_forget:  # lookups never go back before visible_ms: exact
            self._next_forget = next_forget_at(visible_ms)
            stats.forget_idle(visible_ms)

    def drain_rows(self) -> list[FeatureRow]:
        """The items whose counts changed (or whose windows lost an impression) since the last
        call, as rows for the online store: each holds what an example attached now would get."""
        return self.stats.drain_dirty(self._visible or None)[1]

    # -- checkpoints -----------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable: the counters and the examples not yet counted."""
        return {
            "version": _STATE_VERSION,
            "delay_ms": self.delay_ms,
            "features": self.stats.to_state(),
            "waiting": sorted(self._waiting),
            "to_correct": self._to_correct,
            "next_forget": self._next_forget,
            "visible": self._visible,
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], cfg: FeatureConfig, delay_ms: int, corrections: bool = False
    ) -> ItemStage:
        """Rebuild from :meth:`to_state`. A checkpoint made with another delay means other features
        for every example after it: refused, as the configuration changed under the checkpoint."""
        if state.get("version") != _STATE_VERSION or state.get("delay_ms") != delay_ms:
            raise ValueError(
                f"item stage: checkpoint version {state.get('version')} / delay_ms {state.get('delay_ms')} "
                f"does not match version {_STATE_VERSION} / delay_ms {delay_ms} (attribution window + "
                "watermark lag): start the trainer from a fresh state folder, or restore the old settings"
            )
        stage = cls(cfg, delay_ms, corrections)
        stage.stats = StreamingFeatures.from_state(state["features"], cfg)
        stage._to_correct = dict(state.get("to_correct", {}))
        stage._next_forget = int(state.get("next_forget", 0))
        stage._visible = int(state.get("visible", 0))  # absent: written before row refreshes
        stage._waiting = [(int(t), str(i), str(item), int(y)) for t, i, item, y in state["waiting"]]
        heapq.heapify(stage._waiting)
        return stage
