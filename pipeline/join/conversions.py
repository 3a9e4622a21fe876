"""The joiner's conversion rules: a conversion joins the clicked impression; a correction delivers it.

A base of :class:`pipeline.join.joiner.Joiner` (which sets every attribute used here), kept apart so
that the click rules read on their own. Active when ``joiner.conversion_window_s > 0``:

- A conversion names its impression (the click URL carries it to the advertiser). It is attributed
  when that impression is held here with an attributed click from the same user and
  ``conversion.ts <= click.ts + conversion_window``; the first one counts, later ones are
  duplicates.
- Labels: an impression never clicked cannot convert, so its one example carries conversion 0. A
  clicked one is emitted when its click window closes (the click label, conversion not final yet)
  and held until ``max(click.ts + conversion_window, impression.ts + attribution_window)``; when the
  watermark passes that, it is emitted again as a *correction*: same impression and features, its
  final conversion label, example id ``<impression id>#cv``, ``label_ts`` that end (when a
  converted one's label is final too: the trainer places corrections in a block by ``label_ts``,
  and a time that depended on the label would put the converted ones first).

  Why twice rather than once when the longest window closes: the click model would otherwise learn
  every click a conversion window late (24 h by default in ad systems), and the newest blocks would
  hold the negatives but not yet the positives, the sampling bias the click join avoids by emitting
  at window end. The correction is emitted at its window's end, not when a conversion comes, for the
  same reason: the conversion task's newest rows would be mostly positives.
- Not attributed, each counted: a conversion before any click of its impression (post-view, or clock
  skew) or of an impression finalised without a click (``unclicked_conversions``), after the window
  (``late_conversions``), another user's (a ``user_mismatch`` dead letter), or of an impression
  this partition does not hold (``orphan_conversion`` dead letter: it never came, or was forgotten
  ``dedup_horizon_s`` after its windows closed).

Conversions are merged with impressions and clicks on event time like clicks are
(:class:`~pipeline.join.partition_task.PartitionTask`), so what a conversion meets depends only on the
partition's input: replays and restarts give byte-identical examples.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import JoinerConfig
from pipeline.core.events import Conversion, LabelledExample
from pipeline.join.joiner_checkpoints import _Pending
from pipeline.join.stats import JoinStats, Rejection
from pipeline.join.time_queue import TimeQueue

__all__ = ["ConversionJoin"]


class ConversionJoin:
    """Conversion methods of :class:`pipeline.join.joiner.Joiner`; see the module docstring."""

    cfg: JoinerConfig
    stats: JoinStats
    changed: set[str] | None
    _window: int
    _horizon: int
    _conv_window: int
    _pending: dict[str, _Pending]
    _converting_queue: TimeQueue
    _done: dict[str, int]
    _out: list[LabelledExample]
    _rejected: list[Rejection]

    def _forget_later(self, iid: str, forget_at: int, label: int) -> None: ...  # Joiner's

    def conversion_end(self, impression_ts: int, click_ts: int) -> int:
        """When a clicked impression's conversion label becomes final (event time)."""
        return max(click_ts + self._conv_window, impression_ts + self._window)

    def _conversion(self, conv: Conversion) -> None:
        self.stats.conversions += 1
        if not self._conv_window:
            self.stats.ignored_conversions += 1
            return
        iid = conv.impression_id
        pending = self._pending.get(iid)
        if pending is None:
            done = self._done.get(iid)
            if done is None:
                self.stats.orphan_conversions += 1
                self._reject(
                    conv,
                    "orphan_conversion",
                    f"conversion {conv.conversion_id}: impression {iid} is not held on this partition: "
                    "it never arrived, or its windows closed over dedup_horizon_s "
                    f"({self.cfg.dedup_horizon_s:g} s) ago",
                )
            elif done < 0:  # clicked, and its conversion window closed: the correction went out
                self.stats.late_conversions += 1
            else:
                self.stats.unclicked_conversions += 1
            return
        imp = pending.impression
        if conv.user_id != imp.user_id:
            self._reject(
                conv,
                "user_mismatch",
                f"conversion {conv.conversion_id} user differs from impression {iid}'s",
            )
        elif pending.click_ts is None:
            self.stats.unclicked_conversions += 1
        elif pending.conversion is not None:
            self.stats.duplicate_conversions += 1
        elif conv.ts > pending.click_ts + self._conv_window:
            self.stats.late_conversions += 1
        else:
            pending.conversion = [conv.ts, conv.value]
            pending.entry = None
            if self.changed is not None:
                self.changed.add(imp.user_id)

    def _reject(self, conv: Conversion, reason: str, detail: str) -> None:
        self._rejected.append(Rejection(conv, reason, detail))

    def _close_conversion_windows(self, wm: int) -> None:
        """Emit the correction of every clicked impression whose conversion window ended before ``wm``."""
        queue = self._converting_queue
        while queue.due(wm):
            end, iid = queue.pop()
            pending = self._pending[iid]
            conv: list[Any] | None = pending.conversion
            converted = int(conv is not None)
            self._out.append(
                LabelledExample(
                    pending.impression,
                    1,
                    end,  # when the label became final for either value: no label-dependent order
                    pending.features,
                    converted,
                    True,
                    conv[1] if conv is not None else None,
                )
            )
            self.stats.corrections += 1
            self.stats.converted += converted
            self._forget_later(iid, end + self._horizon, 1)
