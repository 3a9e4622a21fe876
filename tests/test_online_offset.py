"""The online offset (trainers.online_offset): fitted in the engine, published live, added by replicas."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.events import LabelledExample
from serving_bridge.online_offset import MemoryOffsets, OffsetPublisher, shift_probabilities
from serving_bridge.replica import Replica
from trainers.calibration import fit_shift
from trainers.incremental import BlockScores, IncrementalTrainer
from trainers.online_offset import MIN_LABELLED, LiveServing, block_offsets
from trainers.testing import InMemoryModelStore, small_trainer_config, synthetic_examples, tiny_learner

DELAY_MS = 20_000  # 200 of synthetic_examples' impressions (one every 100 ms)


def shifted_stream(n: int = 6_000) -> list[LabelledExample]:
    """Block 1 (2,000 examples) at one click rate, then a click rate several times higher: a
    version trained on block 1 scores block 2 far too low until its intercept follows."""
    return synthetic_examples(2_000, seed=1) + synthetic_examples(
        n - 2_000, seed=2, start_index=2_000, bias=-0.5
    )


def run(**cfg: object) -> tuple[list, list[BlockScores], IncrementalTrainer]:
    """The offset alone (the residual, tests/test_online_residual.py, off unless asked for)."""
    scores: list[BlockScores] = []
    cfg = {"online_residual": False} | cfg
    trainer = IncrementalTrainer(
        small_trainer_config(**cfg), InMemoryModelStore(), on_scores=scores.append, label_delay_ms=DELAY_MS
    )
    return trainer.add(shifted_stream()), scores, trainer


def test_block_offsets_read_only_labels_final_before_each_impression():
    """Predict-then-learn: an example's offset depends only on the labels of impressions at least
    the label delay older than it; any other label may change without moving it."""
    rng = np.random.default_rng(0)
    n, delay = 3_000, 5_000
    t = np.sort(rng.integers(0, 300_000, n))
    z = rng.normal(-2.0, 1.0, n)
    y = (rng.random(n) < 0.2).astype(np.float64)
    base = block_offsets(z, y, t, delay_ms=delay, every=50, recent=1_000)
    for s in (0, 400, 1_250, 2_999):
        start = s - s % 50  # the refit this example is served with
        final = t + delay <= t[start]
        flipped = np.where(final, y, 1.0 - y)  # every label not final by then, changed
        again = block_offsets(z, flipped, t, delay_ms=delay, every=50, recent=1_000)
        assert again[s] == base[s]
        assert (base[s] == 0.0) == (final.sum() < MIN_LABELLED)
    assert base[-1] == pytest.approx(
        fit_shift(z[t + delay <= t[-50]][-1_000:], y[t + delay <= t[-50]][-1_000:])
    )


def test_served_scores_follow_the_click_rate_and_the_gate_reads_the_models():
    """With the offset the progressive (served) scores of the shifted block are much better
    calibrated; block 1 (no accepted version serves it) and the gate's champion scores are the
    model's either way."""
    plain, plain_scores, _ = run(online_offset=False)
    served, served_scores, _ = run(online_offset_every=100)
    assert plain[0].online == served[0].online
    np.testing.assert_array_equal(plain_scores[0].scores["online"], served_scores[0].scores["online"])
    assert [r.champion for r in plain] == [r.champion for r in served]  # the gate: model vs model
    assert plain[1].online["calibration"] < 0.6  # the shift: block 2 badly under-predicted
    assert abs(served[1].online["calibration"] - 1.0) < abs(plain[1].online["calibration"] - 1.0) / 2
    assert served[1].online["logloss"] < plain[1].online["logloss"]
    # the first impressions of a block have no final label yet: served as the model scores them
    first = served_scores[1].scores["online"][:MIN_LABELLED]
    np.testing.assert_allclose(first, plain_scores[1].scores["online"][:MIN_LABELLED], rtol=1e-12)


def test_live_offset_is_what_the_block_serves_once_those_labels_are_final():
    """The trainer's live offset after receiving the block's examples up to time T (what it
    publishes) is the offset the closed block's metrics serve an impression at T + delay with."""
    data = shifted_stream(4_000)
    trainer = IncrementalTrainer(  # the offset alone (the residual: test_online_residual; the
        # mixture with the base rate: test_base_rate_blend)
        small_trainer_config(online_offset_every=1, online_residual=False, base_rate_blend_clamp=0.0),
        InMemoryModelStore(),
        label_delay_ms=DELAY_MS,
        serves_offset=True,
    )
    assert trainer.live_offset() is None  # no champion yet
    trainer.add(data[:2_000])
    assert trainer.live_offset() is None  # a block, but none of the next one's examples
    champion = trainer.champion
    assert champion is not None and champion.version == "1"
    received = 700  # block 2's examples up to time T
    trainer.add(data[2_000 : 2_000 + received])
    version, live = trainer.live_offset() or ("", 0.0)
    block = data[2_000:4_000]
    z = champion.predict_logits(block[:received]) + champion.calibration[1]
    y = np.array([ex.label for ex in block[:received]], dtype=np.float64)
    assert version == "1" and live == pytest.approx(fit_shift(z, y), abs=1e-9)
    scores: list[BlockScores] = []
    trainer.on_scores = scores.append
    trainer.add(data[2_000 + received :])
    # the impression at T + delay (T: the 700th's time): those 700 labels are final, the 701st's not yet
    s = received - 1 + DELAY_MS // 100
    z_s = champion.predict_logits(block[s : s + 1])[0] + champion.calibration[1]
    p_s = scores[0].scores["online"][s]
    assert np.log(p_s / (1 - p_s)) - z_s == pytest.approx(live, abs=1e-5)


