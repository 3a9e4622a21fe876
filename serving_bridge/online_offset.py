"""The online offset on its way from the trainer to the replicas.

The trainer fits, while a block fills, how far the champion's logits sit from the click rate of the
examples joined since its block began (:mod:`trainers.online_offset`); replicas add it to every
logit of that version. It travels in one Redis hash per model, ``<features.project>:<registry.
model_name>:online_offset``, version -> offset (text): the trainer writes its champion's field at
most every ``every_s`` seconds (:class:`OffsetPublisher`), replacing any other version's, and each
replica reads its version's field once per alias poll (:class:`~serving_bridge.replica.Replica`).
Beside it travel the online residual (``<key>:residual``, :mod:`trainers.online_residual`) and the
mixture with the base rate (``<key>:blend``, :mod:`trainers.base_rate_blend`), one field each. A
version without a field serves its model's scores: a challenger, and a version rolled back to until
the trainer has adopted it and fitted its own (one fitted hours ago, when that version last served,
would be stale). A replica that cannot reach Redis keeps the offset it read last (a WARNING once
per outage). The embedded stack (``ctr demo``) passes it through a :class:`MemoryOffsets`.

>>> board = MemoryOffsets()
>>> board.put(LiveServing("3", 0.5))
>>> board.get("3"), board.get("4")
(0.5, None)
>>> board.put(LiveServing("4", -0.1))  # the champion moved on: only its offset is on the board
>>> board.get("3"), board.get("4")
(None, -0.1)
>>> [round(float(p), 4) for p in shift_probabilities(np.array([0.1, 0.5]), np.log(2.0))]
[0.1818, 0.6667]
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Protocol

import numpy as np

from trainers.base_rate_blend import BaseRateBlend
from trainers.online_offset import LiveServing
from trainers.online_residual import SparseResidual

__all__ = [
    "MemoryOffsets",
    "OffsetBoard",
    "OffsetPublisher",
    "RedisOffsets",
    "offset_key",
    "shift_probabilities",
]

log = logging.getLogger(__name__)


class OffsetBoard(Protocol):
    def put(self, live: LiveServing) -> None:
        """Make ``live`` (a version's offset, residual and mixture) the board's only one."""

    def get(self, version: str) -> float | None: ...

    def get_residual(self, version: str) -> SparseResidual | None: ...

    def get_blend(self, version: str) -> BaseRateBlend | None: ...


class _LiveOffset(Protocol):  # trainers.incremental.IncrementalTrainer
    def live_residual(self) -> LiveServing | None: ...


def offset_key(project: str, model_name: str) -> str:
    """The Redis hash of a model's offsets."""
    return f"{project}:{model_name}:online_offset"


def shift_probabilities(p: np.ndarray, offset: float | np.ndarray) -> np.ndarray:
    """``sigmoid(logit(p) + offset)`` (float64): a probability with ``offset`` (one, or one per
    row) added to its logit."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-15, 1.0 - 1e-15)
    odds = p / (1.0 - p) * np.exp(offset)
    return np.asarray(odds / (1.0 + odds), dtype=np.float64)


class MemoryOffsets:
    """An in-process board (the embedded stack)."""

    def __init__(self) -> None:
        self._live: dict[str, LiveServing] = {}

    def put(self, live: LiveServing) -> None:
        self._live = {live.version: live}

    def get(self, version: str) -> float | None:
        found = self._live.get(version)
        return None if found is None else found.offset

    def get_residual(self, version: str) -> SparseResidual | None:
        found = self._live.get(version)
        return None if found is None else found.residual

    def get_blend(self, version: str) -> BaseRateBlend | None:
        found = self._live.get(version)
        return None if found is None else found.blend


class RedisOffsets:
    """The Redis hash of :func:`offset_key` (text), and beside it ``<key>:residual`` (each
    version's :class:`~trainers.online_residual.SparseResidual` as ``.npz`` bytes) and
    ``<key>:blend`` (its :class:`~trainers.base_rate_blend.BaseRateBlend` as a JSON list)."""

    def __init__(self, redis_url: str, key: str, timeout_s: float = 1.0) -> None:
        import redis

        self.key = key
        self.residual_key = f"{key}:residual"
        self.blend_key = f"{key}:blend"
        self._redis = redis.Redis.from_url(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._residual: tuple[bytes, SparseResidual] | None = None  # the last one parsed

    def put(self, live: LiveServing) -> None:
        version = live.version
        with self._redis.pipeline(transaction=True) as all_:  # MULTI/EXEC: no reader sees it empty
            all_.delete(self.key, self.residual_key, self.blend_key)
            all_.hset(self.key, version, repr(float(live.offset)))
            if live.residual is not None:
                all_.hset(self.residual_key, version, live.residual.to_bytes())
            if live.blend is not None:
                all_.hset(self.blend_key, version, json.dumps(live.blend.to_list()))
            all_.execute()

    def get_blend(self, version: str) -> BaseRateBlend | None:
        value = self._redis.hget(self.blend_key, version)
        if value is None:
            return None
        blend = BaseRateBlend.from_spec(json.loads(value))
        return blend if blend is not None and all(map(math.isfinite, blend.to_list())) else None

    def get_residual(self, version: str) -> SparseResidual | None:
        value = self._redis.hget(self.residual_key, version)
        if value is None:
            return None
        data = bytes(value)
        if self._residual is None or self._residual[0] != data:  # parsed once per change
            self._residual = (data, SparseResidual.from_bytes(data))
        return self._residual[1]

    def get(self, version: str) -> float | None:
        value = self._redis.hget(self.key, version)
        if value is None:
            return None
        offset = float(value)
        return offset if math.isfinite(offset) else None


class OffsetPublisher:
    """Writes the trainer's live offset to a board at most every ``every_s`` seconds; a failed
    write is logged (once per outage) and retried at the next call, never raised."""

    def __init__(self, board: OffsetBoard, every_s: float = 1.0) -> None:
        self.board = board
        self.every_s = every_s
        self.failures = 0
        self._at = -math.inf
        self._failing = False

    def maybe_publish(self, trainer: _LiveOffset, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._at < self.every_s:
            return
        self._at = now
        live = trainer.live_residual()
        if live is None:
            return
        try:
            self.board.put(live)
        except Exception:
            self.failures += 1
            if not self._failing:
                log.warning("online offset: could not publish it (serving keeps the last one)", exc_info=True)
            self._failing = True
            return
        self._failing = False
