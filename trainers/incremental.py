"""The online-learning loop: every ``train_every`` labelled examples, validate, fine-tune, gate, publish.

For each block (examples ordered by impression time, stable):

1. **progressive validation**: the current champion scores the whole block before learning from it
   (the honest online metric), as serving scored it: with the **online offset** its intercept
   followed during the block (``trainer.online_offset``, :mod:`trainers.online_offset`: fitted on
   the block's labels final before each impression; :meth:`IncrementalTrainer.live_offset` is
   what the trainer publishes while the block fills) and its residual, then mixed with the
   running base rate (``trainer.base_rate_blend_clamp``, :mod:`trainers.base_rate_blend`); so does
   ``static`` (the model's own scores), a frozen copy of the model after the first block's
   fine-tune, to show what freshness buys;
2. **fine-tune** a clone of the champion on the older ``1 - holdout_fraction`` of the block;
3. **gate** the candidate against the champion on the newest ``holdout_fraction``;
4. if accepted, the candidate **learns the holdout** too (``trainer.learn_holdout``: otherwise the
   newest tenth of every block would never reach the served model), its intercept is **refitted**
   on the holdout (``trainer.refit_intercept``: the exact optimum of that one parameter on the
   block's newest rows, where the last few optimizer steps had left it anywhere within their
   noise), then it is **published** with its
   lineage, the champion alias moves, and it becomes the champion; if refused, the champion stays
   and the report says why. With ``trainer.calibrate`` the candidate carries a Platt scaling fitted
   on the champion's progressive logits over the block's older part (:mod:`trainers.calibration`);
   with ``trainer.shift_on_holdout`` an accepted candidate's intercept moves by what its holdout
   scores (made before it learned the holdout) miss the holdout's click rate by. Both are off:
   measured in benchmarks/README.md.

Baselines (optional, for backtests): extra learners that score every block progressively beside the
champion (before learning it, on exactly the same encoded rows), then learn the whole block; their
metrics land in :attr:`BlockReport.baselines`, and ``on_scores`` receives every block's labels and
each learner's scores (e.g. for bootstrap confidence intervals over examples).

Examples are encoded as :meth:`IncrementalTrainer.add` receives them (with the champion's encoder),
so closing a block only encodes the last call's examples (the result is the same however the
examples arrived); most of the encoding happens while the block is still filling.

Conversions (:mod:`trainers.multitask`): a multi-task champion (ESMM) learns every row, corrections
included, and a correction keeps the place it arrived in (the time of the click example it came
after), not its old impression time, which would put every correction in the oldest part of the
block, nor its emission time, a clock some 20 minutes ahead of the click examples' impression
times, which would put them all in the holdout: either way the holdout would not be a sample of
the impression space. A block's known conversions are then the never-clicked impressions of its
time and the clicked impressions of a conversion window earlier, in proportion in a steady stream.
Click metrics, calibration, the click gate, ``static``'s and the baselines' scores (click models,
all of them) read the rows that are not corrections; conversion metrics (``cvr_*``, merged into
``online``, ``static``, ``candidate`` and ``champion``: in MLflow ``online.cvr_auc``,
``holdout.cvr_logloss``, ...) score pCTCVR over the rows of known conversion, and the gate also
checks them
(``trainer.conversion_gate_tolerance``). A single-task champion never sees a correction: they are
dropped as they arrive (not counting towards ``train_every``) and counted in
:attr:`BlockReport.corrections_skipped`. Without conversions nothing of this changes a block.

Block 1 has no champion: the encoder schema is fitted on the block's field names (never labels),
the untrained initial model does the progressive scoring, and the gate accepts any finite candidate.

Manual rollbacks (:mod:`trainers.alias_guard`): before each block the trainer checks that the
alias still names the version it promoted; if someone moved it, it adopts that version as its
champion, so the next alias move needs a candidate that beats the rolled-back version.

Resuming: with ``resume=True`` the store's champion alias is loaded as the champion. Examples still
buffered (fewer than a block) are not durable: a caller that wants an exact resume passes, with each
:meth:`IncrementalTrainer.add`, the source position after those examples and cuts its input so that
blocks end on a call boundary (:attr:`IncrementalTrainer.needed` says how many more a block wants);
the lineage then records exactly where the block ended.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from pipeline.core.config import TrainerConfig
from pipeline.core.events import LabelledExample
from trainers.alias_guard import adopt_moved_alias, move_alias_unless_moved
from trainers.base_rate_blend import BaseRateBlend
from trainers.calibration import IDENTITY, apply_platt, cross_fitted_shift, fit_platt, fit_shift, logits_of
from trainers.encoding import EncodedBatch, Encoder
from trainers.ftrl import FtrlLearner
from trainers.gate import GateDecision, gate, labels_look_corrupt, paired_allowance
from trainers.learner import TorchLearner, cpu_threads
from trainers.metrics import auc, block_metrics
from trainers.models import is_multi_task
from trainers.multitask import (
    both_tasks,
    conversion_allowance,
    conversion_gate,
    conversion_metrics,
    task_probabilities,
)
from trainers.online_offset import LiveServing, block_offsets, live_offset
from trainers.online_residual import SparseResidual, block_residual, ids_only, residual_learner

__all__ = ["AliasStore", "BaselineLearner", "BlockReport", "BlockScores", "IncrementalTrainer"]


@runtime_checkable
class AliasStore(Protocol):
    """A :class:`pipeline.core.types.ModelStore` that can also move an alias."""

    def publish(self, model: Any, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str: ...

    def resolve(self, alias: str) -> str | None: ...

    def load(self, version: str) -> Any: ...

    def set_alias(self, alias: str, version: str) -> None: ...


@runtime_checkable
class BaselineLearner(Protocol):
    """A reference learner scored beside the champion (e.g. :class:`trainers.ftrl.FtrlLearner`)."""

    def learn(self, examples: EncodedBatch) -> float: ...

    def predict(self, examples: EncodedBatch) -> np.ndarray: ...


@dataclass
class BlockScores:
    """One block's labels and every learner's progressive scores (``static`` absent in block 1)."""

    index: int
    labels: np.ndarray  # float32 0/1, in the block's (impression-time) order
    scores: dict[str, np.ndarray]  # learner name ("online", "static", baselines) -> probabilities
    event_time_min: int
    event_time_max: int


@dataclass
class BlockReport:
    """What happened to one block. Metric dicts are :func:`trainers.metrics.block_metrics`."""

    index: int  # 1-based, counted over this trainer's life
    examples: int
    positives: int
    event_time_min: int  # impression ts, epoch ms
    event_time_max: int
    online: dict[str, float]  # progressive: the champion on the whole block, before learning it
    static: dict[str, float] | None  # the frozen block-1 model on the whole block (None in block 1)
    candidate: dict[str, float]  # the fine-tuned candidate on the holdout (+ train_loss)
    champion: dict[str, float] | None  # the champion on the holdout; None when there was none
    decision: GateDecision
    version: str | None  # the published version if accepted (None if refused or no store)
    parent_version: str | None  # the champion's version the candidate was fine-tuned from
    train_loss: float
    train_seconds: float
    examples_per_s: float  # training examples per second of train_seconds
    publish_seconds: float  # 0 when nothing was published
    position: Any = None  # the caller's source position when the block closed
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> progressive metrics
    adopted_version: str | None = None  # set when someone else had moved the alias: the version adopted
    alias_moved: bool = False  # whether this block moved the alias to ``version``
    corrections: int = 0  # rows of ``examples`` that are corrections (a multi-task champion's)
    corrections_skipped: int = 0  # corrections dropped since the last block (a single-task champion's)
    served_weight: float = 1.0  # the model's share of the served probability (trainers.base_rate_blend)
    # logits the published intercept moved by when it was refitted on the holdout (trainer.refit_intercept):
    # where the last optimizer steps had left it; large swings mean a noisy end of training
    intercept_refit: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for logs and benchmark files)."""
        return dataclasses.asdict(self)


