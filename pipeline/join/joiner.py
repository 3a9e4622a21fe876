"""The joiner: impressions + clicks -> labelled examples, on event time.

Rules (../shared/DESIGN.md, "Attribution"):

- A click is attributed to its impression when ``click.ts <= impression.ts + window`` (event time;
  a click stamped slightly *before* its impression, i.e. clock skew between log servers, still
  counts).
- Every example is emitted when the watermark passes the end of its impression's window: label 1
  if a click was attributed, else 0. Watermark = highest event time seen - ``watermark_lag_s``.
  Emitting positives at once would be fresher by up to one window, but then the newest examples
  of every block would be mostly positives (their negatives not final yet): a biased training and
  gating sample. Emitting at window end keeps examples in impression-time order with final labels.
- A click that arrives before its impression (partition skew) is held for ``early_click_hold_s``
  of event time; if the impression never comes it is counted as an orphan and becomes an
  ``orphan_click`` dead letter (:meth:`Joiner.drain_rejected`): nothing is dropped unexplained.
- Duplicates (same impression id, or a second click for one impression) are dropped and counted;
  ids are remembered ``dedup_horizon_s`` past their window.
- A click arriving after its impression was finalised as a negative is a late click (counted, not
  attributed: the example already went out).

Features are point-in-time: the streaming features of an impression are looked up *before* that
impression updates them, kept with the pending impression, and attached to its example. Only
attributed clicks update the click counters.

>>> from pipeline.core.config import JoinerConfig
>>> j = Joiner(JoinerConfig(attribution_window_s=60, watermark_lag_s=0))
>>> j.process(Impression("i1", 1_000, "u", "a"))
>>> j.process(Click("c1", "i1", 5_000, "u"))
>>> j.drain()  # the window is still open
[]
>>> j.process(Impression("i2", 70_000, "u", "b"))
>>> j.advance()
>>> [(e.example_id, e.label, e.label_ts) for e in j.drain()]
[('i1', 1, 5000)]
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.core.config import JoinerConfig
from pipeline.core.events import Click, Impression, LabelledExample
from pipeline.join.stats import JoinStats, Rejection

__all__ = ["FeatureTracker", "Joiner"]


class FeatureTracker(Protocol):
    """What the joiner needs from the streaming features (features.aggregations.StreamingFeatures)."""

    def lookup(self, user_id: str, item_id: str, ts_ms: int) -> dict[str, float]: ...

    def record_impression(self, user_id: str, item_id: str, ts_ms: int) -> None: ...

    def record_click(self, user_id: str, item_id: str, ts_ms: int) -> None: ...


@dataclass(slots=True)
class _Pending:
    impression: Impression
    features: dict[str, float]
    click_ts: int | None = None  # event time of the attributed click, if any
    as_dict: dict[str, Any] | None = None  # impression.to_dict(), kept: every checkpoint writes it


@dataclass
class Joiner:
    """Stateful event-time join of impressions and clicks; see the module docstring for the rules."""

    cfg: JoinerConfig
    features: FeatureTracker | None = None
    stats: JoinStats = field(default_factory=JoinStats)
    max_ts: int = 0

    def __post_init__(self) -> None:
        self._window = int(self.cfg.attribution_window_s * 1000)
        self._lag = int(self.cfg.watermark_lag_s * 1000)
        self._hold = int(self.cfg.early_click_hold_s * 1000)
        self._horizon = int(self.cfg.dedup_horizon_s * 1000)
        self._pending: dict[str, _Pending] = {}
        self._pending_heap: list[tuple[int, str]] = []  # (window end, impression id)
        self._early: dict[str, Click] = {}
        self._early_heap: list[tuple[int, str]] = []  # (hold end, impression id)
        self._done: dict[str, int] = {}  # finalised impression id -> forget-after ts
        self._done_heap: list[tuple[int, str]] = []
        self._out: list[LabelledExample] = []
        self._rejected: list[Rejection] = []

    @property
    def watermark(self) -> int:
        return self.max_ts - self._lag

    # -- input -----------------------------------------------------------------------------------
    def process(self, event: Impression | Click) -> None:
        """Take one validated event. Call :meth:`advance` after a batch to finalise negatives."""
        if event.ts > self.max_ts:
            self.max_ts = event.ts
        if isinstance(event, Impression):
            self._impression(event)
        else:
            self._click(event)

    def process_all(self, events: Iterable[Impression | Click]) -> None:
        for event in events:
            self.process(event)
        self.advance()

    def _impression(self, imp: Impression) -> None:
        iid = imp.impression_id
        if iid in self._pending or iid in self._done:
            self.stats.duplicate_impressions += 1
            return
        self.stats.impressions += 1
        feats: dict[str, float] = {}
        if self.features is not None:
            feats = self.features.lookup(imp.user_id, imp.item_id, imp.ts)  # before the update
            self.features.record_impression(imp.user_id, imp.item_id, imp.ts)
        pending = _Pending(imp, feats)
        self._pending[iid] = pending
        heapq.heappush(self._pending_heap, (imp.ts + self._window, iid))
        early = self._early.pop(iid, None)
        if early is not None:
            self._attribute(pending, early)

    def _click(self, click: Click) -> None:
        self.stats.clicks += 1
        iid = click.impression_id
        pending = self._pending.get(iid)
        if pending is not None:
            self._attribute(pending, click)
        elif iid in self._done:
            # finalised already: another click for a positive, or a click after the window closed
            if self._done[iid] < 0:
                self.stats.duplicate_clicks += 1
            else:
                self.stats.late_clicks += 1
        elif iid in self._early:
            self.stats.duplicate_clicks += 1
        else:
            self.stats.early_clicks += 1
            self._early[iid] = click
            heapq.heappush(self._early_heap, (click.ts + self._hold, iid))

    def _attribute(self, pending: _Pending, click: Click) -> None:
        imp = pending.impression
        if click.user_id != imp.user_id:
            self._rejected.append(
                Rejection(
                    click,
                    "user_mismatch",
                    f"click {click.click_id} user differs from impression {imp.impression_id}'s",
                )
            )
            return
        if pending.click_ts is not None:
            self.stats.duplicate_clicks += 1
            return
        if click.ts > imp.ts + self._window:
            self.stats.late_clicks += 1
            return
        pending.click_ts = click.ts
        if self.features is not None:
            self.features.record_click(imp.user_id, imp.item_id, click.ts)

    # -- time ------------------------------------------------------------------------------------
    def advance(self, watermark: int | None = None) -> None:
        """Finalise everything whose window ended before the watermark (default: the current one)."""
        wm = self.watermark if watermark is None else watermark
        heap = self._pending_heap
        while heap and heap[0][0] < wm:
            end, iid = heapq.heappop(heap)
            pending = self._pending[iid]
            if pending.click_ts is None:
                self._emit(pending, 0, end)
            else:
                self._emit(pending, 1, pending.click_ts)
        heap = self._early_heap
        while heap and heap[0][0] < wm:
            _, iid = heapq.heappop(heap)
            click = self._early.pop(iid, None)
            if click is not None:
                self.stats.orphan_clicks += 1
                self._rejected.append(
                    Rejection(
                        click,
                        "orphan_click",
                        f"click {click.click_id}: impression {iid} did not arrive on this partition "
                        f"within early_click_hold_s ({self.cfg.early_click_hold_s:g} s of event time)",
                    )
                )
        heap = self._done_heap
        while heap and heap[0][0] < wm:
            _, iid = heapq.heappop(heap)
            self._done.pop(iid, None)

    def flush(self) -> None:
        """End of a bounded replay: no more events will come, so finalise everything."""
        self.advance(watermark=2**62)

    def _emit(self, pending: _Pending, label: int, label_ts: int) -> None:
        imp = pending.impression
        iid = imp.impression_id
        del self._pending[iid]
        forget_at = imp.ts + self._window + self._horizon
        self._done[iid] = -forget_at if label else forget_at  # sign remembers the label
        heapq.heappush(self._done_heap, (forget_at, iid))
        self._out.append(LabelledExample(imp, label, label_ts, pending.features))
        self.stats.examples += 1
        self.stats.positives += label

    # -- output ----------------------------------------------------------------------------------
    def drain(self) -> list[LabelledExample]:
        """Examples emitted since the last drain, in emission order."""
        out, self._out = self._out, []
        return out

    def drain_rejected(self) -> list[Rejection]:
        out, self._rejected = self._rejected, []
        return out

    @property
    def open_impressions(self) -> int:
        return len(self._pending)

    # -- checkpoints -----------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable state; undrained output must be drained (and made durable) first."""
        if self._out or self._rejected:
            raise RuntimeError("Joiner.to_state: drain() and drain_rejected() before checkpointing")
        return {
            "max_ts": self.max_ts,
            "stats": self.stats.as_dict(),
            "pending": [[_as_dict(p), p.features, p.click_ts] for p in self._pending.values()],
            "early": [c.to_dict() for c in self._early.values()],
            "done": self._done,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`to_state` output into a fresh joiner (same config)."""
        self.max_ts = state["max_ts"]
        self.stats = JoinStats(**state["stats"])
        self._pending.clear()
        self._pending_heap.clear()
        for imp_d, feats, click_ts in state["pending"]:
            imp = Impression.from_dict(imp_d)
            self._pending[imp.impression_id] = _Pending(imp, feats, click_ts)
            self._pending_heap.append((imp.ts + self._window, imp.impression_id))
        heapq.heapify(self._pending_heap)
        self._early = {c["impression_id"]: Click(**c) for c in state["early"]}
        self._early_heap = [(c.ts + self._hold, iid) for iid, c in self._early.items()]
        heapq.heapify(self._early_heap)
        self._done = dict(state["done"])
        self._done_heap = [(abs(v), iid) for iid, v in self._done.items()]
        heapq.heapify(self._done_heap)


def _as_dict(pending: _Pending) -> dict[str, Any]:
    """The pending impression as a dict, built once (a checkpoint writes every pending impression)."""
    if pending.as_dict is None:
        pending.as_dict = pending.impression.to_dict()
    return pending.as_dict
