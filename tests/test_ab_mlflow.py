"""The A/B readout on an embedded MLflow (sqlite): published on each version's run, read back by `ctr ab`."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import RegistryConfig
from pipeline.ops.cli import main as ctr_main
from trainers.ab_publish import TAG, publish, read
from trainers.ab_readout import ABReadout
from trainers.registry import MlflowModelStore


@pytest.fixture(scope="module")
def registry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ab-registry")


@pytest.fixture
def store(registry_dir: Path) -> MlflowModelStore:
    """Versions 1 and 2, each with a source run; champion -> 1, challenger -> 2."""
    s = MlflowModelStore.embedded(RegistryConfig(model_name=f"ab-{uuid.uuid4().hex[:10]}"), registry_dir)
    s.client.create_registered_model(s.name)
    for i in (1, 2):
        run = s.client.create_run(s.experiment_id, run_name=f"block-{i}")
        s.client.create_model_version(s.name, source=f"s3://nowhere/v{i}", run_id=run.info.run_id)
        s.client.set_terminated(run.info.run_id, "FINISHED")  # as publish leaves it
    s.set_alias("champion", "1")
    s.set_alias("challenger", "2")
    return s


def _readout(seed: int = 0, n: int = 20_000) -> ABReadout:
    """Champion v1 scores at chance, challenger v2 ranks well; same CTR; v9 is not registered."""
    rng = np.random.default_rng(seed)
    r = ABReadout()
    for version, skill in (("1", 0.0), ("2", 2.5), ("9", 1.0)):
        y = (rng.random(n) < 0.05).astype(int)
        p = 1 / (1 + np.exp(-(-3 + skill * (y - 0.05) + rng.normal(0, 0.5, n))))
        for label, score in zip(y, p, strict=True):
            r.add(version, int(label), float(score))
    return r


def test_publish_logs_each_registered_arm_on_its_run_and_reads_back(store: MlflowModelStore) -> None:
    r = _readout()
    assert publish(store, r, step=3) == ["1", "2"]  # v9 is no version of this model: skipped
    summary = r.summary()
    for v in ("1", "2"):
        back = read(store, v)
        assert set(back) == set(summary[v])
        for key, value in summary[v].items():
            assert back[key] == pytest.approx(value, rel=1e-12, nan_ok=True)
        mv = store.client.get_model_version(store.name, v)
        history = store.client.get_metric_history(mv.run_id, "ab_auc")
        assert [m.step for m in history] == [3]
        assert mv.tags[TAG].startswith(f"CTR {100 * summary[v]['ctr']:.2f}%")
    assert publish(store, r, step=4) == []  # nothing new since: nothing logged
    r.add("2", 1, 0.5)
    assert publish(store, r, step=4) == ["2"]


def test_ctr_ab_names_the_better_arm(
    store: MlflowModelStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTR_REGISTRY_TRACKING_URI", store.tracking_uri)
    monkeypatch.setenv("CTR_REGISTRY_MODEL_NAME", store.name)
    assert ctr_main(["ab"]) == 1  # nothing published yet
    assert "no readout yet" in capsys.readouterr().out
    publish(store, _readout(), step=1)
    assert ctr_main(["ab"]) == 0
    text = capsys.readouterr().out
    assert "AUC" in text and "challenger - champion" in text
    assert ctr_main(["ab", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [(a["arm"], a["version"]) for a in d["arms"]] == [("champion", "1"), ("challenger", "2")]
    verdict = d["challenger_vs_champion"]["verdict"]
    assert verdict["auc"] == "challenger better" and verdict["ne"] == "challenger better"
    assert verdict["ctr"] == "no clear difference"
    champion = d["arms"][0]["readout"]
    assert champion["auc_lo"] < 0.5 < champion["auc_hi"]  # a model at chance


def test_ctr_ab_without_scores_says_ctr_only(
    store: MlflowModelStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTR_REGISTRY_TRACKING_URI", store.tracking_uri)
    monkeypatch.setenv("CTR_REGISTRY_MODEL_NAME", store.name)
    r = ABReadout()
    for i in range(1_000):
        r.add("1", int(i % 50 == 0), None)
    publish(store, r, step=1)
    assert ctr_main(["ab"]) == 0
    text = capsys.readouterr().out
    assert "CTR only" in text and "2.00 [" in text
    assert math.isnan(read(store, "1")["auc"])
