"""When a replayed event "entered the system": the reference its clock skew and age are judged by.

In the daemons that reference is the Kafka record's timestamp. A log file has none, so a replay
derives one from the stream itself (../shared/DESIGN.md: "event time in a replay"): an event's own
time, unless it disagrees with its neighbours. An event more than ``max_future_skew_s`` ahead of
the median of the events that *follow* it, or more than ``max_past_age_s`` behind the median of the
events that *precede* it, is an outlier (a corrupt or mis-scaled timestamp) and gets that median as
its reference, so validation refuses it. A gap in event time is never a reason to reject: after a
gap, the events that follow agree with the first event past it, and the events before the gap are
judged only against those before them.

``ctr produce`` (of the simulator or of a log) stamps each record with this reference, so the
joiner daemon judges a replayed log exactly as ``ctr backtest`` does.

>>> ref = EnteredTime(max_future_skew_s=300, max_past_age_s=86_400)
>>> hour = 3_600_000
>>> ts = [hour, hour + 1, 10**15, hour + 2, 3 * hour, 3 * hour + 5]  # a corrupt one, then a 2 h gap
>>> refs = ref.references(ts)
>>> [r == t for r, t in zip(refs, ts)]
[True, True, False, True, True, True]
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

from pipeline.core.types import RawEvent

__all__ = ["EnteredTime"]

_WINDOW = 33  # neighbours on each side: an outlier needs more than half of them to go unseen


class EnteredTime:
    """Assigns :attr:`RawEvent.entered_ms` to the events of a replay, batch by batch.

    The look-behind window continues across batches; the look-ahead window ends with the batch
    (a source's batches are the same for a backtest and a replay to Kafka, so both agree).
    """

    def __init__(self, max_future_skew_s: float, max_past_age_s: float, window: int = _WINDOW) -> None:
        self.skew_ms = int(max_future_skew_s * 1000)
        self.age_ms = int(max_past_age_s * 1000)
        self.window = window
        self._behind: deque[int] = deque(maxlen=window)  # the last timestamps seen, in stream order

    def assign(self, batch: Sequence[RawEvent]) -> None:
        """Set ``entered_ms`` on each event of ``batch`` that has an integer ``ts`` and none yet."""
        todo = [(raw, _ts_of(raw)) for raw in batch if raw.entered_ms is None]
        stamped = [(raw, ts) for raw, ts in todo if ts is not None]
        for (raw, _), ref in zip(stamped, self.references([ts for _, ts in stamped]), strict=True):
            raw.entered_ms = ref

    def references(self, ts: Sequence[int]) -> list[int]:
        """The reference of each timestamp of one batch (see the module docstring)."""
        if not ts:
            return []
        behind = list(self._behind)
        lo, hi = min(ts), max(ts)
        if hi - lo <= self.skew_ms and (not behind or lo >= max(behind) - self.age_ms):
            self._behind.extend(ts[-self.window :])  # the common case: nothing can be an outlier
            return list(ts)
        out: list[int] = []
        past = sorted(behind)  # the look-behind window, kept sorted
        order = deque(behind)
        ahead = sorted(ts[: self.window])  # ts[i : i + window], kept sorted
        for i, t in enumerate(ts):
            bisect.insort(past, t)
            order.append(t)
            if len(order) > self.window:
                past.pop(bisect.bisect_left(past, order.popleft()))
            before, after = past[len(past) // 2], ahead[len(ahead) // 2]
            if t > after + self.skew_ms:
                out.append(after)
            elif t < before - self.age_ms:
                out.append(before)
            else:
                out.append(t)
            ahead.pop(bisect.bisect_left(ahead, t))  # slide the look-ahead window by one
            if i + self.window < len(ts):
                bisect.insort(ahead, ts[i + self.window])
        self._behind.extend(ts[-self.window :])
        return out


def _ts_of(raw: RawEvent) -> int | None:
    value = raw.value
    if isinstance(value, dict):
        ts = value.get("ts")
    elif isinstance(value, bytes | bytearray):
        ts = _peek_ts(bytes(value))
    else:
        return None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def _peek_ts(data: bytes) -> int | None:
    """The integer after ``"ts":`` in a JSON line, without parsing the whole line."""
    at = data.find(b'"ts"')
    if at < 0:
        return None
    at = data.find(b":", at + 4)
    if at < 0:
        return None
    end = at + 1
    while end < len(data) and data[end : end + 1] in b" \t":
        end += 1
    start = end
    while end < len(data) and data[end : end + 1].isdigit():
        end += 1
    if end == start or end - start > 19:
        return None
    return int(data[start:end])
