"""Serving sees what training saw: the replica's request path builds exactly the trainer's inputs.

The replica turns ``POST /score`` (user, optional context, items) plus the features it reads into
``(Impression, stream features)`` rows and scores them with the learner it loaded; the trainer
encodes the joined example. These tests feed the same impression through both paths and compare
the model inputs and the probabilities, and check that a context the model never trained on
(training had none) changes nothing, so a request without ``context`` is not out of distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
import pytest

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression, LabelledExample
from serving_bridge.replica import Replica
from trainers.encoding import Encoder
from trainers.learner import TorchLearner
from trainers.testing import synthetic_examples


class OneVersion:
    def __init__(self, learner: Any) -> None:
        self.learner = learner

    def resolve(self, alias: str) -> str | None:
        return "1"

    def load(self, version: str) -> Any:
        return self.learner


class RecordedFeatures:
    """The features a replica reads: here, the stream features the joiner attached to one example."""

    def __init__(self, stream_features: Mapping[str, float]) -> None:
        self.stream_features = dict(stream_features)
        self.reads: list[tuple[str, list[str]]] = []

    def get(self, user_id: str, item_keys: Sequence[str]) -> list[dict[str, float]]:
        self.reads.append((user_id, list(item_keys)))
        return [dict(self.stream_features) for _ in item_keys]


def _trained(examples: list[LabelledExample], model: str = "deepfm") -> TorchLearner:
    cfg = TrainerConfig(
        model=model,  # type: ignore[arg-type]
        hash_buckets=1 << 12,
        embedding_dim=4,
        hidden=(8,),
        batch_size=64,
        device="cpu",
    )
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner


def _replica(learner: TorchLearner, features: Any) -> Replica:
    replica = Replica("r1", OneVersion(learner), features, lambda user_id: user_id)  # type: ignore[arg-type]
    replica.check_once()
    return replica


def _without_dense(ex: LabelledExample) -> LabelledExample:
    """A request carries no per-impression dense values: train on examples that have none either."""
    return msgspec.structs.replace(ex, impression=msgspec.structs.replace(ex.impression, dense={}))


@pytest.mark.parametrize("model", ["deepfm", "din"])  # din: the behaviour sequence read with the features
def test_the_request_path_gives_the_trainer_inputs_and_probabilities(model: str):
    examples = [_without_dense(ex) for ex in synthetic_examples(600, seed=1)]
    learner = _trained(examples, model)
    assert model != "din" or any(ex.stream_features["user_clicked_items"] for ex in examples[-25:])
    for ex in examples[-25:]:  # late in the sample: users have clicked before
        imp = ex.impression
        features = RecordedFeatures(ex.stream_features)
        replica = _replica(learner, features)
        served = replica.score(imp.user_id, imp.features, [imp.item_id])
        assert features.reads == [(imp.user_id, [imp.item_id])]
        request_row = Impression("request", imp.ts, imp.user_id, imp.item_id, dict(imp.features), {})
        trained = learner.encoder.encode([ex])
        requested = learner.encoder.encode([(request_row, ex.stream_features)])
        np.testing.assert_array_equal(requested.ids, trained.ids)
        np.testing.assert_array_equal(requested.dense, trained.dense)
        assert served.probabilities == [float(p) for p in learner.predict([ex])]


def test_a_context_training_never_had_changes_nothing():
    """Trained without context, the model scores a user the same with and without one."""
    examples = [
        msgspec.structs.replace(ex, impression=msgspec.structs.replace(ex.impression, features={}, dense={}))
        for ex in synthetic_examples(600, seed=2)
    ]
    learner = _trained(examples)
    assert learner.encoder.fields == ["user_id", "item_id"]
    replica = _replica(learner, RecordedFeatures({"user_ctr_1h": 0.05}))
    items = [f"item{i}" for i in range(20)]
    bare = replica.score("u_3", {}, items).probabilities
    with_context = replica.score("u_3", {"site": "site1", "device": "dev2"}, items).probabilities
    assert bare == with_context
    # and the base rate, not 0.5: the model learned something, and missing features are not noise
    rate = float(np.mean([ex.label for ex in examples]))
    assert abs(float(np.mean(bare)) - rate) < 0.15


def test_dense_inputs_sent_with_the_request_give_the_trainer_probabilities():
    """Trained on impressions with dense values (``price``): a request that sends them per item
    (``item_dense``) scores exactly as the trainer does, and one that omits them gets what training
    uses for a missing value (0), not something else."""
    examples = synthetic_examples(600, seed=3)
    learner = _trained(examples)
    assert learner.encoder.dense_keys == ["price"]
    for ex in examples[:25]:
        imp = ex.impression
        replica = _replica(learner, RecordedFeatures(ex.stream_features))
        served = replica.score(imp.user_id, imp.features, [imp.item_id], dense=[imp.dense])
        assert served.probabilities == [float(p) for p in learner.predict([ex])]
    ex = examples[0]
    imp = ex.impression
    replica = _replica(learner, RecordedFeatures(ex.stream_features))
    bare = replica.score(imp.user_id, imp.features, [imp.item_id])
    missing = learner.predict(
        [msgspec.structs.replace(ex, impression=msgspec.structs.replace(imp, dense={}))]
    )
    assert bare.probabilities == [float(p) for p in missing] != [float(p) for p in learner.predict([ex])]