def _per_row(values: np.ndarray, clicks: np.ndarray | None, empty: float) -> np.ndarray:
    """``values`` of the click rows spread over every row: a correction gets the value of the click
    example it came after (the online offset, the mixture's weight); ``empty`` for every row of a
    block without a click row (corrections only: a flushed tail)."""
    if clicks is None:
        return values
    if not len(values):
        return np.full(len(clicks), empty)
    return values[np.maximum(np.cumsum(clicks) - 1, 0)]


def _metrics_for_store(report: BlockReport) -> dict[str, float]:
    out: dict[str, float] = {"train_loss": report.train_loss, "train_examples_per_s": report.examples_per_s}
    out["served.model_weight"] = report.served_weight  # what the parent served this block with
    out["intercept_refit"] = report.intercept_refit
    groups: dict[str, Mapping[str, float] | None] = {
        "online": report.online,
        "static": report.static,
        "holdout": report.candidate,
        "holdout_champion": report.champion,
    }
    for group, metrics in groups.items():
        for k, v in (metrics or {}).items():
            if k != "train_loss":
                out[f"{group}.{k}"] = float(v)
    return out


class IncrementalTrainer:
    """Buffers labelled examples and runs one validate/fine-tune/gate/publish step per block."""

    def __init__(
        self,
        cfg: TrainerConfig,
        store: AliasStore | None = None,
        *,
        alias: str = "champion",
        champion: TorchLearner | None = None,
        resume: bool = True,
        baselines: Mapping[str, BaselineLearner] | None = None,
        on_scores: Callable[[BlockScores], None] | None = None,
        label_delay_ms: int | None = None,
        serves_offset: bool = False,
    ) -> None:
        """``store=None`` trains and gates without publishing (versions stay None).

        ``label_delay_ms``: how long after its impression an example's label is final
        (:attr:`~pipeline.core.config.JoinerConfig.label_delay_ms`); the online offset
        (``trainer.online_offset``, :mod:`trainers.online_offset`) needs it, and without it the
        served scores are the model's. ``serves_offset``: score the examples as they are buffered,
        for :meth:`live_offset` (a caller that publishes it to replicas).

        ``champion``: start from this learner (treated as an accepted champion); otherwise, with
        ``resume``, from the version the store's ``alias`` points at, if any. ``baselines`` and
        ``on_scores``: see the module docstring (names must not be ``online`` or ``static``).
        """
        if not 0.0 < cfg.holdout_fraction < 1.0:
            raise ValueError(f"TrainerConfig.holdout_fraction must be in (0, 1), got {cfg.holdout_fraction}")
        if cfg.train_every < 2:
            raise ValueError(f"TrainerConfig.train_every must be >= 2, got {cfg.train_every}")
        self.baselines = dict(baselines or {})
        if {"online", "static"} & set(self.baselines):
            raise ValueError("IncrementalTrainer: baselines may not be named 'online' or 'static'")
        self.on_scores = on_scores
        self.cfg = cfg
        self.label_delay_ms = label_delay_ms if cfg.online_offset or cfg.online_residual else None
        self.serves_offset = serves_offset and self.label_delay_ms is not None
        # the buffered rows' served logits, labels (-1: a correction) and encodings (the fields'
        # ids, no sequence: what the residual reads), scored by _live_for
        self._live_for: TorchLearner | None = None
        self._live: list[tuple[np.ndarray, np.ndarray, EncodedBatch]] = []
        # the live residual (trainers.online_residual) and mixture (trainers.base_rate_blend), and
        # how many of _live's rows they learned
        self._residual: FtrlLearner | None = None
        self._blend: BaseRateBlend | None = None
        self._live_rows = 0
        self._served_offset = 0.0  # the offset published last (0 at a block's start)
        torch.set_num_threads(cpu_threads(cfg))  # the process trains: size torch's pool to share the CPU
        self.store = store
        self.alias = alias
        self.champion: TorchLearner | None = champion
        if champion is None and store is not None and resume:
            version = store.resolve(alias)
            if version is not None:
                self.champion = store.load(version)
                self.champion.version = version
        self.has_champion = self.champion is not None  # an accepted model exists (gate compares)
        self.static: TorchLearner | None = None
        self.blocks = 0
        self._buffer: list[LabelledExample] = []
        self._clicks_buffered = 0  # of which not corrections: what a block counts (needed)
        # the buffer's first examples, encoded as they arrived by ``_encoded_with``
        # (the champion's encoder then): a closing block only encodes its last call's examples
        self._encoded: list[EncodedBatch] = []
        self._encoded_with: Encoder | None = None
        self._position: Any = None
        self._champion_auc: float | None = None  # the champion's held-out AUC when it was accepted
        self.corrections_skipped = 0  # corrections dropped unlearned (single-task champion), in all
        self._skipped = 0  # of which since the last block closed

    @property
    def champion_version(self) -> str | None:
        return None if self.champion is None else self.champion.version

    @property
    def learns_conversions(self) -> bool:
        """Does the champion (or, before block 1, ``trainer.model``) learn conversions too?"""
        return self.champion.multi_task if self.champion is not None else is_multi_task(self.cfg.model)

    @property
    def pending(self) -> int:
        """Examples buffered towards the next block."""
        return len(self._buffer)

    @property
    def needed(self) -> int:
        """Examples still needed to close the current block (corrections do not count: a block is
        ``train_every`` click examples and the corrections that came among them)."""
        return self.cfg.train_every - self._clicks_buffered

    def cut(self, examples: Sequence[LabelledExample]) -> int:
        """How many of ``examples`` (to be added next) fill the current block: up to and including
        the one that closes it, or all of them."""
        need = self.needed
        for i, ex in enumerate(examples):
            need -= not ex.correction
            if need == 0:
                return i + 1
        return len(examples)

    def skips(self, ex: LabelledExample) -> bool:
        """Is ``ex`` a correction this trainer does not learn (a single-task champion)? Counted if
        so. Callers that cut their input at block boundaries (:attr:`needed`) drop these first."""
        if ex.correction and not self.learns_conversions:
            self._skipped += 1
            self.corrections_skipped += 1
            return True
        return False

    def add(self, examples: Sequence[LabelledExample], position: Any = None) -> list[BlockReport]:
        """Buffer ``examples``; run every block they complete. ``position``: where the source is
        after these examples (recorded in the lineage of a block closed by this call)."""
        if any(ex.correction for ex in examples):
            examples = [ex for ex in examples if not self.skips(ex)]
        self._buffer.extend(examples)
        self._clicks_buffered += sum(not ex.correction for ex in examples)
        if position is not None:
            self._position = position
        self._encode_ahead()
        reports = []
        while self._clicks_buffered >= self.cfg.train_every:
            n, need = 0, self.cfg.train_every  # up to the train_every-th click example
            while need:
                need -= not self._buffer[n].correction
                n += 1
            reports.append(self._run_block(*self._take(n)))
        return reports

    def flush(self, min_examples: int = 2) -> list[BlockReport]:
        """Run the buffered partial block now (end of a replay), if it has ``min_examples`` or more.

        A partial block is handled exactly like a full one, holdout included; under 2 examples there
        is nothing to hold out, so they stay buffered.
        """
        if len(self._buffer) < max(2, min_examples):
            return []
        return [self._run_block(*self._take(len(self._buffer)))]

    # -- the buffer ------------------------------------------------------------------------------
    @property
    def _encoded_rows(self) -> int:
        """How many of the buffer's first examples are encoded already."""
        return sum(len(part) for part in self._encoded)

    def _encode_ahead(self) -> None:
        """Encode the buffered examples not encoded yet, with the champion's encoder (none before block 1)."""
        if self.champion is None:
            return
        encoder = self.champion.encoder
        if self._encoded_with is not encoder:  # first block done, or an adopted champion's encoder
            self._encoded, self._encoded_with = [], encoder
        done = self._encoded_rows
        if done < len(self._buffer):
            self._encoded.append(encoder.encode(self._buffer[done:]))
        if self.serves_offset and self.has_champion:
            self._score_live()

    def _score_live(self) -> None:
        """Score the encoded rows :meth:`live_offset` has not seen with the champion (all of them
        again when the champion changed)."""
        champion = self.champion
        assert champion is not None
        if self._live_for is not champion:
            self._live_for, self._live = champion, []
            self._residual, self._blend, self._live_rows, self._served_offset = None, None, 0, 0.0
        at, done = 0, sum(len(z) for z, _, _ in self._live)
        a, b = champion.calibration
        for piece in self._encoded:
            if at + len(piece) > done:
                part = piece[max(0, done - at) :]
                raw = champion.click_logits(part)
                assert part.labels is not None
                y = part.labels.astype(np.float64)
                if part.corrections is not None:
                    y[part.corrections] = -1.0
                self._live.append((a * raw + b, y, part.first_columns(len(champion.encoder.fields))))
            at += len(piece)

    def live_offset(self) -> tuple[str, float] | None:
        """``(version, offset)`` to serve now (:func:`trainers.online_offset.live_offset` over the
        examples buffered towards the current block); None before a published champion, or unless
        built with ``serves_offset``."""
        champion = self.champion
        if not self._live or self._live_for is not champion or champion is None or champion.version is None:
            return None
        if not self.cfg.online_offset:
            return champion.version, 0.0
        z = np.concatenate([z for z, _, _ in self._live])
        y = np.concatenate([y for _, y, _ in self._live])
        clicks = y >= 0
        return champion.version, live_offset(z[clicks], y[clicks], recent=self.cfg.online_offset_recent)

    def live_residual(self) -> LiveServing | None:
        """What to serve now (:class:`LiveServing`): :meth:`live_offset`; with
        ``trainer.online_residual``, the residual (:mod:`trainers.online_residual`) after learning
        the examples received since the last call, at margin their served logit plus that offset;
        and the champion's mixture with the base rate (:mod:`trainers.base_rate_blend`) after
        those examples, each scored as served: with the offset published before, by the residual
        before it learned them."""
        live = self.live_offset()
        if live is None:
            return None
        version, offset = live
        champion = self.champion
        assert champion is not None  # live_offset answered for it
        residual_on = self.cfg.online_residual
        if residual_on and self._residual is None:  # the champion's encoder's ids (an adopted
            self._residual = residual_learner(champion.encoder.hash_buckets)  # version's may differ)
        if self._live_rows == 0:  # a block's start: the champion's saved mixture
            self._blend = champion.blend if self.cfg.base_rate_blend_clamp > 0 else None
        at = 0
        for z, y, part in self._live:
            if at + len(z) > self._live_rows:
                new = slice(max(0, self._live_rows - at), len(z))
                clicks = y[new] >= 0
                if clicks.any():
                    logits, labels = z[new][clicks], y[new][clicks]
                    labelled = ids_only(part[new][clicks], labels)
                    if self._blend is not None:  # each as served: the offset published before,
                        served = logits + self._served_offset  # the residual before it learns them
                        if self._residual is not None:
                            served = served + self._residual.logits(labelled)
                        p = 1.0 / (1.0 + np.exp(-served))
                        self._blend = self._blend.learn(p, labels, clamp=self.cfg.base_rate_blend_clamp)
                    if self._residual is not None:
                        self._residual.learn(labelled, logits + offset)
            at += len(z)
        self._live_rows, self._served_offset = at, offset
        residual = SparseResidual.of(self._residual) if residual_on and self._residual is not None else None
        return LiveServing(version, offset, residual, self._blend)

    def _take(self, n: int) -> tuple[list[LabelledExample], EncodedBatch | None, Encoder | None]:
        """Remove the first ``n`` buffered examples; with their encoding and its encoder, if made."""
        block = self._buffer[:n]
        del self._buffer[:n]
        self._clicks_buffered -= sum(not ex.correction for ex in block)
        if self._live:  # the rows that stay are the next block's: its residual starts anew
            z = np.concatenate([z for z, _, _ in self._live])
            y = np.concatenate([y for _, y, _ in self._live])
            rows = EncodedBatch.concat([part for _, _, part in self._live])
            self._live = [(z[n:], y[n:], rows[n:])] if len(z) > n else []
            self._residual, self._blend, self._live_rows, self._served_offset = None, None, 0, 0.0
        if self._encoded_rows < n:  # not encoded ahead (block 1)
            self._encoded, self._live_for = [], None
            return block, None, None
        encoded = EncodedBatch.concat(self._encoded)
        self._encoded = [encoded[n:]] if len(encoded) > n else []
        return block, encoded[:n], self._encoded_with

    # -- one block -------------------------------------------------------------------------------
    def _run_block(
        self, block: list[LabelledExample], encoded: EncodedBatch | None, encoded_with: Encoder | None
    ) -> BlockReport:
        self.blocks += 1
        adopted = self._follow_alias()
        ts = _block_times(block)
        order = np.argsort(ts, kind="stable")  # stable: newest last, for the holdout
        block = [block[i] for i in order]
        if self.champion is None:
            encoder = Encoder.for_trainer(self.cfg).fit(block)
            self.champion = TorchLearner(self.cfg, encoder)  # untrained: block 1's scorer and base
        champion = self.champion
        if encoded is not None and encoded_with is champion.encoder:
            batch = encoded[order]
        else:
            batch = champion.encode(block)
        assert batch.labels is not None
        y = batch.labels
        multi = champion.multi_task
        clicks = batch.click_rows()  # the rows click metrics read (None: all, no correction)
        y_click = _rows(y, clicks)
        logits_online = champion.predict_task_logits(batch) if multi else None  # (n, 2): one pass
        raw_online = champion.predict_logits(batch) if logits_online is None else logits_online[:, 0]
        p_online = apply_platt(raw_online, champion.calibration)  # the model's: what the gate compares
        # + the online offset and residual: the model's expert, mixed with the base rate to serve
        served_model = self._served(raw_online, champion.calibration, y, ts[order], clicks, batch)
        blend = champion.blend if self.has_champion and self.cfg.base_rate_blend_clamp > 0 else None
        served, weights, blend_end = served_model, np.ones(len(y_click)), 0.0
        if blend is not None:
            weights, blend_end = blend.block_weights(
                _rows(served_model, clicks),
                y_click,
                _rows(ts[order], clicks),
                delay_ms=self.label_delay_ms,
                every=self.cfg.online_offset_every,
                clamp=self.cfg.base_rate_blend_clamp,
            )
            served = blend.apply(served_model, _per_row(weights, clicks, 1.0))
        online = block_metrics(y_click, _rows(served, clicks))
        tasks_online = None  # [pCTR, pCVR] of a multi-task champion
        if logits_online is not None:
            tasks_online = task_probabilities(logits_online, champion.calibration)
            online |= conversion_metrics(y, batch.conversions, np.column_stack([served, tasks_online[:, 1]]))
            online["cvr_started"] = float(bool(getattr(champion.model, "cvr_started", True)))
        p_static, static = self._static_scores(batch, clicks)
        fields = batch.first_columns(len(champion.encoder.fields))  # references read no sequence
        fields = fields if clicks is None else fields[clicks]  # click models, all of them
        p_base = {name: b.predict(fields) for name, b in self.baselines.items()}
        for b in self.baselines.values():
            b.learn(fields)  # the whole block, holdout included: a reference learner needs no gate

        n = len(batch)
        n_hold = min(n - 1, max(1, round(n * self.cfg.holdout_fraction)))
        train, hold = batch[: n - n_hold], batch[n - n_hold :]
        assert hold.labels is not None
        train_clicks, hold_clicks = train.click_rows(), hold.click_rows()
        y_hold = _rows(hold.labels, hold_clicks)
        candidate = champion.clone()
        if self.cfg.calibrate and self.has_champion:
            # the champion's logits on this block's older part, made before it learned them
            candidate.calibration = fit_platt(
                _rows(raw_online[: n - n_hold], train_clicks), _rows(y[: n - n_hold], train_clicks)
            )
        elif self.cfg.intercept_gain > 0 and self.has_champion:
            self._correct_intercept(
                candidate, _rows(raw_online[: n - n_hold], train_clicks), _rows(y[: n - n_hold], train_clicks)
            )
        start = time.perf_counter()
        loss = candidate.learn(train)
        train_s = time.perf_counter() - start
        tasks_hold = candidate.predict_tasks(hold) if multi else None
        p_hold = _rows(candidate.predict(hold) if tasks_hold is None else tasks_hold[:, 0], hold_clicks)
        # Judged as it would be served: a version's intercept is refitted on the holdout once it is
        # accepted (refit_intercept), so the gate scores the candidate with its intercept refitted,
        # cross-fitted (no row scored by a fit it took part in). Unrefitted, a candidate that ranked
        # the holdout better was refused for the intercept its last small steps left, which the
        # refit was about to move, and its block was never learned (benchmarks/README.md).
        # Its AUC is its own ranking's: folds shifted apart would reorder rows across them.
        p_gate = cross_fitted_shift(p_hold, y_hold) if self.cfg.refit_intercept else p_hold
        cand_metrics = block_metrics(y_hold, p_gate) | {"auc": auc(y_hold, p_hold), "train_loss": loss}
        # The champion's holdout scores are part of its progressive scores: no second pass.
        p_champ_hold = _rows(p_online[n - n_hold :], hold_clicks)
        champ_metrics = block_metrics(y_hold, p_champ_hold) if self.has_champion else None
        confidence = self.cfg.gate_confidence
        corrupt = (
            labels_look_corrupt(
                online if blend is None else block_metrics(y_click, _rows(served_model, clicks)),
                self.cfg.min_champion_auc,
                self._champion_auc,
            )  # the model's ranking: the mixture's weight moves between stretches
            if self.has_champion
            else None
        )
        allowance = paired_allowance(y_hold, p_gate, p_champ_hold, confidence) if self.has_champion else 0.0
        decision = corrupt or gate(cand_metrics, champ_metrics, self.cfg.gate_tolerance, allowance=allowance)
        if tasks_hold is not None and tasks_online is not None:  # and the conversion task
            cand_metrics |= conversion_metrics(hold.labels, hold.conversions, tasks_hold)
            champ_tasks = tasks_online[n - n_hold :]
            cvr_allowance = 0.0
            if champ_metrics is not None:
                champ_metrics |= conversion_metrics(hold.labels, hold.conversions, champ_tasks)
                cvr_allowance = conversion_allowance(hold.conversions, tasks_hold, champ_tasks, confidence)
            tol = self.cfg.conversion_gate_tolerance
            conversion = conversion_gate(cand_metrics, champ_metrics, tol, allowance=cvr_allowance)
            decision = corrupt or both_tasks(decision, conversion)
        if self.static is None:
            self.static = (candidate if decision.accepted else champion).clone(frozen=True)

        report = BlockReport(
            index=self.blocks,
            examples=n,
            positives=int(y_click.sum()),
            event_time_min=int(ts[order[0]]),
            event_time_max=int(ts[order[-1]]),
            online=online,
            static=static,
            candidate=cand_metrics,
            champion=champ_metrics,
            decision=decision,
            version=None,
            parent_version=champion.version,
            train_loss=loss,
            train_seconds=train_s,
            examples_per_s=len(train) / train_s if train_s > 0 else float("inf"),
            publish_seconds=0.0,
            position=self._position,
            baselines={name: block_metrics(y_click, p) for name, p in p_base.items()},
            adopted_version=adopted,
            corrections=len(y) - len(y_click),
            corrections_skipped=self._skipped,
            served_weight=float(weights.mean()) if weights.size else 1.0,
        )
        self._skipped = 0
        if self.on_scores is not None:
            scores = {"online": _rows(served, clicks)} | (
                {"static": p_static} if p_static is not None else {}
            )
            scores |= p_base
            self.on_scores(
                BlockScores(self.blocks, y_click, scores, report.event_time_min, report.event_time_max)
            )
        if decision.accepted:
            candidate.blend = self._next_blend(blend, blend_end, y_click, p_hold, y_hold)
            if self.cfg.shift_on_holdout:
                # the holdout was scored before the candidate learned it, as the next block will be
                _move_intercept(candidate, logits_of(p_hold), y_hold)
            if self.cfg.learn_holdout:
                # Gated on data it had not seen; now it learns that data too. Otherwise the freshest
                # share of every block would never reach the served model.
                # Its few steps do not widen the dense inputs' range: trainers.learner.learn.
                start = time.perf_counter()
                loss_hold = candidate.learn(hold, widen_range=False, block_rows=len(train))
                report.train_seconds = train_s + time.perf_counter() - start
                report.train_loss = (loss * len(train) + loss_hold * len(hold)) / n
            if self.cfg.refit_intercept and y_hold.size:
                report.intercept_refit = self._refit_intercept(candidate, hold, y_hold, hold_clicks)
            if self.store is not None:
                start = time.perf_counter()
                metrics = _metrics_for_store(report)
                if candidate.blend is not None:  # what replicas will serve it with
                    metrics |= {
                        "blend.model_weight": candidate.blend.weight,
                        "blend.base_rate": candidate.blend.base_rate,
                    }
                version = self.store.publish(candidate, self._lineage(report, len(train)), metrics)
                report.alias_moved = self._move_alias(version, gated_against=champion.version)
                report.publish_seconds = time.perf_counter() - start
                report.version = candidate.version = version
            else:
                candidate.version = None
            self.champion, self.has_champion = candidate, True
            self._champion_auc = cand_metrics.get("auc")  # what the new champion proved on held-out data
        return report

    def _static_scores(
        self, batch: EncodedBatch, clicks: np.ndarray | None
    ) -> tuple[np.ndarray | None, dict[str, float] | None]:
        """The frozen block-1 model's click scores of the click rows and its metrics (with the
        conversion metrics when it is multi-task); ``(None, None)`` in block 1."""
        if self.static is None:
            return None, None
        assert batch.labels is not None
        if not self.static.multi_task:
            p = _rows(self.static.predict(batch), clicks)
            return p, block_metrics(_rows(batch.labels, clicks), p)
        tasks = self.static.predict_tasks(batch)
        p = _rows(tasks[:, 0], clicks)
        cvr = conversion_metrics(batch.labels, batch.conversions, tasks)
        return p, block_metrics(_rows(batch.labels, clicks), p) | cvr

    def _served(
        self,
        raw: np.ndarray,
        calibration: tuple[float, float],
        y: np.ndarray,
        ts: np.ndarray,
        clicks: np.ndarray | None,
        batch: EncodedBatch,
    ) -> np.ndarray:
        """Each row's served click probability: the champion's, calibrated, plus the online offset
        (:func:`~trainers.online_offset.block_offsets`, fitted on the click rows) and residual
        (:func:`~trainers.online_residual.block_residual`) once an accepted version serves; a
        correction gets those of the click example it came after."""
        if self.label_delay_ms is None or not self.has_champion:
            return apply_platt(raw, calibration)
        a, b = calibration
        z = a * np.asarray(raw, dtype=np.float64) + b
        z_clicks, y_clicks, t_clicks = _rows(z, clicks), _rows(y, clicks), _rows(ts, clicks)
        every = self.cfg.online_offset_every
        offsets = np.zeros(len(z_clicks))
        if self.cfg.online_offset:
            offsets = block_offsets(
                z_clicks,
                y_clicks,
                t_clicks,
                delay_ms=self.label_delay_ms,
                every=every,
                recent=self.cfg.online_offset_recent,
            )
        if self.cfg.online_residual and self.champion is not None:
            encoder = self.champion.encoder  # the ids' (an adopted version's may differ from the config)
            rows = batch.first_columns(len(encoder.fields))
            rows = rows if clicks is None else rows[clicks]
            offsets = offsets + block_residual(
                z_clicks,
                y_clicks,
                t_clicks,
                rows,
                hash_buckets=encoder.hash_buckets,
                delay_ms=self.label_delay_ms,
                every=every,
                offsets=offsets,
            )
        return apply_platt(z + _per_row(offsets, clicks, 0.0), IDENTITY)

    def _correct_intercept(self, candidate: TorchLearner, raw: np.ndarray, y: np.ndarray) -> None:
        """Move the candidate's intercept by what the served scores (the champion's, calibrated,
        made before it learned the block: ``raw`` are its logits on the block's older part) missed
        the click rate by, at gain ``1 / (k + 1)`` for the k-th correction, never below
        ``intercept_gain``. That is the running mean of the blocks' offsets (shrunk towards 0 by
        one block): a lasting offset, such as new ids scored below the click rate, is removed,
        while a swing that reverses (a daily cycle) is averaged out instead of followed one block
        late, which would make the next block's error larger (measured: benchmarks/README.md)."""
        a, b = candidate.calibration
        k = candidate.intercept_corrections + 1
        _move_intercept(candidate, a * raw + b, y, gain=max(self.cfg.intercept_gain, 1.0 / (k + 1)))
        candidate.intercept_corrections = k

    def _refit_intercept(
        self, candidate: TorchLearner, hold: EncodedBatch, y_hold: np.ndarray, clicks: np.ndarray | None
    ) -> float:
        """Set the candidate's intercept to the one its holdout logits, after it learned the
        holdout, fit best (``trainer.refit_intercept``): one parameter's exact optimum on the block's
        newest rows, where the last optimizer steps had left it wherever their noise stopped. Returns
        how far it moved (logits)."""
        a, b = candidate.calibration
        return _move_intercept(candidate, a * _rows(candidate.click_logits(hold), clicks) + b, y_hold)

    def _next_blend(
        self, blend: BaseRateBlend | None, end: float, y: np.ndarray, p_hold: np.ndarray, y_hold: np.ndarray
    ) -> BaseRateBlend | None:
        """The mixture an accepted candidate starts from (:mod:`trainers.base_rate_blend`): its
        champion's ``blend`` with ``end``, the log odds it reached over the block it served, and
        the block's labels ``y`` added to the rate; after a champion without one (the first
        block's untrained model, a version published before, one handed in), what the candidate's
        holdout scores ``p_hold`` say (:meth:`BaseRateBlend.first`)."""
        clamp = self.cfg.base_rate_blend_clamp
        if clamp <= 0:
            return None
        if blend is None:
            return BaseRateBlend.first(y[: len(y) - len(y_hold)], p_hold, y_hold, clamp=clamp)
        return blend.next_version(end, y)

    def _follow_alias(self) -> str | None:
        """Adopt the alias's version if someone else moved it off ours; the adopted version or None."""
        if self.store is None:
            return None
        found = adopt_moved_alias(self.store, self.alias, self.champion_version)
        if found is None:
            return None
        self.champion, self.has_champion = found, True
        self._champion_auc = None  # not measured here: no corrupt-label check until it is
        return str(found.version)

    def _move_alias(self, version: str, gated_against: str | None) -> bool:
        assert self.store is not None
        return move_alias_unless_moved(self.store, self.alias, version, gated_against)

    def _lineage(self, report: BlockReport, n_train: int) -> dict[str, Any]:
        return {
            "block": report.index,
            "position": report.position,
            "examples_after_position": len(self._buffer),  # received, covered by position, not in this block
            "event_time_min": report.event_time_min,
            "event_time_max": report.event_time_max,
            "examples": report.examples,
            "positives": report.positives,
            "train_examples": n_train,
            "holdout_examples": report.examples - n_train,
            "parent_version": report.parent_version or "none",
            "gate_reason": report.decision.reason,
            "model": self.cfg.model,
        } | ({"corrections": report.corrections} if self.learns_conversions else {})


def _block_times(block: Sequence[LabelledExample]) -> np.ndarray:
    """Each example's place in time in its block: its impression's time; a correction's, the time of
    the click example it arrived after (module docstring)."""
    ts = np.empty(len(block), dtype=np.int64)
    last = next((ex.impression.ts for ex in block if not ex.correction), 0)
    for i, ex in enumerate(block):
        if not ex.correction:
            last = ex.impression.ts
        ts[i] = last
    return ts


def _move_intercept(learner: TorchLearner, z: np.ndarray, y: np.ndarray, gain: float = 1.0) -> float:
    """Move ``learner``'s calibration intercept by ``gain`` times the shift its calibrated logits
    ``z`` miss the labels ``y`` by (:func:`~trainers.calibration.fit_shift`); the move, in logits."""
    a, b = learner.calibration
    shift = gain * fit_shift(z, y)
    learner.calibration = (a, b + shift)
    return shift


def _rows(values: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """``values[rows]``; all of them when ``rows`` is None (no correction in the block)."""
    return values if rows is None else values[rows]