def test_live_offset_survives_a_refused_block_and_restarts_with_a_new_version():
    cfg = small_trainer_config(gate_tolerance=-1.0)  # every candidate refused: version 1 stays
    store = InMemoryModelStore()
    trainer = IncrementalTrainer(cfg, store, label_delay_ms=DELAY_MS, serves_offset=True)
    data = shifted_stream(5_000)
    trainer.add(data[:2_000])  # block 1: accepted (no champion to beat)
    trainer.add(data[2_000:4_500])  # block 2 refused; 500 of block 3 buffered
    assert trainer.champion is not None and trainer.champion.version == "1"
    version, live = trainer.live_offset() or ("", 0.0)
    z = trainer.champion.predict_logits(data[4_000:4_500]) + trainer.champion.calibration[1]
    y = np.array([ex.label for ex in data[4_000:4_500]], dtype=np.float64)
    assert version == "1" and live == pytest.approx(fit_shift(z, y), abs=1e-9)


def test_the_publisher_writes_the_champions_offset_and_keeps_going_when_the_board_fails():
    class Broken(MemoryOffsets):
        def put(self, live: LiveServing) -> None:
            raise ConnectionError("redis away")

    class Live:
        def live_residual(self) -> LiveServing | None:
            return LiveServing("7", -0.25)

    board = MemoryOffsets()
    OffsetPublisher(board).maybe_publish(Live())
    assert board.get("7") == -0.25
    broken = OffsetPublisher(Broken(), every_s=0.0)
    broken.maybe_publish(Live())
    broken.maybe_publish(Live())
    assert broken.failures == 2


def test_a_replica_adds_its_versions_offset_and_keeps_the_last_one_when_the_board_fails():
    store = InMemoryModelStore()
    store.models["1"] = store.models["2"] = tiny_learner()
    store.aliases["champion"] = "1"
    board = MemoryOffsets()
    replica = Replica("r0", store, None, lambda u: u, offsets=board)
    replica.check_once()
    items = ["item1", "item2", "item3"]
    model = replica.score("u_1", {}, items).probabilities
    board.put(LiveServing("2", 3.0))  # another version's: not ours
    assert replica.read_offset() == 0.0 and replica.score("u_1", {}, items).probabilities == model
    board.put(LiveServing("1", np.log(2.0)))
    assert replica.read_offset() == pytest.approx(np.log(2.0))
    served = replica.score("u_1", {}, items).probabilities
    np.testing.assert_allclose(served, shift_probabilities(np.array(model), np.log(2.0)), rtol=1e-12)
    odds = np.array(served) / (1 - np.array(served))
    np.testing.assert_allclose(odds, 2 * np.array(model) / (1 - np.array(model)), rtol=1e-9)

    def fail(version: str) -> float | None:
        raise ConnectionError("redis away")

    board.get = fail  # type: ignore[method-assign]
    assert replica.read_offset() == pytest.approx(np.log(2.0)) and replica.offset_errors == 1
    assert replica.score("u_1", {}, items).probabilities == served
    store.aliases["champion"] = "2"  # a new version: the old one's offset does not follow it
    replica.check_once()
    assert replica.read_offset() == 0.0
    np.testing.assert_allclose(replica.score("u_1", {}, items).probabilities, model, rtol=1e-12)


def test_a_config_without_the_offset_serves_the_models_scores_live_too():
    trainer = IncrementalTrainer(
        dataclasses.replace(small_trainer_config(), online_offset=False, online_residual=False),
        InMemoryModelStore(),
        label_delay_ms=DELAY_MS,
        serves_offset=True,
    )
    data = shifted_stream(3_000)
    trainer.add(data)
    assert trainer.live_offset() is None


def test_the_cost_benchmark_times_the_trainer_with_and_without_live_scoring(tmp_path):
    out = tmp_path / "offset-cost.json"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "offset_cost.py"
    cmd = [
        sys.executable,
        str(script),
        "--block",
        "2000",
        "--blocks",
        "1",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=script.parents[1], capture_output=True, timeout=600)
    data = json.loads(out.read_text())
    assert data["meta"]["timed_examples"] == 2_000 and len(data["seconds"]["with"]) == 1
    assert set(data["seconds"]) == {"without", "with", "residual", "mixture"}
    rate = data["examples_per_s"]
    assert rate["with"] > 0 and data["throughput_cost"] == pytest.approx(1 - rate["with"] / rate["without"])
    assert len(data["seconds"]["residual"]) == 1
    assert data["throughput_cost_with_residual"] == pytest.approx(1 - rate["residual"] / rate["without"])
    largest = data["largest_residual"]
    assert largest["weights"] > 0 and largest["bytes"] > 16 * largest["weights"]  # published, as .npz
