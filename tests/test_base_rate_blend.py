"""trainers/base_rate_blend.py: the served mixture of the model and the running base rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.core.events import LabelledExample
from serving_bridge.online_offset import shift_probabilities
from tests.test_online_residual import ITEMS, replica_on_board
from trainers.base_rate_blend import BaseRateBlend, _running
from trainers.incremental import BlockScores, IncrementalTrainer
from trainers.metrics import example_loglosses, normalized_entropy
from trainers.online_offset import LiveServing
from trainers.testing import InMemoryModelStore, small_trainer_config, synthetic_examples


def test_the_expert_that_predicted_better_gains_weight_up_to_the_clamp() -> None:
    y = np.zeros(200)
    y[::20] = 1.0  # 5% clicks
    start = BaseRateBlend(0.0, 5.0, 100.0)
    good = start.learn(np.where(y == 1, 0.5, 0.02), y, clamp=10)
    bad = start.learn(np.full(200, 0.4), y, clamp=10)
    assert good.weight > 0.5 > bad.weight
    assert (good.clicks, good.rows) == (5.0, 100.0)  # a block's rate is the blocks' before it
    nxt = good.next_version(-2.0, y)
    assert (nxt.log_odds, nxt.clicks, nxt.rows) == (-2.0, 15.0, 300.0)
    # the first version: its holdout's evidence if it favours it, else even odds; the block's rate
    assert BaseRateBlend.first(y[:100], np.full(100, 0.5), y[100:], clamp=10) == BaseRateBlend(0, 10, 200)
    knows = BaseRateBlend.first(y[:100], np.where(y[100:] == 1, 0.5, 0.01), y[100:], clamp=10)
    assert knows.log_odds > 3.0 and (knows.clicks, knows.rows) == (10.0, 200.0)
    assert start.learn(np.full(200, 0.9), y, clamp=3).log_odds == -3.0
    assert start.learn(np.array([]), np.array([]), clamp=3) == start


def test_the_clamped_running_sum_is_the_row_by_row_one() -> None:
    rng = np.random.default_rng(11)
    for drift, scale, clamp, start in ((0.0, 1.0, 3.0, 0.0), (0.05, 0.3, 2.0, -2.0), (-0.2, 2.0, 1.0, 5.0)):
        gains = drift + scale * rng.normal(size=5_000)  # walks that hit both barriers, many times
        acc, naive = min(clamp, max(-clamp, start)), []
        for g in gains:
            naive.append(acc)
            acc = min(clamp, max(-clamp, acc + g))
        naive.append(acc)
        np.testing.assert_allclose(_running(start, gains, clamp), naive, rtol=0, atol=1e-9)
    assert _running(1.0, np.array([]), 3.0).tolist() == [1.0]


def test_per_row_the_mixture_loses_at_most_log_2_to_the_better_expert() -> None:
    """Vovk's bound for log loss: cumulative loss <= the better expert's + log 2 (no clamp reached)."""
    rng = np.random.default_rng(0)
    for signal in (0.0, 0.5, 2.0):  # a model worse than, about as good as, and better than the rate
        x = rng.normal(size=3_000)
        y = (rng.random(3_000) < 1 / (1 + np.exp(-(-3.0 + signal * x)))).astype(float)
        p_model = 1 / (1 + np.exp(-(-3.0 + 1.5 * x)))  # right sign, wrong strength
        blend = BaseRateBlend(0.0, 5.0, 100.0)
        mix = model = base = 0.0
        for i in range(len(y)):
            served = blend.apply(p_model[i : i + 1])
            mix += float(example_loglosses(y[i : i + 1], served)[0])
            model += float(example_loglosses(y[i : i + 1], p_model[i : i + 1])[0])
            base += float(example_loglosses(y[i : i + 1], np.array([blend.base_rate]))[0])
            blend = blend.learn(p_model[i : i + 1], y[i : i + 1], clamp=1e9)
        assert mix <= min(model, base) + math.log(2) + 1e-9


def test_block_weights_use_only_the_labels_final_before_each_stretch() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(5_000) < 0.05).astype(float)
    p = np.where(y == 1, 0.3, 0.03)  # a model that knows
    t = np.arange(5_000) * 10  # one impression every 10 ms
    start = BaseRateBlend(-1.0, 50.0, 1_000.0)
    w, end = start.block_weights(p, y, t, delay_ms=2_000, every=500, clamp=10)
    assert end == start.learn(p, y, clamp=10).log_odds == 10.0
    assert (w[:500] == start.weight).all()  # nothing final yet at 0; 20 rows at 500
    for s in range(500, 5_000, 500):  # stretch s: the labels of impressions 2 s before it
        known = s - 200
        assert (w[s : s + 500] == start.learn(p[:known], y[:known], clamp=10).weight).all()
    blind, _ = start.block_weights(p, y, t, delay_ms=None, every=500, clamp=10)
    assert (blind == start.weight).all()


def test_apply_keeps_the_order_and_stays_between_model_and_rate() -> None:
    b = BaseRateBlend(-1.0, 3.0, 99.0)
    p = np.array([0.001, 0.01, 0.2, 0.9])
    q = b.apply(p)
    assert (np.diff(q) > 0).all()
    assert ((q - p) * (b.base_rate - p) >= 0).all() and (np.abs(q - p) <= np.abs(b.base_rate - p)).all()


def test_spec_round_trip() -> None:
    b = BaseRateBlend(2.5, 7.0, 1_000.0)
    assert BaseRateBlend.from_spec(b.to_list()) == b
    assert BaseRateBlend.from_spec(None) is None


def noise_stream(n: int, seed: int = 5) -> list[LabelledExample]:
    """The synthetic examples with their labels redrawn at 3%, independent of every feature."""
    rng = np.random.default_rng(seed)
    labels = rng.random(n) < 0.03
    return [
        LabelledExample(ex.impression, int(y), ex.label_ts, ex.stream_features)
        for ex, y in zip(synthetic_examples(n, seed=seed), labels, strict=True)
    ]


def run(data: list[LabelledExample], **cfg: object) -> tuple[list[BlockScores], IncrementalTrainer]:
    scores: list[BlockScores] = []
    trainer = IncrementalTrainer(
        small_trainer_config(**cfg),
        InMemoryModelStore(),
        on_scores=scores.append,
        label_delay_ms=0,
        serves_offset=True,
    )
    trainer.add(data)
    return scores, trainer


def pooled(scores: list[BlockScores], key: str = "online") -> tuple[np.ndarray, np.ndarray]:
    later = [s for s in scores if s.index >= 2]
    return np.concatenate([s.labels for s in later]), np.concatenate([s.scores[key] for s in later])


def test_on_a_stream_without_signal_the_served_scores_move_to_the_base_rate() -> None:
    data = noise_stream(12_000)
    blended, trainer = run(data)
    own, _ = run(data, base_rate_blend_clamp=0.0)
    champion = trainer.champion
    assert champion is not None and champion.blend is not None
    assert champion.blend.weight < 0.5  # the rate predicted better than the model
    trainer.add(noise_stream(13_000)[12_000:])  # half the next block: the mixture moves on
    live = trainer.live_residual()
    assert live is not None and live.blend is not None
    assert live.blend.base_rate == champion.blend.base_rate and live.blend != champion.blend
    # the rows behind its rate: block 1 and each block a version served before it was published
    assert champion.blend.rows == pytest.approx(2_000 * int(champion.version or 0))
    y, p = pooled(blended)
    y_own, p_own = pooled(own)
    assert np.array_equal(y, y_own)
    assert normalized_entropy(y, p) < normalized_entropy(y_own, p_own)
    # within a stretch of online_offset_every rows the mixture is one increasing map: the model's order
    every = trainer.cfg.online_offset_every
    for b, o in zip(blended[1:], own[1:], strict=True):
        for s in range(0, len(b.labels), every):
            mixed, model = b.scores["online"][s : s + every], o.scores["online"][s : s + every]
            assert (np.diff(mixed[np.argsort(model, kind="stable")]) >= 0).all()  # ties: float32 scores


def test_on_a_stream_with_signal_the_model_serves_its_own_scores() -> None:
    data = synthetic_examples(8_000, seed=4)
    blended, trainer = run(data)
    own, _ = run(data, base_rate_blend_clamp=0.0)
    champion = trainer.champion
    assert champion is not None and champion.blend is not None
    assert champion.blend.weight > 0.9999
    y, p = pooled(blended)
    _, p_own = pooled(own)
    # block 2 starts at even odds (its first stretch is half the rate); from its end on, the model's
    assert np.abs(p - p_own)[blended[1].labels.size :].max() < 1e-4
    assert normalized_entropy(y, p) < normalized_entropy(y, p_own) + 0.01


def test_a_replica_mixes_after_the_online_offset_as_the_version_says() -> None:
    store, learner, board, replica, model = replica_on_board()  # a version without a blend
    items = ITEMS
    learner.blend = BaseRateBlend(-1.0, 10.0, 500.0)
    store.models["2"] = learner
    store.aliases["champion"] = "2"
    replica.check_once()
    board.put(LiveServing("2", 0.3))
    replica.read_offset()
    served = np.array(replica.score("u_1", {}, items).probabilities)
    np.testing.assert_allclose(served, learner.blend.apply(shift_probabilities(model, 0.3)), rtol=1e-12)
    live = BaseRateBlend(2.0, 10.0, 500.0)  # the trainer's, while the block fills: it wins
    board.put(LiveServing("2", 0.3, None, live))
    replica.read_offset()
    served = np.array(replica.score("u_1", {}, items).probabilities)
    np.testing.assert_allclose(served, live.apply(shift_probabilities(model, 0.3)), rtol=1e-12)
