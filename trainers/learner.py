"""A torch CTR model that learns blocks of labelled examples and predicts click probabilities.

:class:`TorchLearner` implements :class:`pipeline.core.types.Learner`. One code path for every device:
on CUDA the inputs of a block are copied once from pinned memory (non-blocking) and the forward pass
runs under bf16 autocast; on CPU both are no-ops and training is deterministic for a seed (shuffling
comes from ``numpy.random.default_rng([seed, blocks_learned])``, initial weights from
``torch.manual_seed(seed)``, and no op with a random component is used).

Each part of the model gets the optimizer its role needs (:func:`_make_optimizers`): the linear part
(first-order table, dense-input weights, output bias) per-coordinate AdaGrad at FTRL's rates, the
embedding vectors row-wise AdaGrad (or lazy Adam), both from :mod:`trainers.rowwise` (only the rows
a batch used are touched, so a step costs O(batch) whatever the table's size), the MLP Adam. The
loss is summed over a batch, so those rates are per example as in FTRL. The output bias starts at
the first block's base rate and the deep part's last layer at 0: a new model predicts the base
rate, not 0.5, and adds its interactions as it learns them (benchmarks/README.md: learning
quality). The hot loop never reads a
value back to the host: the block's loss is summed on the device and read once at the end.
The device decisions are small functions (:func:`autocast_dtype`, :func:`pins_host_memory`,
:func:`step_batch_size`) so that a CPU-only test covers the CUDA choices too.

A multi-task model (ESMM, :mod:`trainers.multitask`) learns clicks and conversions: the click loss
over the rows that are not corrections, pCTCVR's over the rows of known conversion; a single-task
model skips corrections (it would learn their clicks twice). :meth:`TorchLearner.predict` is the
click probability for every model; a multi-task learner also has :meth:`TorchLearner.predict_tasks`
and :meth:`TorchLearner.predict_request_tasks`, ``(n, 2)`` [pCTR, pCVR].

A learner saves to a folder: ``weights.pt`` (``torch.save`` of state dicts only, loaded back with
``weights_only=True``, so loading never unpickles code) and ``spec.json`` (encoder schema, model
spec, trainer config).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression, LabelledExample
from trainers.base_rate_blend import BaseRateBlend
from trainers.calibration import IDENTITY, apply_platt
from trainers.dense_range import DenseRange
from trainers.encoding import EncodedBatch, Encoder, Row
from trainers.inference import INFERENCE_PATHS, Scorer, frozen_scorer, load_scorer, save_scorer
from trainers.models import HashedEmbedding, build_model, model_spec
from trainers.multitask import TaskTargets, conversions_to_learn, start_cvr_at_base_rate, task_probabilities
from trainers.rowwise import LinearAdagrad, LinearFtrl, RowwiseAdagrad, RowwiseAdam, RowwiseFtrl
from trainers.sharding import (
    RowSharding,
    building,
    full_state_dict,
    map_optimizer_state,
    shard_tables,
    sum_replicated_grads,
)

__all__ = [
    "FORMAT",
    "Examples",
    "TorchLearner",
    "autocast_dtype",
    "config_from_dict",
    "cpu_threads",
    "pins_host_memory",
    "resolve_device",
    "step_batch_size",
]

FORMAT = "ctr-online/torch-learner/1"
SCORER_FILE = "scorer.pt"  # save_for_serving: the traced forward beside weights.pt
TASKS_SCORER_FILE = "scorer_tasks.pt"  # and a multi-task model's traced task_logits
_PREDICT_CHUNK = 65_536  # rows per forward pass when scoring: bounds activation memory

# What learn/predict accept: labelled examples, (impression, stream_features) rows, a pair
# (impressions, stream_features) of equal length, or an already-encoded batch.
Examples = (
    Sequence[LabelledExample]
    | Sequence[Row]
    | tuple[Sequence[Impression], Sequence[Mapping[str, float]]]
    | EncodedBatch
)


def resolve_device(name: str) -> torch.device:
    """``auto`` = CUDA when torch sees a GPU, else CPU; ``cpu``/``cuda``/``cuda:N`` as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"TrainerConfig.device={name!r} but torch sees no CUDA device")
    return dev


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The forward pass's autocast dtype: bf16 on CUDA (no loss scaling needed), None (fp32) on CPU.

    >>> autocast_dtype(torch.device("cuda")), autocast_dtype(torch.device("cpu"))
    (torch.bfloat16, None)
    """
    return torch.bfloat16 if device.type == "cuda" else None


def pins_host_memory(device: torch.device) -> bool:
    """Copy inputs through pinned host memory (non-blocking)? Only when they go to a GPU."""
    return device.type == "cuda"


def step_batch_size(cfg: TrainerConfig, device: torch.device, block_rows: int = 0) -> int:
    """Examples per optimizer step: ``cfg.batch_size_cuda`` on CUDA when set, else ``cfg.batch_size``;
    smaller when a block of ``block_rows`` would otherwise be learned in fewer than ``cfg.min_steps``,
    but not under ``cfg.min_batch_size`` (nor over the configured size).

    >>> cpu, cfg = torch.device("cpu"), TrainerConfig()
    >>> [step_batch_size(cfg, cpu, rows) for rows in (90_000, 18_000, 1_800)]
    [512, 141, 56]
    """
    bs = cfg.batch_size_cuda if device.type == "cuda" and cfg.batch_size_cuda > 0 else cfg.batch_size
    if cfg.min_steps and block_rows:
        bs = min(bs, max(cfg.min_batch_size, math.ceil(block_rows / cfg.min_steps)))
    return bs


def cpu_threads(cfg: TrainerConfig) -> int:
    """torch CPU threads for a learner: ``cfg.threads``, or half the cores (at least 1) when 0.

    >>> cpu_threads(TrainerConfig(threads=3))
    3
    >>> cpu_threads(TrainerConfig()) == max(1, (os.cpu_count() or 2) // 2)
    True
    """
    return cfg.threads if cfg.threads > 0 else max(1, (os.cpu_count() or 2) // 2)


def config_from_dict(d: Mapping[str, Any]) -> TrainerConfig:
    """Rebuild a TrainerConfig saved with ``dataclasses.asdict``; unknown keys (newer code) are dropped."""
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    kwargs = {k: v for k, v in d.items() if k in fields}
    if "hidden" in kwargs:
        kwargs["hidden"] = tuple(int(h) for h in kwargs["hidden"])
    return TrainerConfig(**kwargs)


Optimizers = tuple[torch.optim.Optimizer | None, ...]


def _make_optimizers(model: nn.Module, cfg: TrainerConfig) -> Optimizers:
    """``(wide table, linear part, embedding vectors, the rest)``: one optimizer per role, or None.

    The linear (wide) part is the first-order table ``model.wide``, the dense inputs' weights and
    the output bias (``model.linear_parameters()``): with ``wide_optimizer="adagrad"`` each of its
    coordinates learns at FTRL's per-coordinate rate ``lr_wide / (wide_beta + sqrt(n))``, which is
    what online logistic regression wins with (the stream features' weights and the base rate adapt
    within a block, where Adam at lr_dense took hundreds of steps). The embedding vectors get
    ``sparse_optimizer`` (row-wise), every other weight (MLP, cross layers) Adam at ``lr_dense``.
    """
    # first-order tables: the click model's, and a multi-task model's conversion tower's
    tables = [getattr(model, name, None) for name in ("wide", "cvr_wide")]
    wide = [p for t in tables if isinstance(t, nn.Module) for p in t.parameters()]
    linear_of = getattr(model, "linear_parameters", None)
    linear = list(linear_of()) if callable(linear_of) else []
    taken = {id(p) for p in wide + linear}
    sparse = [
        p
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m.sparse
        for p in m.parameters()
        if id(p) not in taken
    ]
    taken |= {id(p) for p in sparse}
    dense = [p for p in model.parameters() if id(p) not in taken]
    ftrl = {"lr": cfg.lr_wide, "beta": cfg.wide_beta, "l1": cfg.wide_l1, "l2": cfg.wide_l2}
    linear_opt: torch.optim.Optimizer | None = None
    if linear:
        linear_opt = (
            LinearFtrl(linear, **ftrl)
            if cfg.wide_optimizer == "ftrl"
            else LinearAdagrad(linear, lr=cfg.lr_wide, beta=cfg.wide_beta, decay=cfg.adagrad_decay)
            if cfg.wide_optimizer == "adagrad"
            else torch.optim.Adam(linear, lr=cfg.lr_dense)
        )
    wide_opt = RowwiseFtrl(wide, **ftrl) if wide and cfg.wide_optimizer == "ftrl" else None
    return (
        wide_opt or _rowwise(cfg.wide_optimizer, wide, cfg.lr_wide, cfg.wide_beta, cfg.adagrad_decay),
        linear_opt,
        _rowwise(cfg.sparse_optimizer, sparse, cfg.lr_sparse, cfg.sparse_beta, cfg.adagrad_decay),
        # fused: one kernel for all dense tensors and its step counters stay on the device
        # (the default loop reads each counter back with .item() every step).
        torch.optim.Adam(dense, lr=cfg.lr_dense, fused=True) if dense else None,
    )


def _rowwise(
    kind: str, params: list[nn.Parameter], lr: float, beta: float, decay: float
) -> torch.optim.Optimizer | None:
    """The row-wise optimizer of one group of hashed tables (None for no tables)."""
    if not params:
        return None
    if kind == "adagrad":
        return RowwiseAdagrad(params, lr=lr, beta=beta, decay=decay)
    return RowwiseAdam(params, lr=lr)


def _is_pair(data: Any) -> bool:
    """``(impressions, stream_features)`` rather than a 2-tuple of rows or examples?"""
    return (
        isinstance(data, tuple)
        and len(data) == 2
        and isinstance(data[0], Sequence)
        and isinstance(data[1], Sequence)
        and all(isinstance(x, Impression) for x in data[0][:1])
        and all(isinstance(x, Mapping) for x in data[1][:1])
    )


class TorchLearner:
    """A CTR model (``MODELS[cfg.model]``) with its encoder, optimizers and device."""

    def __init__(
        self,
        cfg: TrainerConfig,
        encoder: Encoder,
        model: nn.Module | None = None,
        *,
        device: str | None = None,
        shard: bool = True,
    ) -> None:
        """``shard=False``: hold the whole tables even under torchrun (a copy to publish)."""
        if not encoder.fitted:
            raise ValueError("TorchLearner: the encoder is not fitted; fit it on the first block")
        if model is None and cfg.model == "din" and not encoder.sequence_length:
            raise ValueError("TorchLearner: din reads the behaviour sequence: use Encoder.for_trainer(cfg)")
        self.cfg = cfg
        self.encoder = encoder
        # Under torchrun (a default process group of 2+ ranks), this rank holds its share of every
        # hashed table's rows and learns its part of each step's batch (trainers.sharding).
        self.sharding = RowSharding.of_default_group() if shard else None
        self.device = resolve_device(device or cfg.device)
        self._pin = pins_host_memory(self.device)
        self._amp_dtype = autocast_dtype(self.device)
        if model is None:
            spec = model_spec(
                cfg.model,
                n_fields=len(encoder.fields),
                n_dense=len(encoder.dense_names),
                hash_buckets=encoder.hash_buckets,
                embedding_dim=cfg.embedding_dim,
                hidden=cfg.hidden,
                min_count=cfg.min_count,
                new_values=cfg.new_values,
                sequence_length=encoder.sequence_length,
                dense_range=cfg.clamp_dense,
            )
            # Seeded init without disturbing the caller's global RNG stream; sharded, each rank
            # draws the whole model's numbers and keeps its rows of the tables.
            with torch.random.fork_rng(devices=[]), building(self.sharding):
                torch.manual_seed(cfg.seed)
                model = build_model(spec)
        self.model = model.to(self.device)
        if self.sharding is not None:
            shard_tables(self.model, self.sharding)
        self.blocks_learned = 0  # learn() calls so far; seeds each block's shuffle
        self.steps = 0  # optimizer steps so far
        self.version: str | None = None  # the registry version these weights are, if any
        self._wide_opt, self._linear_opt, self._sparse_opt, self._dense_opt = _make_optimizers(
            self.model, cfg
        )
        self.frozen = False
        self.calibration: tuple[float, float] = IDENTITY  # Platt (a, b) applied by predict
        self.intercept_corrections = 0  # blocks whose offset moved calibration's b (intercept_gain)
        # the served mixture with the base rate (trainers.base_rate_blend): applied by whoever serves
        # (replicas, the pyfunc, backtests) after the online offset; None = the model's own
        self.blend: BaseRateBlend | None = None
        self._scorer: Scorer | None = None  # the traced forward of use_inference; None: eager
        self._task_scorer: Scorer | None = None  # a multi-task model's traced task_logits

    @property
    def model_spec(self) -> dict[str, Any]:
        return dict(self.model.spec)  # type: ignore[arg-type]

    @property
    def multi_task(self) -> bool:
        """Does the model learn conversions too (``task_logits``; :mod:`trainers.multitask`)?"""
        return callable(getattr(self.model, "task_logits", None))

    # -- training --------------------------------------------------------------------------------
    def learn(self, examples: Examples, *, widen_range: bool = True, block_rows: int = 0) -> float:
        """One pass (``epochs_per_block``) over ``examples`` in seeded random order; mean loss (per
        row; a multi-task model's sums its two losses). A single-task model skips corrections.

        ``widen_range=False``: the dense inputs' range (:mod:`trainers.dense_range`) stays as it was:
        the gate's holdout, learned after the block for recency, is the block's newest tenth, about
        ten steps; an input first seen varying there (the item counters of a stream's first block,
        which fill up as its last minutes come) would get a weight from those few steps, and
        extrapolate on the next block as an untrained one does (measured: benchmarks/README.md).

        ``block_rows``: the rows of the block ``examples`` belong to, for the step size
        (:func:`step_batch_size`); a holdout passes its block's training rows, so that it is learned
        in the block's batches. 0: ``examples`` are the block."""
        if self.frozen:
            raise RuntimeError("TorchLearner.learn: this learner is frozen (a static reference copy)")
        multi = self.multi_task
        batch = self.encode(examples)
        batch = batch if multi else batch.without_corrections()
        targets_y = batch.labels
        if targets_y is None:
            raise ValueError("TorchLearner.learn: examples carry no labels")
        n = len(batch)
        if n == 0:
            return float("nan")
        self.use_inference("eager")  # a traced graph holds the weights as they were: drop it
        clicks = batch.click_rows()
        if self.blocks_learned == 0 and self.steps == 0:
            self._start_at_base_rate(targets_y if clicks is None else targets_y[clicks])
        targets = None
        forward: Scorer = self.model
        if multi:
            start_cvr_at_base_rate(self.model, targets_y, batch.conversions)
            learnt = conversions_to_learn(self.model, batch.conversions)
            conv = None if learnt is None else self._put(learnt)
            weights = None if clicks is None else self._put(clicks.astype(np.float32))
            targets, forward = TaskTargets(conv, weights), cast(Scorer, self.model.task_logits)
        ids, dense, labels = self._put(batch.ids), self._put(batch.dense), self._put(targets_y)
        tables = [m for m in self.model.modules() if isinstance(m, HashedEmbedding)]
        for table in tables:
            table.admit(ids)  # this block's values count from now on; new ones start warm
        if widen_range and isinstance(dense_range := getattr(self.model, "dense_range", None), DenseRange):
            dense_range.observe(dense)  # the inputs' range now includes this block's
        rng = np.random.default_rng([self.cfg.seed, self.blocks_learned])
        bs = step_batch_size(self.cfg, self.device, block_rows or n)
        total = torch.zeros((), device=self.device)
        self.model.train()
        for _ in range(self.cfg.epochs_per_block):
            # In event-time order the newest examples move the weights last (recency, as an online
            # learner has it); shuffled, a block is learned as a whole.
            perm = self._put(rng.permutation(n) if self.cfg.shuffle else np.arange(n))
            for start in range(0, n, bs):
                idx = perm[start : start + bs]
                if self.sharding is not None:  # this rank's part of the step's batch
                    idx = self.sharding.part(idx)
                # index_select, not ids[idx]: advanced indexing was ~3x slower on CPU (profile).
                with self._autocast():
                    logits = forward(ids.index_select(0, idx), dense.index_select(0, idx))
                y = labels.index_select(0, idx)
                for opt in self._optimizers():
                    opt.zero_grad(set_to_none=True)
                # Per-example gradient sums, as FTRL uses: wide_beta is then in the units of one
                # example's gradient (Adam is invariant to the scale).
                if targets is not None:  # multi-task: summed; sharded, the ranks' sums add up
                    loss = targets.loss(logits, y, idx)
                    loss.backward()
                    if self.sharding is not None:
                        sum_replicated_grads(self.model, self.sharding)
                elif self.sharding is None:
                    loss = F.binary_cross_entropy_with_logits(logits.float(), y) * idx.numel()
                    loss.backward()
                else:  # a rank's part may be empty: a sum, and the ranks' sums add up
                    loss = F.binary_cross_entropy_with_logits(logits.float(), y, reduction="sum")
                    loss.backward()
                    sum_replicated_grads(self.model, self.sharding)
                for opt in self._optimizers():
                    opt.step()
                # Accumulate on the device: a .item() per step would sync the GPU every batch.
                total += loss.detach()
                self.steps += 1
        for table in tables:
            table.refresh(ids)  # what a value the model has not learned reads (warm start)
        if self.sharding is not None:
            self.sharding.all_reduce_(total)
        self.blocks_learned += 1
        return float(total) / (n * self.cfg.epochs_per_block)

    # -- scoring ---------------------------------------------------------------------------------
    def predict(self, examples: Examples) -> np.ndarray:
        """Click probabilities (float64) for examples, rows, ``(impressions, stream_features)`` or a
        batch: the model's logit through its :attr:`calibration` (:mod:`trainers.calibration`)."""
        return apply_platt(self.predict_logits(examples), self.calibration)

    def predict_logits(self, examples: Examples) -> np.ndarray:
        """The model's own logits (float64), before calibration."""
        return self._score(self.encode(examples), self._scorer, self.model)

    def click_logits(self, examples: Examples) -> np.ndarray:
        """The click task's own logits (float64), before calibration, for one model or a multi-task one."""
        return self.predict_task_logits(examples)[:, 0] if self.multi_task else self.predict_logits(examples)

    def predict_tasks(self, examples: Examples) -> np.ndarray:
        """A multi-task model's ``(n, 2)`` probabilities (float64): [pCTR, pCVR], pCTR as
        :meth:`predict` gives it (calibrated), pCVR = P(conversion | click); their product is
        pCTCVR, the impression's probability of converting (:func:`trainers.multitask.task_probabilities`)."""
        return task_probabilities(self.predict_task_logits(examples), self.calibration)

    def predict_task_logits(self, examples: Examples) -> np.ndarray:
        """A multi-task model's ``(n, 2)`` logits (float64): click and conversion-after-click."""
        if not self.multi_task:
            raise TypeError(f"TorchLearner: {self.cfg.model!r} has one task (clicks): no predict_tasks")
        eager = cast(Scorer, self.model.task_logits)
        return self._score(self.encode(examples), self._task_scorer, eager, columns=2)

    def _score(
        self, batch: EncodedBatch, traced: Scorer | None, eager: Scorer, *, columns: int = 0
    ) -> np.ndarray:
        """``traced`` (else ``eager``) over ``batch`` in chunks; ``columns`` 0: one logit per row.

        A sequence model reads only the behaviour-sequence columns some row of the chunk uses
        (:meth:`EncodedBatch.without_unused_sequence`): a request for a user with 3 clicks attends
        over 3 behaviours, not ``sequence_length``."""
        out = []
        n_fields = len(self.encoder.fields) if self.encoder.sequence_length else None
        forward = traced
        if forward is None:
            self.model.eval()  # a walk over every submodule: not for the traced graph (frozen in eval)
            forward = eager
        with torch.inference_mode(), self._autocast():
            for start in range(0, len(batch), _PREDICT_CHUNK):
                part = batch[start : start + _PREDICT_CHUNK]
                if n_fields is not None:
                    part = part.without_unused_sequence(n_fields)
                logits = forward(self._put(part.ids), self._put(part.dense))
                out.append(logits.float().cpu().numpy())
        if not out:
            return np.zeros((0, columns) if columns else 0)
        return np.concatenate(out).astype(np.float64)

    def use_inference(self, path: str) -> str:
        """Score through ``path`` (``eager`` or ``torchscript``, :mod:`trainers.inference`) from
        now on; returns the path in use, ``eager`` where tracing failed. For a model that serves:
        :meth:`learn` returns to eager (the traced graph would keep the old weights)."""
        if path not in INFERENCE_PATHS:
            raise ValueError(f"TorchLearner.use_inference: {path!r} is not one of {INFERENCE_PATHS}")
        self._scorer = self._task_scorer = None
        if path == "torchscript" and self.sharding is None:  # a sharded lookup is a collective
            dims: dict[str, Any] = {
                "n_fields": self.encoder.id_columns,
                "n_dense": len(self.encoder.dense_names),
            }
            self._scorer = frozen_scorer(self.model, **dims, device=self.device, amp_dtype=self._amp_dtype)
            if self._scorer is not None and self.multi_task:  # else the tasks score eagerly too
                self._task_scorer = frozen_scorer(
                    self.model, **dims, device=self.device, amp_dtype=self._amp_dtype, tasks=True
                )
        return self.inference

    @property
    def inference(self) -> str:
        """The forward :meth:`predict` runs: ``torchscript`` while a traced graph is in use."""
        return "eager" if self._scorer is None else "torchscript"

    def predict_request(
        self,
        user_id: str,
        item_ids: Sequence[str],
        context: Mapping[str, str],
        stream_features: Sequence[Mapping[str, float]],
        dense: Sequence[Mapping[str, float]] | None = None,
    ) -> np.ndarray:
        """Serving form of one request: :meth:`predict_rows` of ``Impression(_, _, user_id, item,
        context, dense[k])`` with ``stream_features[k]`` per item (:meth:`Encoder.encode_request`)."""
        return self.predict(self.encoder.encode_request(user_id, item_ids, context, dense, stream_features))

    def predict_request_tasks(
        self,
        user_id: str,
        item_ids: Sequence[str],
        context: Mapping[str, str],
        stream_features: Sequence[Mapping[str, float]],
        dense: Sequence[Mapping[str, float]] | None = None,
    ) -> np.ndarray:
        """:meth:`predict_request` of a multi-task model with both tasks: ``(n, 2)`` [pCTR, pCVR]
        per item (:meth:`predict_tasks`; column 0 is what :meth:`predict_request` returns)."""
        return self.predict_tasks(
            self.encoder.encode_request(user_id, item_ids, context, dense, stream_features)
        )

    def predict_rows(
        self, impressions: Sequence[Impression], stream_features: Sequence[Mapping[str, float]]
    ) -> np.ndarray:
        """Serving form: one probability per impression with its point-in-time stream features."""
        if len(impressions) != len(stream_features):
            raise ValueError(
                f"predict_rows: {len(impressions)} impressions but "
                f"{len(stream_features)} stream feature dicts"
            )
        return self.predict(list(zip(impressions, stream_features, strict=True)))

    def encode(self, examples: Examples) -> EncodedBatch:
        if isinstance(examples, EncodedBatch):
            return examples
        if _is_pair(examples):
            imps, sfs = cast(tuple[Sequence[Impression], Sequence[Mapping[str, float]]], examples)
            if len(imps) != len(sfs):
                raise ValueError(f"TorchLearner: {len(imps)} impressions but {len(sfs)} feature dicts")
            return self.encoder.encode(list(zip(imps, sfs, strict=True)))
        return self.encoder.encode(examples)  # type: ignore[arg-type]

    # -- copies and persistence ------------------------------------------------------------------
    def clone(self, *, frozen: bool = False) -> TorchLearner:
        """Independent deep copy: weights, optimizer moments, counters (the encoder is shared).

        ``frozen=True`` copies the weights only (no table-sized Adam moments): a scoring-only
        reference such as the static baseline, whose ``learn`` raises.
        """
        memo: dict[int, Any] = {}
        if frozen:  # deepcopy maps anything already in memo to the memo's value: here None
            memo = {id(o): None for o in self._optimizers()}
        for scorer in (self._scorer, self._task_scorer):  # a traced graph is not copied:
            if scorer is not None:  # use_inference rebuilds one
                memo[id(scorer)] = None
        twin = copy.deepcopy(self, memo)
        if frozen:
            twin._sparse_opt = twin._wide_opt = twin._linear_opt = twin._dense_opt = None
            twin.frozen = True
        return twin

    def spec(self) -> dict[str, Any]:
        """JSON-able description: format, encoder schema, model spec, trainer config, counters."""
        return {
            "format": FORMAT,
            "encoder": self.encoder.spec(),
            "model": self.model_spec,
            "config": dataclasses.asdict(self.cfg),
            "blocks_learned": self.blocks_learned,
            "calibration": list(self.calibration),
            "intercept_corrections": self.intercept_corrections,
            "blend": None if self.blend is None else self.blend.to_list(),
            "steps": self.steps,
            "torch": torch.__version__,
        }

    def save(self, path: str | Path, *, optimizer: bool = True) -> Path:
        """Write ``weights.pt`` + ``spec.json`` into folder ``path`` (created); returns it.

        Sharded (:mod:`trainers.sharding`): every rank must call it; the tables and their optimizer
        state are gathered whole, and rank 0 writes: an unsharded learner, which loads anywhere."""
        out = Path(path)
        sharded = self.sharding is not None
        state: dict[str, Any] = {"model": full_state_dict(self.model) if sharded else self.model.state_dict()}
        if optimizer and not self.frozen:
            for key, opt in self._named_optimizers():
                saved = opt.state_dict()
                state[key] = map_optimizer_state(opt, saved, self.model, gather=True) if sharded else saved
        if self.sharding is not None and self.sharding.rank != 0:
            return out
        out.mkdir(parents=True, exist_ok=True)
        torch.save(state, out / "weights.pt")
        (out / "spec.json").write_text(json.dumps(self.spec(), indent=1, sort_keys=True))
        return out

    def save_for_serving(self, path: str | Path) -> Path:
        """:meth:`save` without the optimizer moments, plus the traced scorer (``scorer.pt``) while
        one is in use: what :meth:`load_for_serving` reads, with no tracing left to do."""
        out = self.save(path, optimizer=False)
        if self._scorer is not None:
            save_scorer(self._scorer, out / SCORER_FILE)
        if self._task_scorer is not None:
            save_scorer(self._task_scorer, out / TASKS_SCORER_FILE)
        return out

    @classmethod
    def load_for_serving(cls, path: str | Path, *, device: str | None = None) -> TorchLearner:
        """A learner written by :meth:`save_for_serving`, scoring through its saved traced scorer
        when there is one (loaded and warmed: ~3 ms, against ~20-90 ms to trace it again)."""
        learner = cls.load(path, device=device)
        dims: dict[str, Any] = {
            "n_fields": learner.encoder.id_columns,
            "n_dense": len(learner.encoder.dense_names),
            "hash_buckets": learner.encoder.hash_buckets,
            "device": learner.device,
            "amp_dtype": learner._amp_dtype,
        }
        scorer, tasks = Path(path) / SCORER_FILE, Path(path) / TASKS_SCORER_FILE
        if scorer.is_file():
            learner._scorer = load_scorer(scorer, **dims)
        if tasks.is_file() and learner._scorer is not None and learner.multi_task:
            learner._task_scorer = load_scorer(tasks, **dims)
        return learner

    def unsharded(self, scratch: str | Path) -> TorchLearner | None:
        """Sharded: the whole learner (weights, optimizer state, counters) on rank 0, None on the
        others; every rank must call it (through :meth:`save` into ``scratch``, a folder of rank
        0's). Unsharded: itself."""
        if self.sharding is None:
            return self
        self.save(scratch)
        if self.sharding.rank != 0:
            return None
        whole = TorchLearner.load(scratch, device=str(self.device), shard=False)
        whole.version = self.version
        return whole

    @classmethod
    def load(cls, path: str | Path, *, device: str | None = None, shard: bool = True) -> TorchLearner:
        """Rebuild a learner saved by :meth:`save` (``weights_only=True``: no code is unpickled);
        under torchrun it takes this rank's rows of the tables unless ``shard=False``."""
        src = Path(path)
        spec = json.loads((src / "spec.json").read_text())
        if spec.get("format") != FORMAT:
            raise ValueError(
                f"TorchLearner.load: {src} has format {spec.get('format')!r}, expected {FORMAT!r}"
            )
        cfg = config_from_dict(spec["config"])
        dev = resolve_device(device or cfg.device)
        state = torch.load(src / "weights.pt", map_location=dev, weights_only=True)
        # Build on the meta device: no time spent initialising a table about to be overwritten.
        with torch.device("meta"):
            model = build_model(spec["model"])
        model.load_state_dict(state["model"], assign=True)
        learner = cls(cfg, Encoder.from_spec(spec["encoder"]), model, device=str(dev), shard=shard)
        learner.blocks_learned = int(spec.get("blocks_learned", 0))
        learner.steps = int(spec.get("steps", 0))
        a, b = spec.get("calibration", IDENTITY)
        learner.calibration = (float(a), float(b))
        learner.intercept_corrections = int(spec.get("intercept_corrections", 0))
        learner.blend = BaseRateBlend.from_spec(spec.get("blend"))
        # Optimizer state saved before the wide table was split off does not fit: fresh moments.
        old = "wide_opt" not in state and "linear_opt" not in state
        for key, opt in learner._named_optimizers():
            if key not in state or old or (key == "dense_opt" and "linear_opt" not in state):
                continue
            saved = state[key]
            if learner.sharding is not None:  # this rank's rows of the saved whole state
                saved = map_optimizer_state(opt, saved, learner.model, gather=False)
            opt.load_state_dict(saved)
        return learner

    # -- internals -------------------------------------------------------------------------------
    def _start_at_base_rate(self, labels: np.ndarray) -> None:
        """Set the output bias to the logit of the first block's click rate (smoothed).

        A model that starts at p = 0.5 spends its first blocks learning the base rate (at 0.5% CTR
        a logit of -5.3, about 5,000 Adam steps at 1e-3): miscalibrated by 10-100x meanwhile. The
        rate is shrunk towards 1/2 by one pseudo-click and one pseudo-non-click.
        """
        bias = getattr(self.model, "output_bias", None)
        if not isinstance(bias, torch.Tensor):
            return
        rate = (float(labels.sum()) + 1.0) / (labels.size + 2.0)
        with torch.no_grad():
            bias.fill_(float(np.log(rate / (1.0 - rate))))

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for _, o in self._named_optimizers()]

    def _named_optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """``(key in weights.pt, optimizer)`` for each optimizer the model has."""
        opts = [
            ("sparse_opt", self._sparse_opt),
            ("wide_opt", self._wide_opt),
            ("linear_opt", self._linear_opt),
            ("dense_opt", self._dense_opt),
        ]
        return [(k, o) for k, o in opts if o is not None]

    def _put(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        # Pinned host memory lets the copy overlap with compute; on CPU this is the identity.
        return t.pin_memory().to(self.device, non_blocking=True) if self._pin else t

    def _autocast(self) -> AbstractContextManager[Any]:
        dtype = self._amp_dtype
        if dtype is None:  # fp32: no autocast object on every request's path
            return nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)
