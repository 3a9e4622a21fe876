"""Values training never saw (``trainer.new_values``): scored as their field's mean row, and warm-started
from it when first learned (:class:`trainers.models.HashedEmbedding`)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from pipeline.core.events import LabelledExample
from trainers.encoding import Encoder
from trainers.learner import TorchLearner
from trainers.models import MODELS, HashedEmbedding, build_model, model_spec
from trainers.testing import synthetic_examples

from .test_trainers import BUCKETS, small_cfg


def with_feature(examples: list[LabelledExample], name: str, value: str) -> list[LabelledExample]:
    """The same examples with one more categorical feature set to ``value`` on every row."""
    out = []
    for ex in examples:
        imp = msgspec.structs.replace(ex.impression, features={**ex.impression.features, name: value})
        out.append(msgspec.structs.replace(ex, impression=imp))
    return out


def test_a_value_never_learned_reads_its_fields_mean_and_starts_from_it() -> None:
    table = HashedEmbedding(16, 2, n_fields=2, warm_start=True).eval()  # scoring, as predict runs it
    ids = torch.tensor([[1, 5], [1, 6], [2, 6]])
    table.admit(ids)
    table.refresh(ids)
    rows = table.table.weight.detach().clone()
    want = torch.stack([rows[[1, 1, 2]].mean(0), rows[[5, 6, 6]].mean(0)])  # traffic-weighted
    torch.testing.assert_close(table.field_mean, want)
    unseen = torch.tensor([[9, 1]])  # 9 never learned (field 0); 1 learned
    torch.testing.assert_close(table(unseen)[0, 0], rows[9] + want[0])
    torch.testing.assert_close(table(unseen)[0, 1], rows[1])
    table.admit(torch.tensor([[9, 1], [9, 6]]))  # learned now: its row starts from field 0's mean, once
    torch.testing.assert_close(table.table.weight.detach()[9], rows[9] + want[0])
    torch.testing.assert_close(table(unseen)[0, 0], rows[9] + want[0])  # scores as it did


@pytest.mark.parametrize("model", list(MODELS))
def test_a_new_value_of_an_always_on_field_scores_like_the_one_it_replaces(model: str) -> None:
    """Block 1 runs at hour "00" only; block 2 brings hour "01". With ``field_mean`` a row at the new
    hour scores as the same row at the old hour (the hour's share of the intercept is kept; only
    the new vector's own tiny random init differs), where ``fresh`` drops that share."""
    block = with_feature(synthetic_examples(3_000, seed=1), "hour", "00")
    probe = synthetic_examples(200, seed=2)
    gaps = {}
    for new_values in ("field_mean", "fresh"):
        cfg = small_cfg(model, new_values=new_values)
        learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(block))
        learner.learn(block)
        old = learner.predict_logits(learner.encode(with_feature(probe, "hour", "00")))
        new = learner.predict_logits(learner.encode(with_feature(probe, "hour", "01")))
        gaps[new_values] = float(np.abs(new - old).mean())
    assert gaps["field_mean"] < 0.01 < gaps["fresh"], gaps


def test_the_spec_says_how_new_values_are_read_and_old_specs_read_them_fresh(tmp_path) -> None:
    rows = synthetic_examples(1_000, seed=1)
    learner = TorchLearner(small_cfg(), Encoder(BUCKETS).fit(rows))
    learner.learn(rows)
    assert learner.model_spec["new_values"] == "field_mean"
    learner.save(tmp_path / "m")
    again = TorchLearner.load(tmp_path / "m")
    probe = synthetic_examples(300, seed=5, users=900)  # two thirds of the users never learned
    np.testing.assert_array_equal(again.predict(probe), learner.predict(probe))
    old = model_spec("deepfm", n_fields=3, n_dense=0, hash_buckets=64)  # as saved before new_values
    assert "new_values" not in old
    assert not any(m.warm_start for m in build_model(old).modules() if isinstance(m, HashedEmbedding))
