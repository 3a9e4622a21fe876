"""Dense inputs read clamped to the range training saw (``trainer.clamp_dense``,
:mod:`trainers.dense_range`): no model extrapolates on an input it never learned."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.core.events import LabelledExample
from trainers.dense_range import DenseRange
from trainers.encoding import Encoder
from trainers.incremental import IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.models import MODELS, build_model, model_spec
from trainers.testing import synthetic_examples

from .test_trainers import small_cfg

COUNTER = "item_impressions_1h"  # a global item counter: 0 all through a stream's first block


def with_counter(examples: list[LabelledExample], value: float) -> list[LabelledExample]:
    return [
        msgspec.structs.replace(ex, stream_features={**ex.stream_features, COUNTER: value}) for ex in examples
    ]


def learner(model: str = "deepfm", **kw: object) -> tuple[TorchLearner, list[LabelledExample]]:
    block = with_counter(synthetic_examples(2_000, seed=1), 0.0)
    cfg = small_cfg(model, **kw)
    return TorchLearner(cfg, Encoder.for_trainer(cfg).fit(block)), block


def gap(lrn: TorchLearner, value: float, probe: list[LabelledExample]) -> float:
    """Mean |logit change| of ``probe`` when the counter reads ``value`` instead of 0."""
    at_0 = lrn.predict_logits(lrn.encode(with_counter(probe, 0.0)))
    at_v = lrn.predict_logits(lrn.encode(with_counter(probe, value)))
    return float(np.abs(at_v - at_0).mean())


@pytest.mark.parametrize("model", list(MODELS))
def test_an_input_training_saw_only_at_0_changes_no_score(model: str) -> None:
    """The counter is 0 in every learned row; the next block's rows have it at 50. Clamped, they
    score exactly as at 0; unclamped, its untrained weights move every logit (the failure)."""
    probe = synthetic_examples(300, seed=2)
    gaps = {}
    for clamp in (True, False):
        lrn, block = learner(model, clamp_dense=clamp)
        lrn.learn(block)
        gaps[clamp] = gap(lrn, 50.0, probe)
    assert gaps[True] == 0.0 and gaps[False] > 1e-3, gaps


def test_the_range_widens_with_each_block_learned_but_not_with_a_holdout() -> None:
    lrn, block = learner()
    lrn.learn(block)
    probe = synthetic_examples(300, seed=2)
    lrn.learn(with_counter(synthetic_examples(400, seed=3), 3.0), widen_range=False)  # a holdout
    assert gap(lrn, 3.0, probe) == 0.0  # its few steps moved the weights, not the range
    lrn.learn(with_counter(synthetic_examples(2_000, seed=4), 3.0))  # a block shows it at 3
    assert gap(lrn, 3.0, probe) > 0.0
    assert gap(lrn, 3.0, probe) == gap(lrn, 80.0, probe)  # and no further


def test_the_trainers_holdout_does_not_widen_the_range() -> None:
    """A block whose newest tenth (the gate's holdout) is the only part where the counter is on: the
    published version reads the counter as 0, as it learned it over the block's training part."""
    cfg = small_cfg("deepfm", train_every=2_000, holdout_fraction=0.1)
    rows = synthetic_examples(2_000, seed=1)
    trainer = IncrementalTrainer(cfg, None)
    trainer.add(with_counter(rows[:1_800], 0.0) + with_counter(rows[1_800:], 7.0))
    champion = trainer.champion
    assert champion is not None and champion.blocks_learned == 2  # its block, then its holdout
    j = champion.encoder.dense_names.index(COUNTER)
    dense_range = champion.model.dense_range
    assert isinstance(dense_range, DenseRange) and dense_range.hi[j] == 0.0
    assert gap(champion, 7.0, synthetic_examples(300, seed=2)) == 0.0


def test_a_saved_version_clamps_as_its_trainer_did_and_old_specs_do_not(tmp_path) -> None:
    lrn, block = learner()
    lrn.learn(block)
    lrn.learn(with_counter(synthetic_examples(2_000, seed=4), 2.0))
    assert lrn.model_spec["dense_range"] is True
    lrn.save(tmp_path / "m")
    again = TorchLearner.load(tmp_path / "m")
    probe = with_counter(synthetic_examples(300, seed=5), 40.0)  # beyond the range: clamped to 2
    np.testing.assert_array_equal(again.predict(probe), lrn.predict(probe))
    served = TorchLearner.load_for_serving(lrn.save_for_serving(tmp_path / "s"))
    np.testing.assert_allclose(served.predict(probe), lrn.predict(probe), rtol=1e-6)
    old = model_spec("deepfm", n_fields=3, n_dense=2, hash_buckets=64)  # as saved before the clamp
    assert "dense_range" not in old and build_model(old).dense_range is None
