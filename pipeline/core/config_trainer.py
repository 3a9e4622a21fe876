"""The ``[trainer]`` section of :class:`pipeline.core.config.Config`: the model, its optimizers, the
blocks and the gate.

Its own module only to keep ``config.py`` small; import it from :mod:`pipeline.core.config`.
"""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipeline.core.config_types import (
    CHECKED,
    Count,
    Device,
    GateConfidence,
    ModelName,
    Natural,
    NewValues,
    NonNegative,
    OpenShare,
    Positive,
    RowOptimizer,
    Section,
    SequenceLength,
    Share,
)

__all__ = ["TrainerConfig"]


@dataclass(config=CHECKED, repr=False)
class TrainerConfig(Section):
    # deepfm | dcnv2 | lr | din (needs features.sequence_length > 0) | esmm (clicks and conversions,
    # trainers.multitask: needs joiner.conversion_window_s > 0)
    model: ModelName = "deepfm"
    # din: the newest entries of the user's behaviour sequence it attends over (the examples carry
    # up to features.sequence_length of them)
    sequence_length: SequenceLength = 20
    train_every: Count = 100_000  # labelled examples per block
    batch_size: Count = 512  # examples per optimizer step (512 beats 2,048 on 100k blocks: more steps)
    # A block of fewer than min_steps * batch_size rows is learned in min_steps smaller batches (its
    # holdout in the same batches), none under min_batch_size: an 18k-row block of a Criteo-layout log
    # had been 35 steps (underfit, FTRL ahead), a 2k-row block of a real log 4; 0 = always batch_size
    min_steps: Natural = 128
    min_batch_size: Count = 56  # smaller steps are noise (Avazu's 2k blocks: 56 beats 14)
    batch_size_cuda: Natural = 0  # examples per step on CUDA; 0 = batch_size (raise only with the lrs)
    hash_buckets: Count = 1 << 20  # rows of the hashed embedding table
    embedding_dim: Count = 16
    min_count: Natural = 0  # a hashed value gets its own embedding vector once seen this often; 0 = always
    # a value training never saw: "field_mean" scores as its field's mean row (first-order weight and
    # vector) over the last block's traffic, and starts learning from it; "fresh": a new row (weight
    # 0, a small random vector). Unused with min_count > 0. Chosen on the quality suite (README)
    new_values: NewValues = "field_mean"
    # each dense input read clamped to the range of the blocks learned (trainers.dense_range): an
    # input training saw only at 0 (the item counters of the first block) adds nothing instead of its
    # untrained weights; no extrapolation past the values learned. Chosen on the quality suite (README)
    clamp_dense: bool = True
    hidden: tuple[Count, ...] = (128, 64)  # the MLP layers of DeepFM and DCN-V2 (each tower of ESMM)
    lr_dense: Positive = 1e-3  # Adam on the dense parameters
    # Hashed tables, row-wise: adagrad = per-coordinate rate lr / (beta + sqrt(sum g^2)) (FTRL's) | adam
    sparse_optimizer: RowOptimizer = "adagrad"  # the embedding vectors
    lr_sparse: Positive = 0.05
    sparse_beta: Positive = 1.0  # AdaGrad: smooths a new row's rate (FTRL's beta); Adam: unused
    wide_optimizer: RowOptimizer = "adagrad"  # the linear part: first-order weights, dense weights, bias
    lr_wide: Positive = 0.05
    wide_beta: Positive = 1.0
    adagrad_decay: Share = 1.0  # AdaGrad sums forget at this rate per step a row is used; 1 = never
    wide_l1: NonNegative = 1.0  # ftrl: L1 of the linear part (a value stays at 0 until |z| > l1)
    wide_l2: NonNegative = 1.0  # ftrl: L2 of the linear part
    epochs_per_block: Count = 1
    shuffle: bool = True  # learn a block in seeded random order; false = in event-time order
    holdout_fraction: OpenShare = 0.1  # the newest share of a block held out for the gate
    calibrate: bool = False  # Platt-scale each candidate on its champion's progressive scores (hurt: README)
    # shift each candidate's output intercept by what its holdout (scored before it learns it) says
    # its logits miss the observed click rate by (trainers.calibration.fit_shift; README: measured)
    shift_on_holdout: bool = False
    # after an accepted candidate learned its holdout, its output intercept is refitted there
    # (trainers.calibration.fit_shift on its own holdout logits): the newest tenth of the block is
    # the nearest to the next one, and its last small steps no longer leave the intercept where
    # they happened to stop (a Criteo-layout log's blocks had swung 0.48-1.15). Chosen on the suite.
    # The gate then judges the candidate with its intercept refitted, cross-fitted over the holdout
    # (trainers.calibration.cross_fitted_shift): as it would be served
    refit_intercept: bool = True
    # each candidate's intercept moves by what the served scores missed the block's click rate by
    # (its older part), at gain 1/(k+1) for the k-th block, never below this: the running mean of
    # the offsets (trainers.incremental); 0 = off. Chosen on the quality suite (benchmarks/README.md)
    intercept_gain: Share = 0.1
    # the served version's intercept follows the labels joined for it during its block: the trainer
    # fits it (trainers.online_offset) and publishes it, replicas add it to the logit, backtests
    # score with it. Refitted every online_offset_every examples over the block's newest
    # online_offset_recent labelled ones. Chosen on the quality suite (benchmarks/README.md)
    online_offset: bool = True
    online_offset_every: Count = 1_000
    online_offset_recent: Count = 20_000
    # and the served version's residual: FTRL-Proximal over the ids and a bias, learned on the
    # labels joined during its block on top of the served logit (model + online offset), published
    # with the offset, added by replicas and backtests (trainers.online_residual); backtests score
    # with it at the offset's pace. Chosen on the quality suite (benchmarks/README.md)
    online_residual: bool = True
    # the served probability mixes the model (with offset and residual) and the running click rate,
    # weighted by their log loss so far, following the labels joined during the block at the
    # offset's pace (trainers.base_rate_blend): where the features carry no signal it is never much
    # worse than the rate alone. The mixture's log odds are clamped to +-this many nats (what it
    # costs to follow a change of which is better); 0 = off. Chosen on the quality suite (README)
    base_rate_blend_clamp: NonNegative = 10.0
    learn_holdout: bool = True  # an accepted candidate then learns its holdout before it is published
    gate_tolerance: float = 0.01  # candidate logloss may exceed the champion's by this fraction
    # ... and by what chance explains on the holdout: the one-sided bound, at this confidence, of the
    # mean paired per-example logloss difference (trainers.gate.paired_allowance); 0.5 = the point
    # estimates alone. A refused block is never learned, so a refusal needs evidence (README)
    gate_confidence: GateConfidence = 0.95
    # esmm: and its conversion logloss (pCTCVR on the holdout's rows of known conversion) the
    # champion's by this fraction (negative: it must win by that much); a holdout without a
    # conversion skips that check
    conversion_gate_tolerance: float = 0.01
    # a block on which the champion's progressive AUC falls below this is refused as corrupt (flipped
    # labels): drift lowers AUC toward 0.5, it does not invert it. 0 turns the check off.
    min_champion_auc: Share = 0.45
    device: Device = "auto"  # auto | cpu | cuda
    # processes that train together on this host (data parallel, trainers/sharding.py): each holds
    # 1/ranks of every hashed table's rows and learns its part of each step; `ctr trainer` and
    # `ctr backtest` start them (pipeline/ops/ranks.py; one GPU each on CUDA). 1 = one process
    ranks: Count = 1
    seed: int = 7
    # torch CPU threads; 0 = auto: half the cores (at least 1). The trainer shares its host with the
    # consumer thread and, on small machines, the other daemons: torch's default (one per core)
    # oversubscribes the CPU and its spinning OpenMP workers made a block 3-30x slower under load.
    threads: Natural = 0
