"""The trainer's item stage: global item features on every example, and their rows online.

``ctr trainer`` reads every partition's examples in one merge order, so it is where item
statistics over all traffic are counted (:mod:`features.item_stage`): each example gets its item's
features as it is taken from the merge (after dedup), before it is learned. The stage's state is
part of the trainer's checkpoint (it belongs to the same position as the blocks); its changed rows
go to the online store (Feast, Redis) every ``daemon.checkpoint_every_s``, where replicas read
them. A failed push (Redis away) keeps the rows for the next one: the daemon goes on training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from features.aggregations import FeatureRow
from features.item_stage import ItemStage
from features.store import FeatureWriter, open_store
from pipeline.core.config import Config
from pipeline.core.events import LabelledExample

__all__ = ["TrainerItems"]

log = logging.getLogger(__name__)


class TrainerItems:
    """:class:`ItemStage` plus its pushes to the online store; see the module docstring."""

    def __init__(self, cfg: Config, feast_dir: Path, state: Mapping[str, Any] | None) -> None:
        self.stage = ItemStage.of(cfg, state)
        store = open_store(
            feast_dir,
            "production",
            redis_url=cfg.daemon.redis_url,
            project=cfg.features.project,
            cfg=cfg.features,
        )
        self.writer = FeatureWriter(store, cfg.features)
        self.every_s = cfg.daemon.checkpoint_every_s
        self._rows: list[FeatureRow] = []  # drained, not pushed yet
        self._pushed_at = time.monotonic()

    def attach(self, example: LabelledExample) -> LabelledExample:
        return self.stage.attach([example])[0]

    def to_state(self) -> dict[str, Any]:
        return self.stage.to_state()

    def push(self, now: float, *, force: bool = False) -> None:
        """Push the changed item rows if ``checkpoint_every_s`` passed since the last push (or ``force``)."""
        if not force and now - self._pushed_at < self.every_s:
            return
        self._pushed_at = now
        self._rows += self.stage.drain_rows()
        if not self._rows:
            return
        try:
            self.writer.push([], self._rows)  # newest row per item wins; Redis keeps newer ones only
        except Exception as exc:  # the online store away: serving reads older item rows meanwhile
            log.warning("trainer: item features not pushed (%r); kept for the next push", exc)
            return
        self._rows = []
