"""MlflowModelStore against an embedded MLflow (sqlite + artifact folder in a temp dir)."""

from __future__ import annotations

import math
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.core.config import RegistryConfig, TrainerConfig
from pipeline.core.types import ModelStore
from trainers.incremental import AliasStore, IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.mlflow_model import CONVERSION_COLUMN, PROBABILITY_COLUMN
from trainers.registry import MlflowModelStore
from trainers.testing import synthetic_examples
from trainers.version_page import iso_time


def cfg(**kw: object) -> TrainerConfig:
    base: dict[str, object] = dict(
        model="deepfm",
        hash_buckets=1 << 14,
        embedding_dim=8,
        hidden=(16,),
        batch_size=256,
        device="cpu",
        train_every=1_000,
        holdout_fraction=0.2,
        gate_tolerance=1.0,
        seed=5,
    )
    base.update(kw)
    return TrainerConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Two blocks through the real loop: versions 1 and 2, champion -> 2."""
    store = MlflowModelStore.embedded(RegistryConfig(), tmp_path_factory.mktemp("mlflow"))
    trainer = IncrementalTrainer(cfg(), store)
    data = synthetic_examples(2_000, seed=3)
    reports = trainer.add(data[:1_000], position={"p0": 1_000}) + trainer.add(
        data[1_000:], position={"p0": 2_000}
    )
    return store, trainer, reports, data


def test_publish_registers_versions_with_lineage_tags(published):
    store, _, reports, data = published
    assert [r.version for r in reports] == ["1", "2"] and store.versions() == ["1", "2"]
    tags = store.lineage("1")
    assert tags["position"] == '{"p0": 1000}' and tags["examples"] == "1000"
    assert tags["event_time_min"] == iso_time(data[0].impression.ts / 1000)  # ISO 8601, UTC
    assert tags["event_time_max"] == iso_time(data[999].impression.ts / 1000)
    assert tags["parent_version"] == "none" and store.lineage("2")["parent_version"] == "1"
    assert tags["code_version"] and tags["gate_reason"] == reports[0].decision.reason
    assert float(tags["metric.holdout.logloss"]) == pytest.approx(reports[0].candidate["logloss"])
    assert all(isinstance(v, str) for v in tags.values())
    run = store.client.get_run(store.client.get_model_version(store.name, "1").run_id)
    assert run.data.params["trainer.model"] == "deepfm"
    assert run.data.metrics["holdout.logloss"] == pytest.approx(reports[0].candidate["logloss"])


def test_version_page_has_a_description_few_tags_and_the_full_lineage_in_lineage_json(published):
    store, _, reports, data = published
    tags = store.lineage("2")
    assert len(tags) <= 15 and not any(k.startswith("metric.static.") for k in tags)
    record = store.lineage_record("2")
    assert record["tags"] == tags and len(record["lineage"]["config_hash"]) == 16
    assert record["lineage"]["event_time_min"] == data[1_000].impression.ts  # epoch ms, as passed
    assert record["lineage"]["train_examples"] + record["lineage"]["holdout_examples"] == 1_000
    assert record["metrics"]["static.logloss"] == pytest.approx(reports[1].static["logloss"])
    assert record["parent"]["version"] == "1"
    assert record["parent"]["metrics"]["holdout.auc"] == pytest.approx(reports[0].candidate["auc"])
    text = store.client.get_model_version(store.name, "2").description
    assert "fine-tuned from **version 1**" in text and reports[1].decision.reason in text
    first, last = (iso_time(data[i].impression.ts / 1000) for i in (1_000, 1_999))
    assert f"event time {first} .. {last}" in text
    assert '`{"p0": 2000}`' in text  # the input position
    gate_row = next(line for line in text.splitlines() if "what the gate compared" in line)
    assert f"{reports[1].candidate['logloss']:.4f} |" in gate_row
    assert f"{reports[1].champion['logloss']:.4f} |" in gate_row
    parent_holdout = next(line for line in text.splitlines() if line.startswith("| holdout"))
    assert parent_holdout.endswith(f"{reports[0].candidate['logloss']:.4f} |")  # the parent's own


def test_alias_resolves_and_moves(published):
    store, _, _, _ = published
    assert store.resolve("champion") == "2"
    assert store.resolve("no-such-alias") is None
    store.set_alias("rollback-test", "1")
    assert store.resolve("rollback-test") == "1"


def test_load_gives_identical_predictions(published):
    store, trainer, _, data = published
    loaded = store.load("2")
    assert loaded.version == "2"
    assert np.array_equal(loaded.predict(data[:300]), trainer.champion.predict(data[:300]))


def test_pyfunc_load_by_alias(published):
    store, trainer, _, data = published
    model = _pyfunc(store, "@champion")
    rows = _records(data[:50], sequence=True)
    champion = trainer.champion
    assert champion.blend is not None  # the pyfunc serves the version's mixture with the base rate
    assert np.array_equal(np.asarray(model.predict(rows)), champion.blend.apply(champion.predict(data[:50])))


def _records(examples: list[Any], sequence: bool = False) -> list[dict[str, Any]]:
    """The pyfunc's documented input: the floats in stream_features, the sequence in its own column."""
    return [
        {
            "user_id": ex.impression.user_id,
            "item_id": ex.impression.item_id,
            "features": ex.impression.features,
            "dense": ex.impression.dense,
            "stream_features": {k: v for k, v in ex.stream_features.items() if k != "user_clicked_items"},
        }
        | ({"user_clicked_items": ex.stream_features["user_clicked_items"]} if sequence else {})
        for ex in examples
    ]


