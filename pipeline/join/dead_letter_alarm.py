"""A WARNING when dead letters pass a share of a minute's input: a broken producer is seen at once.

Every dead letter is counted by reason in ``/metrics`` already; this is for the operator reading
the journal. Over each window (a minute by default) the alarm counts events and dead letters; when
the share passes ``share``, it logs one WARNING with the top reasons and one example (its safe,
pseudonymized prefix), then starts a new window.

>>> from pipeline.core.events import DeadLetter
>>> alarm = DeadLetterAlarm(0.05, clock=iter([0.0, 61.0]).__next__)
>>> alarm.observe(10)  # the window is still open
False
>>> alarm.letter(DeadLetter("ts_too_old", "ts 1 is older ...", "impression", b"{}", "imps", 0, 7))
>>> alarm.observe(0)  # a minute later: 1 of 10 events, 10% > 5%
True
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from pipeline.core.events import DeadLetter

__all__ = ["DeadLetterAlarm"]

log = logging.getLogger(__name__)


class DeadLetterAlarm:
    """Counts events and dead letters per window; warns once per window above ``share``."""

    def __init__(
        self, share: float, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.share, self.window_s, self._clock = share, window_s, clock
        self._start: float | None = None
        self._events = 0
        self._reasons: Counter[str] = Counter()
        self._example: DeadLetter | None = None
        self.warnings = 0

    def letter(self, letter: DeadLetter) -> None:
        self._reasons[letter.reason] += 1
        if self._example is None:
            self._example = letter

    def observe(self, events: int) -> bool:
        """Count ``events`` read; at a window's end, warn if needed. True when it warned."""
        now = self._clock()
        if self._start is None:
            self._start = now
        self._events += events
        if now - self._start < self.window_s:
            return False
        letters = sum(self._reasons.values())
        warned = bool(self._events) and letters / self._events > self.share
        if warned and self._example is not None:
            self.warnings += 1
            top = ", ".join(f"{r} {n:,}" for r, n in self._reasons.most_common(3))
            ex = self._example
            log.warning(
                "dead letters are %.1f%% of the input over the last %.0f s (%s of %s events; warn above "
                "%.0f%%): %s. Example (%s %s:%d@%d): %s: %s",
                100 * letters / self._events,
                now - self._start,
                f"{letters:,}",
                f"{self._events:,}",
                100 * self.share,
                top,
                ex.kind,
                ex.source,
                ex.partition,
                ex.offset,
                ex.detail,
                ex.raw[:200].decode("utf-8", "backslashreplace"),
            )
        self._start, self._events, self._reasons, self._example = now, 0, Counter(), None
        return warned
