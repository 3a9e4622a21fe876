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
- Conversions (``conversion_window_s > 0``; :mod:`pipeline.join.conversions`): a clicked
  impression is held until its click's conversion window closes and then emitted a second time, as
  a correction carrying its final conversion label.
- Users idle past ``features.forget_idle_s`` are forgotten daily (:meth:`JoinerCheckpoints._forget_idle`).

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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from features.aggregations import next_forget_at
from pipeline.core.config import JoinerConfig
from pipeline.core.events import Click, Conversion, Impression, LabelledExample
from pipeline.join.conversions import ConversionJoin
from pipeline.join.joiner_checkpoints import JoinerCheckpoints, _Pending
from pipeline.join.stats import JoinStats, Rejection
from pipeline.join.time_queue import TimeQueue

__all__ = ["FeatureTracker", "Joiner"]


class FeatureTracker(Protocol):
    """What the joiner needs from the streaming features (features.aggregations.StreamingFeatures)."""

    def lookup(self, user_id: str, item_id: str, ts_ms: int) -> dict[str, Any]: ...

    def record_impression(self, user_id: str, item_id: str, ts_ms: int) -> None: ...

    def record_click(self, user_id: str, item_id: str, ts_ms: int) -> None: ...

    def forget_idle(self, watermark_ms: int) -> list[str]: ...  # the users forgotten

    def has_user(self, user_id: str) -> bool: ...


