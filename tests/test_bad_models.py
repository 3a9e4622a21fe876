"""Bad models never reach the champion alias: NaN loss, exploding weights, flipped labels.

Each scenario trains a good first version, then a poisoned block; the gate must refuse it with a
reason that says why (and a ``kind`` the trainer daemon counts in ``ctr_trainer_gate_refusals_total``),
the alias must stay, and the champion must keep scoring exactly as before. A version that fails to
load on a replica leaves the replica on its current version, counted in ``load_errors``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from pipeline.core.config import TrainerConfig
from pipeline.core.events import LabelledExample
from pipeline.core.pseudonyms import Pseudonymizer
from serving_bridge.replica import Replica
from trainers.incremental import IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.testing import InMemoryModelStore, synthetic_examples

pytestmark = pytest.mark.faults


def cfg(**kw: Any) -> TrainerConfig:
    base = TrainerConfig(
        model="deepfm",
        hash_buckets=1 << 14,
        embedding_dim=8,
        hidden=(32, 16),
        batch_size=256,
        device="cpu",
        train_every=3_000,
        holdout_fraction=0.2,
        seed=3,
    )
    return replace(base, **kw)


def flipped(examples: list[LabelledExample]) -> list[LabelledExample]:
    return [msgspec.structs.replace(ex, label=1 - ex.label) for ex in examples]


def blow_up(learner: TorchLearner) -> None:
    with torch.no_grad():
        for p in learner.model.parameters():
            p.mul_(1e4)


def nan_out(learner: TorchLearner) -> None:
    with torch.no_grad():
        for p in learner.model.parameters():
            p.fill_(math.nan)


@pytest.mark.parametrize(
    ("poison", "kind", "words"),
    [
        ("nan", "non_finite", "nan"),
        ("exploding", "worse_than_champion", "candidate logloss"),
        ("flipped", "corrupt_labels", "labels look corrupt"),
    ],
)
def test_a_poisoned_block_is_refused_and_the_champion_stays(
    poison: str, kind: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = InMemoryModelStore()
    trainer = IncrementalTrainer(cfg(), store)
    data = synthetic_examples(9_000, seed=1)
    first, second = trainer.add(data[:6_000])
    assert first.decision.accepted and second.decision.accepted
    champion, version = trainer.champion, store.resolve("champion")
    assert champion is not None and version == "2"
    probe = data[6_000:6_200]
    before = champion.predict(champion.encode(probe))

    block = data[6_000:]
    if poison == "flipped":
        block = flipped(block)
    else:
        learn = TorchLearner.learn
        damage: Callable[[TorchLearner], None] = nan_out if poison == "nan" else blow_up

        def poisoned(self: TorchLearner, batch: Any, **kw: Any) -> float:
            loss = learn(self, batch, **kw)
            damage(self)
            return loss

        monkeypatch.setattr(TorchLearner, "learn", poisoned)
    (third,) = trainer.add(block)
    assert not third.decision.accepted and third.decision.kind == kind
    assert words in third.decision.reason
    assert third.version is None and store.versions() == ["1", "2"] and store.resolve("champion") == "2"
    assert trainer.champion is champion
    assert np.array_equal(champion.predict(champion.encode(probe)), before)


def test_drift_is_not_mistaken_for_flipped_labels() -> None:
    """A new truth (different weights, same label semantics) lowers the champion's AUC toward 0.5
    but does not invert it: the block is learnt, not refused as corrupt."""
    trainer = IncrementalTrainer(cfg(), InMemoryModelStore())
    trainer.add(synthetic_examples(6_000, seed=1))
    (drifted,) = trainer.add(synthetic_examples(3_000, seed=2, truth_seed=99))
    assert drifted.decision.kind != "corrupt_labels", drifted.decision.reason
    assert drifted.online["auc"] > cfg().min_champion_auc


def test_a_version_that_fails_to_load_leaves_the_replica_on_its_version() -> None:
    store = InMemoryModelStore()
    IncrementalTrainer(cfg(), store).add(synthetic_examples(3_000, seed=1))
    replica = Replica("r", store, None, Pseudonymizer("k", "u_"), poll_interval_s=60)
    assert replica.check_once() and replica.version == "1"
    good_load = store.load

    def broken(version: str) -> Any:
        if version == "2":
            raise OSError("artifact truncated")
        return good_load(version)

    store.load = broken  # type: ignore[method-assign]
    store.publish(store.load("1"), {"block": 2}, {})
    store.set_alias("champion", "2")
    assert not replica.check_once()
    assert replica.version == "1" and replica.load_errors == 1
    scored = replica.score("alice", {}, ["item1", "item2"])
    assert scored.version == "1" and len(scored.probabilities) == 2