def _pyfunc(store: MlflowModelStore, ref: str) -> Any:
    """The pyfunc of ``models:/<name><ref>`` (``ref``: ``/3`` or ``@champion``) from ``store``'s registry."""
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(store.tracking_uri)
    mlflow.set_registry_uri(store.registry_uri)
    try:
        return mlflow.pyfunc.load_model(f"models:/{store.name}{ref}")
    finally:
        mlflow.set_tracking_uri(previous[0])
        mlflow.set_registry_uri(previous[1])


def test_pyfunc_of_a_multi_task_model_gives_click_and_conversion_probability_columns(tmp_path):
    from tests.test_model_cache import esmm_learner

    store = MlflowModelStore.embedded(RegistryConfig(model_name="esmm-pyfunc"), tmp_path)
    learner = esmm_learner(seed=4)
    version = store.publish(learner, {"block": 1}, {"logloss": 0.5})
    data = synthetic_examples(40, seed=9)
    rows = _records(data)
    model = _pyfunc(store, f"/{version}")
    out = model.predict(pd.DataFrame(rows))
    assert model.metadata.get_output_schema().input_names() == list(out.columns)  # the signature says so
    assert (
        list(out.columns)
        == [PROBABILITY_COLUMN, CONVERSION_COLUMN]
        == ["probability", "conversion_probability"]
    )
    pairs = [
        (ex.impression, {k: v for k, v in ex.stream_features.items() if k != "user_clicked_items"})
        for ex in data
    ]
    want = learner.predict_tasks(pairs)
    assert np.array_equal(out[PROBABILITY_COLUMN].to_numpy(), learner.predict(pairs))
    assert np.array_equal(out[CONVERSION_COLUMN].to_numpy(), want[:, 1])
    assert out[CONVERSION_COLUMN].between(0.0, 1.0).all() and out[CONVERSION_COLUMN].nunique() > 1


def test_nan_candidate_is_not_published(published, monkeypatch):
    store, trainer, _, _ = published
    learn = TorchLearner.learn

    def poisoned(self: TorchLearner, examples: object, **kw: Any) -> float:
        learn(self, examples, **kw)  # type: ignore[arg-type]
        with torch.no_grad():
            self.model.bias.fill_(math.nan)
        return math.nan

    monkeypatch.setattr(TorchLearner, "learn", poisoned)
    (report,) = trainer.add(synthetic_examples(1_000, seed=4, start_index=2_000))
    assert not report.decision.accepted and report.version is None
    assert store.resolve("champion") == "2" and store.versions() == ["1", "2"]


def test_optimizer_state_round_trips_through_the_registry(published):
    store, trainer, _, data = published
    source = trainer.champion.clone()
    store.optimizer_state = True
    try:
        version = store.publish(source, {"block": "manual"}, {"logloss": 0.5})
    finally:
        store.optimizer_state = False
    loaded = store.load(version)
    source.learn(data[:500]), loaded.learn(data[:500])  # identical only if the Adam moments came back
    assert np.array_equal(source.predict(data[:200]), loaded.predict(data[:200]))


def test_store_implements_the_protocol(published):
    assert isinstance(published[0], ModelStore) and isinstance(published[0], AliasStore)