@dataclass
class Joiner(JoinerCheckpoints, ConversionJoin):
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
        self._conv_window = int(self.cfg.conversion_window_s * 1000)
        self._pending: dict[str, _Pending] = {}
        # (time, impression id) entries popped once the watermark passes them (TimeQueue: in order)
        self._pending_queue = TimeQueue()  # window ends
        self._converting_queue = TimeQueue()  # conversion window ends
        self._early: dict[str, Click] = {}
        self._early_queue = TimeQueue()  # hold ends
        self._done: dict[str, int] = {}  # finalised impression id -> forget-after ts
        self._done_queue = TimeQueue()  # when a finalised id is forgotten
        self._out: list[LabelledExample] = []
        self._rejected: list[Rejection] = []
        # users whose entries changed since the last checkpoint, and every user's impression ids
        # (None: not tracked; see track_changes and pipeline.join.task_records)
        self.changed: set[str] | None = None
        self._owned: dict[str, dict[str, None]] = {}
        self._loaded_owners: dict[str, str] = {}  # finalised id -> user, from load_state
        self._loaded_stale: list[str] = []  # users whose records hold nothing any more, from load_state
        self._next_forget = next_forget_at(self.watermark)

    @property
    def watermark(self) -> int:
        return self.max_ts - self._lag

    # -- input -----------------------------------------------------------------------------------
    def process(self, event: Impression | Click | Conversion) -> None:
        """Take one validated event. Call :meth:`advance` after a batch to finalise negatives.

        A newer event time moves the watermark first: everything it passes is finalised (and
        forgotten) before the event is handled, so what an event meets (a duplicate id still
        remembered, an impression still open for its click) depends on the events before it, never
        on where a batch happened to end (which a replay does not reproduce). A conversion while
        conversions are not joined is only counted: not merged with the other streams, its time must
        not move the watermark."""
        if not self._conv_window and isinstance(event, Conversion):
            self._conversion(event)
            return
        ts = event.ts
        if ts > self.max_ts:
            self.max_ts = ts
            wm = ts - self._lag  # advance(), when something is due (most events find nothing)
            if (
                self._pending_queue.due(wm)
                or self._early_queue.due(wm)
                or self._done_queue.due(wm)
                or self._converting_queue.due(wm)
            ):
                self.advance(wm)
            if wm >= self._next_forget:
                self._forget_idle(wm)
        if isinstance(event, Impression):
            self._impression(event)
        elif isinstance(event, Click):
            self._click(event)
        else:
            self._conversion(event)

    def process_all(self, events: Iterable[Impression | Click | Conversion]) -> None:
        for event in events:
            self.process(event)
        self.advance()

    def _impression(self, imp: Impression) -> None:
        iid = imp.impression_id
        if iid in self._pending or iid in self._done:
            self.stats.duplicate_impressions += 1
            return
        self.stats.impressions += 1
        feats: dict[str, Any] = {}
        if self.features is not None:
            feats = self.features.lookup(imp.user_id, imp.item_id, imp.ts)  # before the update
            self.features.record_impression(imp.user_id, imp.item_id, imp.ts)
        pending = _Pending(imp, feats)
        self._pending[iid] = pending
        self._pending_queue.push(imp.ts + self._window, iid)
        if self.changed is not None:
            self._own(imp.user_id, iid)
        early = self._early.pop(iid, None)
        if early is not None:
            if self.changed is not None and early.user_id != imp.user_id:
                self._owned.get(early.user_id, {}).pop(iid, None)
                self.changed.add(early.user_id)
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
            self._early_queue.push(click.ts + self._hold, iid)
            if self.changed is not None:
                self._own(click.user_id, iid)

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
        pending.entry = None
        if self.changed is not None:
            self.changed.add(imp.user_id)
        if self.features is not None:
            self.features.record_click(imp.user_id, imp.item_id, click.ts)

    # -- time ------------------------------------------------------------------------------------
    def advance(self, watermark: int | None = None) -> None:
        """Finalise everything whose window ended before the watermark (default: the current one)."""
        wm = self.watermark if watermark is None else watermark
        queue = self._pending_queue
        while queue.due(wm):
            end, iid = queue.pop()
            pending = self._pending[iid]
            if pending.click_ts is None:
                self._emit(pending, 0, end)
            else:
                self._emit(pending, 1, pending.click_ts)
        self._close_conversion_windows(wm)
        queue = self._early_queue
        while queue.due(wm):
            end, iid = queue.pop()
            click = self._early.get(iid)
            # the click this entry was pushed for: one whose impression came is gone, and a later
            # early click for the same id has its own entry (a restore rebuilds only that one)
            if click is not None and click.ts + self._hold == end:
                del self._early[iid]
                self.stats.orphan_clicks += 1
                self._rejected.append(
                    Rejection(
                        click,
                        "orphan_click",
                        f"click {click.click_id}: impression {iid} did not arrive on this partition "
                        f"within early_click_hold_s ({self.cfg.early_click_hold_s:g} s of event time), "
                        "or came so long before the click (over attribution_window_s + "
                        "dedup_horizon_s) that it was forgotten",
                    )
                )
        queue = self._done_queue
        while queue.due(wm):
            _, iid = queue.pop()
            self._done.pop(iid, None)

    def flush(self) -> None:
        """End of a bounded replay: no more events will come, so finalise everything."""
        self.advance(watermark=2**62)

    def _emit(self, pending: _Pending, label: int, label_ts: int) -> None:
        imp = pending.impression
        iid = imp.impression_id
        self.stats.examples += 1
        self.stats.positives += label
        if not self._conv_window:
            self._out.append(LabelledExample(imp, label, label_ts, pending.features))
        elif label:  # its conversion label is not final yet: held for its correction, which gets
            # the features as they are now (downstream stages add to an example's dict in place)
            self._out.append(LabelledExample(imp, 1, label_ts, dict(pending.features), None))
            self._converting_queue.push(self.conversion_end(imp.ts, label_ts), iid)
            return
        else:  # never clicked: cannot convert
            self._out.append(LabelledExample(imp, 0, label_ts, pending.features, 0))
        self._forget_later(iid, imp.ts + self._window + self._horizon, label)

    def _forget_later(self, iid: str, forget_at: int, label: int) -> None:
        del self._pending[iid]
        self._done[iid] = -forget_at if label else forget_at  # sign remembers the label
        self._done_queue.push(forget_at, iid)

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

    def oldest_open_ts(self) -> int | None:
        """A lower bound on the impression time of every example still to come from what this joiner
        holds (open windows, clicked impressions awaiting their conversion label); ``None``: none."""
        bounds = []
        end = self._pending_queue.first()
        if end is not None:
            bounds.append(end - self._window)
        end = self._converting_queue.first()
        if end is not None:  # conversion_end >= the impression + window, or its click + conv window
            bounds.append(end - self._conv_window - self._window)
        return min(bounds, default=None)
