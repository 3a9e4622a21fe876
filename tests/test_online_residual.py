"""The online residual (trainers.online_residual): in the engine, published live, added by replicas."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.events import LabelledExample
from serving_bridge.online_offset import MemoryOffsets, OffsetPublisher, shift_probabilities
from serving_bridge.replica import Replica
from trainers.encoding import EncodedBatch
from trainers.ftrl import FtrlLearner
from trainers.incremental import BlockScores, IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.metrics import auc
from trainers.online_offset import LiveServing
from trainers.online_residual import SparseResidual, block_residual
from trainers.testing import InMemoryModelStore, small_trainer_config, synthetic_examples, tiny_learner

DELAY_MS = 20_000  # 200 of synthetic_examples' impressions (one every 100 ms)


def turned_stream(n: int = 6_000) -> list[LabelledExample]:
    """Block 1 (2,000 examples) under one truth, then another (the users' and items' weights
    redrawn, the click rate alike): a version trained on block 1 ranks block 2 badly."""
    return synthetic_examples(2_000, seed=1) + synthetic_examples(
        n - 2_000, seed=2, start_index=2_000, truth_seed=99
    )


def run(**cfg: object) -> tuple[list, list[BlockScores]]:
    scores: list[BlockScores] = []
    trainer = IncrementalTrainer(
        small_trainer_config(**cfg), InMemoryModelStore(), on_scores=scores.append, label_delay_ms=DELAY_MS
    )
    return trainer.add(turned_stream()), scores


def test_block_residual_reads_only_labels_final_before_each_stretch():
    """Predict-then-learn: an example's residual depends only on the labels of impressions at
    least the label delay older than the first of its stretch; any other label may change."""
    rng = np.random.default_rng(0)
    n, delay, every = 3_000, 5_000, 50
    t = np.sort(rng.integers(0, 300_000, n))
    ids = rng.integers(0, 40, (n, 3))
    z = rng.normal(-2.0, 1.0, n)
    y = (rng.random(n) < 0.2).astype(np.float32)
    batch = EncodedBatch(ids, np.zeros((n, 0), np.float32))

    def residual(labels: np.ndarray) -> np.ndarray:
        return block_residual(z, labels, t, batch, hash_buckets=64, delay_ms=delay, every=every)

    base = residual(y)
    assert np.abs(base).max() > 0.05  # it learned something
    for s in (0, 400, 1_250, 2_999):
        start = s - s % every
        final = (t + delay <= t[start]) & (np.arange(n) < start)
        again = residual(np.where(final, y, 1.0 - y).astype(np.float32))
        assert again[s] == base[s]
        assert (base[s] == 0.0) == (final.sum() == 0)


def test_served_scores_learn_a_ranking_that_turned_within_the_block():
    """After the truth turns, the version trained on block 1 serves block 2 by an old ranking; the
    residual, learning the labels joined meanwhile, ranks it much better. Block 1 (no accepted
    version serves it) and the gate's champion scores are the model's either way."""
    plain, plain_scores = run(online_residual=False)
    served, served_scores = run()
    assert plain[0].online == served[0].online
    np.testing.assert_array_equal(plain_scores[0].scores["online"], served_scores[0].scores["online"])
    assert [r.champion for r in plain] == [r.champion for r in served]  # the gate: model vs model
    y = served_scores[1].labels
    late = slice(1_000, None)  # once ~800 labels of the block are final
    before = auc(y[late], plain_scores[1].scores["online"][late])
    after = auc(y[late], served_scores[1].scores["online"][late])
    assert after > before + 0.03, (before, after)  # measured 0.568 -> 0.617
    assert served[1].online["logloss"] < plain[1].online["logloss"]


def test_live_residual_is_what_the_block_serves_once_those_labels_are_final():
    """The residual the trainer publishes after receiving block 2's examples in the chunks the
    closed block learns them in is the one that block's metrics serve the next stretch with."""
    data = turned_stream(4_000)
    every = 100
    trainer = IncrementalTrainer(  # without the mixture with the base rate (test_base_rate_blend)
        small_trainer_config(online_offset_every=every, base_rate_blend_clamp=0.0),
        InMemoryModelStore(),
        label_delay_ms=DELAY_MS,
        serves_offset=True,
    )
    assert trainer.live_residual() is None  # no champion yet
    trainer.add(data[:2_000])
    champion = trainer.champion
    assert champion is not None and champion.version == "1"
    # the closed block learns, at the stretch starting at s, the examples up to t[s] - delay
    # (inclusive): 1 at s = 200, then 100 more at each stretch
    received = 0
    for upto in range(1, 802, every):
        trainer.add(data[2_000 + received : 2_000 + upto])
        received = upto
        live = trainer.live_residual()
    assert live is not None
    version, offset, residual, _ = live
    assert version == "1" and residual is not None and len(residual.coords) > 0
    scores: list[BlockScores] = []
    trainer.on_scores = scores.append
    trainer.add(data[2_000 + received :])
    block = data[2_000:4_000]
    s = received - 1 + DELAY_MS // 100  # the stretch at s learned exactly those 801
    assert s % every == 0
    rows = champion.encode(block[s : s + 1]).first_columns(len(champion.encoder.fields))
    z_s = champion.predict_logits(block[s : s + 1])[0] + champion.calibration[1]
    p_s = scores[0].scores["online"][s]
    assert np.log(p_s / (1 - p_s)) - z_s == pytest.approx(offset + residual.logits(rows)[0], abs=1e-6)


