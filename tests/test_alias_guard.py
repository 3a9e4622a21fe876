"""The trainer after a manual rollback: it adopts the rolled-back champion and gates against it."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from tests.test_trainers import small_cfg
from trainers.incremental import IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.metrics import block_metrics
from trainers.testing import InMemoryModelStore, synthetic_examples

BLOCK, HOLD = 2_000, 400  # small_cfg: train_every 2,000, holdout_fraction 0.2


def two_versions() -> tuple[InMemoryModelStore, IncrementalTrainer, list]:
    """A trainer that promoted versions 1 and 2, and 4 more blocks of the same stream."""
    store = InMemoryModelStore()
    trainer = IncrementalTrainer(small_cfg("lr", gate_tolerance=1.0), store)
    data = synthetic_examples(6 * BLOCK, seed=11)
    reports = trainer.add(data[: 2 * BLOCK])
    assert [r.version for r in reports] == ["1", "2"] and store.resolve("champion") == "2"
    assert all(r.adopted_version is None and r.alias_moved for r in reports)
    return store, trainer, data[2 * BLOCK :]


def holdout_metrics(learner: TorchLearner, block: list) -> dict[str, float]:
    hold = block[-HOLD:]
    return block_metrics(np.array([ex.label for ex in hold], dtype=np.float32), learner.predict(hold))


def test_a_rollback_is_adopted_and_a_candidate_that_cannot_beat_it_leaves_the_alias(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, trainer, rest = two_versions()
    store.set_alias("champion", "1")  # the operator rolls back
    trainer.cfg.gate_tolerance = -0.5  # now no candidate can pass: logloss <= half the champion's
    with caplog.at_level(logging.WARNING, logger="trainers.alias_guard"):
        (report,) = trainer.add(rest[:BLOCK])
    assert "points at version 1, not 2" in caplog.text
    assert report.adopted_version == "1" and report.parent_version == "1"
    # the gate compared the candidate with the rolled-back version on the same holdout
    assert report.champion == pytest.approx(holdout_metrics(store.load("1"), rest[:BLOCK]), rel=1e-6)
    rolled_back = store.load("1")  # served with the mixture with the base rate it was saved with
    assert rolled_back.blend is not None
    served = rolled_back.blend.apply(rolled_back.predict(rest[:BLOCK]))
    labels = np.array([ex.label for ex in rest[:BLOCK]])
    assert report.online == pytest.approx(block_metrics(labels, served), rel=1e-6)
    assert not report.decision.accepted and report.version is None and not report.alias_moved
    assert store.resolve("champion") == "1" and store.versions() == ["1", "2"]
    assert trainer.champion_version == "1"
    (after,) = trainer.add(rest[BLOCK : 2 * BLOCK])  # from then on: gated against version 1 again
    assert after.adopted_version is None and after.parent_version == "1" and after.version is None
    assert store.resolve("champion") == "1"


def test_a_candidate_that_beats_the_rolled_back_version_moves_the_alias() -> None:
    store, trainer, rest = two_versions()
    store.set_alias("champion", "1")
    (report,) = trainer.add(rest[:BLOCK])
    assert report.adopted_version == "1" and report.decision.accepted, report.decision
    assert report.version == "3" and report.alias_moved and store.resolve("champion") == "3"
    assert store.lineages["3"]["parent_version"] == "1"  # fine-tuned from the rolled-back version
    (after,) = trainer.add(rest[BLOCK : 2 * BLOCK])
    assert after.adopted_version is None and after.parent_version == "3"


def test_an_alias_moved_during_the_block_is_not_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    store, trainer, rest = two_versions()
    learn = TorchLearner.learn

    def rollback_while_training(self: TorchLearner, examples: object, **kw: Any) -> float:
        store.set_alias("champion", "1")  # the operator acts while the candidate trains
        return learn(self, examples, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(TorchLearner, "learn", rollback_while_training)
    (report,) = trainer.add(rest[:BLOCK])
    assert report.adopted_version is None and report.parent_version == "2" and report.decision.accepted
    assert report.version == "3" and not report.alias_moved and store.resolve("champion") == "1"
    monkeypatch.setattr(TorchLearner, "learn", learn)
    (after,) = trainer.add(rest[BLOCK : 2 * BLOCK])
    assert after.adopted_version == "1" and after.parent_version == "1"


def test_a_deleted_alias_is_not_a_rollback() -> None:
    store, trainer, rest = two_versions()
    del store.aliases["champion"]
    (report,) = trainer.add(rest[:BLOCK])
    assert report.adopted_version is None and report.parent_version == "2"
    assert report.decision.accepted and store.resolve("champion") == report.version
