"""The trainer's dedup of the joiner's replays: example ids taken, forgotten when no replay can resend them.

A joiner that restarts from its last checkpoint re-sends byte-identical examples; the trainer drops
the ones whose id it has taken. An id is kept until the newest example time is twice the joiner's
own memory (attribution window + dedup horizon) past the time its example can last be emitted: its
impression's time, or for a correction (emitted when its conversion window closes) that plus the
attribution and conversion windows. Checkpointed with the trainer's offsets.
"""

from __future__ import annotations

from pipeline.core.config import JoinerConfig
from pipeline.core.events import LabelledExample

__all__ = ["SeenIds"]


class SeenIds:
    def __init__(self, cfg: JoinerConfig, ids: dict[str, int] | None = None) -> None:
        self.ids: dict[str, int] = dict(ids or {})  # example id -> when it can last be emitted
        self._correction_lag = round((cfg.attribution_window_s + cfg.conversion_window_s) * 1000)
        self._keep = round(2 * (cfg.attribution_window_s + cfg.dedup_horizon_s) * 1000)

    def take(self, ex: LabelledExample) -> bool:
        """Remember ``ex``; False if it was taken before (a replay: drop it)."""
        key = ex.example_id
        if key in self.ids:
            return False
        self.ids[key] = ex.impression.ts + (self._correction_lag if ex.correction else 0)
        return True

    def prune(self, newest_ts: int) -> None:
        """Forget ids far older than anything a joiner replay can re-send."""
        horizon = newest_ts - self._keep
        self.ids = {k: ts for k, ts in self.ids.items() if ts >= horizon}