def test_sparse_residual_scores_as_its_learner_and_survives_bytes():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 500, (4_000, 4))
    y = (rng.random(4_000) < 0.1 + 0.3 * (ids[:, 0] < 50)).astype(np.float32)
    learner = FtrlLearner(512)
    learner.learn(EncodedBatch(ids, np.zeros((4_000, 0), np.float32), y), np.full(4_000, -2.0))
    sparse = SparseResidual.from_bytes(SparseResidual.of(learner).to_bytes())
    assert 0 < len(sparse.coords) < 512  # L1: only the weights that moved
    batch = EncodedBatch(ids[:300], np.zeros((300, 0), np.float32))
    np.testing.assert_allclose(sparse.logits(batch), learner.logits(batch), rtol=1e-12, atol=1e-15)
    unordered = SparseResidual(sparse.coords[::-1].copy(), sparse.weights, 512)
    with pytest.raises(ValueError, match="ascend"):
        SparseResidual.from_bytes(unordered.to_bytes())


def replica_on_board() -> tuple[InMemoryModelStore, TorchLearner, MemoryOffsets, Replica, np.ndarray]:
    """A replica serving version 1 (a tiny model) with an in-memory board for what the trainer
    publishes, and its scores for ``u_1`` on :data:`ITEMS` before anything is published."""
    store = InMemoryModelStore()
    store.models["1"] = learner = tiny_learner()
    store.aliases["champion"] = "1"
    board = MemoryOffsets()
    replica = Replica("r0", store, None, lambda u: u, offsets=board)
    replica.check_once()
    return store, learner, board, replica, np.array(replica.score("u_1", {}, ITEMS).probabilities)


ITEMS = ["item1", "item2", "item3"]


def test_a_replica_adds_its_versions_residual_per_row():
    _, learner, board, replica, model = replica_on_board()
    items = ITEMS
    rows = learner.encoder.encode_request("u_1", items, {}, None, [{}] * 3)
    item2 = int(rows.ids[1, learner.encoder.fields.index("item_id")])
    bias = learner.cfg.hash_buckets  # the residual reads no dense input: its bias follows the ids
    residual = SparseResidual(np.array([item2, bias]), np.array([0.5, -1.0]), bias)  # ids < bias
    board.put(LiveServing("1", 0.25, residual))
    replica.read_offset()
    served = np.array(replica.score("u_1", {}, items).probabilities)
    want = shift_probabilities(model, 0.25 + residual.logits(rows.first_columns(len(learner.encoder.fields))))
    np.testing.assert_allclose(served, want, rtol=1e-12)
    assert served[1] / (1 - served[1]) == pytest.approx(model[1] / (1 - model[1]) * np.exp(0.25 + 0.5 - 1.0))
    assert served[0] / (1 - served[0]) == pytest.approx(model[0] / (1 - model[0]) * np.exp(0.25 - 1.0))


def test_the_publisher_sends_the_residual_with_the_offset():
    trainer = IncrementalTrainer(
        small_trainer_config(), InMemoryModelStore(), label_delay_ms=DELAY_MS, serves_offset=True
    )
    data = turned_stream(3_000)
    trainer.add(data[:2_000])  # block 1: version 1 serves the rest
    trainer.add(data[2_000:])
    board = MemoryOffsets()
    OffsetPublisher(board).maybe_publish(trainer)
    live = trainer.live_residual()
    assert live is not None
    residual = board.get_residual(live[0])
    assert residual is not None and board.get(live[0]) == pytest.approx(live[1])
    np.testing.assert_array_equal(residual.coords, live[2].coords)
