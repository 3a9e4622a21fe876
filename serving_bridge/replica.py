"""A serving replica: watches the ``champion`` alias and hot-swaps to each new version.

Swap protocol (../shared/DESIGN.md, "Hot swap"): the replica resolves the alias, loads the new
version *beside* the current one, warms it with a dummy request, then swaps one reference. A request
takes that reference once at its start, so in-flight requests finish on the version they started
with and the old model is freed when the last of them drops it. A version that fails to load leaves
the replica on its current version; the failure is counted and retried after a back-off.

The replica learns about a new version by polling the store (``poll_interval_s``) or by
:meth:`notify` (the trainer's push), whichever comes first. At each poll it also reads its version's
online offset (``offsets``, :mod:`serving_bridge.online_offset`), which it adds to every click logit
of that version; a version without one serves its model's scores. Last, each click probability is
mixed with the base rate (:mod:`trainers.base_rate_blend`): at the weight the trainer publishes with
the offset, or else the one the version was saved with (its block's start).

A multi-task version (a learner whose ``multi_task`` is true: ESMM, :mod:`trainers.multitask`) is
scored by one ``predict_request_tasks`` call per request, which gives the click probabilities and,
beside them, each candidate's pCVR (:attr:`ScoreResult.conversions`); a click-only version is scored
as before, with nothing more to do per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline.core.pseudonyms import Pseudonymizer
from serving_bridge.feature_fallback import read_async
from serving_bridge.online_offset import OffsetBoard, shift_probabilities
from trainers.base_rate_blend import BaseRateBlend
from trainers.online_residual import SparseResidual

__all__ = ["LoadedModel", "Replica", "ScoreResult"]

log = logging.getLogger(__name__)


class _Store(Protocol):
    def resolve(self, alias: str) -> str | None: ...

    def load(self, version: str) -> Any: ...


class _Features(Protocol):  # and optionally ``async def aget`` with the same arguments
    def get(self, user_id: str, item_ids: list[str]) -> list[dict[str, float]]: ...


@dataclass(frozen=True)
class LoadedModel:
    version: str
    learner: Any
    loaded_at: float
    multi_task: bool = False  # the learner predicts conversions too (read once, at the swap)
    blend: BaseRateBlend | None = None  # its saved mixture with the base rate (read at the swap)


@dataclass(frozen=True)
class ScoreResult:
    version: str  # the model version that made every probability of this response
    replica: str
    probabilities: list[float]  # pCTR per candidate, in the request's order
    # pCVR per candidate, P(conversion | click) (pCTCVR = pCTR x pCVR); None: a click-only model
    conversions: list[float] | None = None


@dataclass
class Replica:
    """One serving replica (in-process here; a ``ctr serve`` process in production)."""

    name: str
    store: _Store
    features: _Features | None
    pseudonymize: Pseudonymizer
    alias: str = "champion"
    poll_interval_s: float = 1.0
    retry_failed_after_s: float = 30.0
    on_swap: Callable[[], None] | None = None  # called on the watcher thread after each swap
    inference: str = "eager"  # serving.inference applied to each loaded version; eager: as the store loads it
    swaps: list[tuple[str, float]] = field(default_factory=list)  # (version, wall time it went live)
    offsets: OffsetBoard | None = None  # where the trainer publishes each version's online offset
    load_errors: int = 0
    alias_check_errors: int = 0  # registry lookups that failed (MLflow away)
    offset_errors: int = 0  # offset reads that failed (Redis away): the last one read is kept

    def __post_init__(self) -> None:
        self._current: LoadedModel | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: dict[str, float] = {}
        self._lock = threading.Lock()  # one swap at a time (poll thread vs. an explicit check)
        # (version, online offset, online residual, live mixture with the base rate), one reference
        self._offset: tuple[str | None, float, SparseResidual | None, BaseRateBlend | None] = (
            None,
            0.0,
            None,
            None,
        )

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Replica:
        self._thread = threading.Thread(target=self._watch, name=f"replica-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def notify(self) -> None:
        """Push notification: check the alias now instead of at the next poll."""
        self._wake.set()

    @property
    def version(self) -> str | None:
        current = self._current
        return current.version if current else None

    @property
    def ready(self) -> bool:
        return self._current is not None

    # -- swapping --------------------------------------------------------------------------------
    def _watch(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.check_once()
                if failing:
                    log.warning("replica %s: the registry answers again", self.name)
                failing = False
            except Exception:  # a registry outage must not kill the watcher; it retries next poll
                self.alias_check_errors += 1
                if not failing:  # once per outage, not every poll
                    log.warning(
                        "replica %s: alias check failed; serving %s meanwhile",
                        self.name,
                        self.version,
                        exc_info=True,
                    )
                failing = True
            self.read_offset()
            self._wake.wait(self.poll_interval_s)
            self._wake.clear()

    def check_once(self) -> bool:
        """Resolve the alias and swap if it moved; True if this call swapped."""
        with self._lock:
            target = self.store.resolve(self.alias)
            if target is None or target == self.version:
                return False
            failed_at = self._failed.get(target)
            if failed_at is not None and time.monotonic() - failed_at < self.retry_failed_after_s:
                return False
            try:
                learner = self.store.load(target)
                if self.inference != "eager" and hasattr(learner, "use_inference"):
                    learner.use_inference(self.inference)  # beside the old version, before the swap
                self._warm(learner)
            except Exception:
                self.load_errors += 1
                self._failed[target] = time.monotonic()
                log.exception(
                    "replica %s: version %s failed to load; staying on %s", self.name, target, self.version
                )
                return False
            multi_task = bool(getattr(learner, "multi_task", False))
            blend = getattr(learner, "blend", None)
            self._current = LoadedModel(target, learner, time.time(), multi_task, blend)  # the swap
            self.swaps.append((target, time.time()))
            log.info("replica %s: now serving version %s", self.name, target)
            if self.on_swap is not None:
                self.on_swap()
            return True

    def read_offset(self) -> float:
        """Read the serving version's online offset (kept as it was if the board cannot be read)."""
        version = self.version
        if self.offsets is None or version is None:
            return 0.0
        try:
            offset = self.offsets.get(version)
            residual = self.offsets.get_residual(version)
            blend = self.offsets.get_blend(version)
        except Exception:  # Redis away (or a residual unreadable): keep serving with the last ones
            self.offset_errors += 1
            if self.offset_errors == 1 or self.offset_errors % 600 == 0:
                log.warning(
                    "replica %s: online offset unreadable; keeping the last one", self.name, exc_info=True
                )
            return self._offset[1] if self._offset[0] == version else 0.0
        self._offset = (version, 0.0 if offset is None else offset, residual, blend)
        return self._offset[1]

    @staticmethod
    def _warm(learner: Any) -> None:
        p = learner.predict_request("u_warmup", ["warmup"], {}, [{}])
        if len(p) != 1:
            raise RuntimeError("warm-up request returned the wrong number of scores")
        if getattr(learner, "multi_task", False):  # the path its requests take (a traced graph of its own)
            tasks = learner.predict_request_tasks("u_warmup", ["warmup"], {}, [{}])
            if tasks.shape != (1, 2):
                raise RuntimeError(f"warm-up request returned task scores of shape {tasks.shape}, not (1, 2)")

    # -- scoring ---------------------------------------------------------------------------------
    def score(
        self,
        user_id: str,
        context: Mapping[str, str],
        item_ids: Sequence[str],
        dense: Sequence[Mapping[str, float]] | None = None,
    ) -> ScoreResult:
        """Click probability of ``user_id`` for each candidate item, features included (and its
        conversion probability after a click, for a multi-task model); ``dense``: each item's
        numeric impression inputs (``Impression.dense``; none: all missing, as in training)."""
        current, user = self._begin(user_id)
        feats = None if self.features is None else self.features.get(user, list(item_ids))
        return self._finish(current, user, context, item_ids, feats, dense)

    async def ascore(
        self,
        user_id: str,
        context: Mapping[str, str],
        item_ids: Sequence[str],
        dense: Sequence[Mapping[str, float]] | None = None,
    ) -> ScoreResult:
        """:meth:`score` for a caller on the event loop: the feature read is awaited there (a
        reader without ``aget`` runs on the loop's default thread pool), the forward runs inline."""
        current, user = self._begin(user_id)
        feats = None if self.features is None else await read_async(self.features, user, list(item_ids))
        return self._finish(current, user, context, item_ids, feats, dense)

    def _begin(self, user_id: str) -> tuple[LoadedModel, str]:
        """The model this request finishes on and the user's pseudonym (items are read by their id:
        their statistics are global, :mod:`features.item_stage`)."""
        current = self._current  # taken once: this request finishes on this version
        if current is None:
            raise RuntimeError(f"replica {self.name} has no model yet (alias '{self.alias}' unset)")
        return current, self.pseudonymize(user_id)

    def _finish(
        self,
        current: LoadedModel,
        user: str,
        context: Mapping[str, str],
        item_ids: Sequence[str],
        feats: list[dict[str, float]] | None,
        dense: Sequence[Mapping[str, float]] | None,
    ) -> ScoreResult:
        if dense is not None and len(dense) != len(item_ids):
            raise ValueError(f"score: {len(dense)} dense rows for {len(item_ids)} items")
        stream = [{}] * len(item_ids) if feats is None else feats
        version, offset, residual, live_blend = self._offset
        if version != current.version:
            offset, residual, live_blend = 0.0, None, None
        learner, multi = current.learner, current.multi_task
        shift: float | np.ndarray = offset
        if residual is None:  # the model's own request path; multi-task: both tasks in one forward
            if multi:
                scores = learner.predict_request_tasks(user, item_ids, context, stream, dense)
            else:
                scores = learner.predict_request(user, item_ids, context, stream, dense)
        else:  # encoded once: the residual reads the same inputs (its fields, no behaviour sequence)
            batch = learner.encoder.encode_request(user, item_ids, context, dense, stream)
            scores = learner.predict_tasks(batch) if multi else learner.predict(batch)
            shift = offset + residual.logits(batch.first_columns(len(learner.encoder.fields)))
        blend = live_blend or current.blend  # the mixture with the base rate, after the offset
        if multi:  # column 0 is predict_request's pCTR
            clicks = shift_probabilities(scores[:, 0], shift) if _moves(shift) else scores[:, 0]
            clicks = clicks if blend is None else blend.apply(clicks)
            return ScoreResult(current.version, self.name, clicks.tolist(), scores[:, 1].tolist())
        probs = shift_probabilities(scores, shift) if _moves(shift) else scores
        probs = probs if blend is None else blend.apply(probs)
        return ScoreResult(current.version, self.name, [float(p) for p in probs])


def _moves(shift: float | np.ndarray) -> bool:
    """Does adding ``shift`` to the logits change anything?"""
    return bool(np.any(np.asarray(shift) != 0.0))
