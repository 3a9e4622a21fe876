"""Rollback end to end on the real MLflow server and Redis: in the MLflow UI (headless Chromium),
with `ctr rollback`, and the trainer gating against a rolled-back champion; and the version page the
operator reads before rolling back (its description, screenshotted into the test's tmp dir).

The UI and `ctr rollback` tests share one deployment (three versions, two `ctr serve` replicas) and
each rolls back from whatever the champion is to another version. They wait with generous deadlines
and print, never assert, the seconds from the action to the last replica switching.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.core.config import RegistryConfig
from pipeline.ops.cli import main as ctr_main
from serving_bridge.replica_processes import SwitchWatch
from serving_bridge.rollback import rollback
from tests.integration.rollback_fixtures import (  # noqa: F401  (fixtures)
    Deployment,
    browser_fixture,
    deployment_fixture,
)
from trainers.metrics import block_metrics
from trainers.registry import MlflowModelStore
from trainers.testing import publish_versions, synthetic_examples

DEADLINE_S = 120.0  # generous: a loaded CI machine; the figure itself goes to benchmarks/


def ctr(d: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str):
    """``ctr ARGS`` (the console entry point's main) with the deployment's environment."""
    for k, v in d.env.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    code = ctr_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def report(what: str, seconds: dict[str, float | None]) -> None:
    alias_s = seconds.pop("mlflow_alias", None)
    last = None if None in seconds.values() else max(s for s in seconds.values() if s is not None)
    print(f"\n{what}: alias moved after {alias_s} s, last replica switched after {last} s: {seconds}")


def test_ctr_rollback_refuses_bad_input_then_records_who_when_why_and_every_replica_follows(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    d = deployment
    current, target = d.other_version()
    code, _, err = ctr(d, monkeypatch, capsys, "rollback", "--to", "9", "--reason", "typo")
    assert code == 1 and "has no version '9'; its versions are 1, 2, 3" in err, err
    code, _, err = ctr(d, monkeypatch, capsys, "rollback", "--to", target, "--reason", "  ")
    assert code == 1 and "needs a reason" in err, err
    code, _, err = ctr(d, monkeypatch, capsys, "rollback", "--to", current, "--reason", "no-op")
    assert code == 1 and f"already points at version {current}" in err, err
    assert d.store.resolve("champion") == current and set(d.fleet.versions().values()) == {current}

    watch = SwitchWatch.replicas(d.fleet.urls, target, mlflow_alias=lambda: d.store.resolve("champion"))
    start = time.perf_counter()
    code, out, err = ctr(
        d,
        monkeypatch,
        capsys,
        "rollback",
        "--to",
        target,
        "--reason",
        "overpredicts CTR",
        "--by",
        "alice",
        "--json",
    )
    seconds = watch.seconds_after(start, timeout_s=DEADLINE_S)
    with capsys.disabled():
        report("ctr rollback", dict(seconds))
    assert code == 0, err
    assert None not in seconds.values(), f"{seconds}\n{d.fleet.logs()}"
    assert set(d.fleet.versions().values()) == {target}

    record = json.loads(out)
    assert record["version"] == target and record["previous"] == current and record["announced"] is True
    assert d.store.resolve("champion") == target
    tags = d.store.lineage(target)
    assert tags["rollback.by"] == "alice" and tags["rollback.reason"] == "overpredicts CTR"
    assert tags["rollback.from"] == current and datetime.fromisoformat(tags["rollback.at"]).tzinfo is not None
    model_tags = d.store.client.get_registered_model(d.store.name).tags
    assert model_tags["last_rollback.to"] == target and model_tags["last_rollback.by"] == "alice"
    assert model_tags["last_rollback.at"] == tags["rollback.at"]

    code, out, err = ctr(d, monkeypatch, capsys, "versions", "--json")
    assert code == 0, err
    rows = {r["version"]: r for r in json.loads(out)["versions"]}
    assert list(rows) == ["3", "2", "1"] and rows[target]["aliases"] == "champion"
    assert rows[current]["aliases"] == "" and rows[target]["rollback_reason"] == "overpredicts CTR"
    assert rows["2"]["parent"] == "1" and isinstance(rows["2"]["online.auc"], float)


ALIAS_BUTTON = '[data-component-id*="modelversionviewaliaseditor"]'  # "Add" / edit beside "Aliases"
ALIAS_INPUT = 'form[data-component-id="mlflow.edit-aliases-modal"] input[role="combobox"]'
SAVE_BUTTON = 'button[data-component-id="mlflow.edit-aliases-modal.save-button"]'


def test_moving_champion_in_the_mlflow_ui_brings_every_replica_to_that_version(
    deployment: Deployment, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    d = deployment
    current, target = d.other_version()
    ui = WebDriverWait(browser, DEADLINE_S)
    # model page -> the version -> the aliases editor -> "champion" -> save
    browser.get(f"{d.env['CTR_REGISTRY_TRACKING_URI']}/#/models/{d.store.name}")
    version_link = f'a[href$="/models/{d.store.name}/versions/{target}"]'
    ui.until(ec.element_to_be_clickable((By.CSS_SELECTOR, version_link))).click()
    ui.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ALIAS_BUTTON))).click()
    ui.until(ec.element_to_be_clickable((By.CSS_SELECTOR, ALIAS_INPUT))).send_keys("champion", Keys.ENTER)
    save = ui.until(ec.element_to_be_clickable((By.CSS_SELECTOR, SAVE_BUTTON)))
    assert d.store.resolve("champion") == current  # nothing moved before the save

    watch = SwitchWatch.replicas(d.fleet.urls, target, mlflow_alias=lambda: d.store.resolve("champion"))
    start = time.perf_counter()
    save.click()
    seconds = watch.seconds_after(start, timeout_s=DEADLINE_S)
    report("MLflow UI save", seconds)
    assert None not in seconds.values(), f"{seconds}\n{d.fleet.logs()}"
    assert d.store.resolve("champion") == target
    assert set(d.fleet.versions().values()) == {target}


def test_the_version_page_says_what_the_version_learned_and_how_it_compares_without_scrolling(
    deployment: Deployment, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = deployment
    tags = d.store.lineage("2")
    ours = [k for k in tags if not k.startswith("rollback.")]  # a rollback test may have added those
    assert len(ours) <= 15 and tags["parent_version"] == "1"  # was ~50; the rest is in lineage.json
    assert datetime.fromisoformat(tags["event_time_min"]).tzinfo is not None
    browser.get(f"{d.env['CTR_REGISTRY_TRACKING_URI']}/#/models/{d.store.name}/versions/2")
    gate_cell = WebDriverWait(browser, DEADLINE_S).until(
        lambda b: b.find_element(By.XPATH, "//td[contains(., 'what the gate compared')]")
    )
    screenshot = tmp_path / "mlflow-version-page.png"
    browser.save_screenshot(str(screenshot))
    print(f"\nversion page: {screenshot}")
    page = browser.find_element(By.TAG_NAME, "body").text
    for expected in (
        "fine-tuned from version 1",
        f"Gate: {tags['gate_reason']}",
        f"event time {tags['event_time_min']} .. {tags['event_time_max']}",
        "parent: version 1, block 1",
        "examples p0 ",  # the Kafka offsets it learned from
        f"{float(tags['metric.holdout_champion.logloss']):.4f}",  # the parent on this block's holdout
    ):
        assert expected in page, f"{expected!r} not on the version page:\n{page}"
    bottom = browser.execute_script("return arguments[0].getBoundingClientRect().bottom", gate_cell)
    assert bottom <= browser.execute_script("return window.innerHeight"), "the description needs scrolling"


def test_the_trainer_gates_against_a_rolled_back_champion(services: dict[str, str], mlflow_scope) -> None:
    store = MlflowModelStore(
        RegistryConfig(model_name=mlflow_scope.model_name, experiment=mlflow_scope.experiment_name),
        services["CTR_REGISTRY_TRACKING_URI"],
    )
    trainer = publish_versions(store, 2, seed=11)
    rollback(store, "1", "version 2 is miscalibrated", by="it")
    n = trainer.cfg.train_every
    more = synthetic_examples(2 * n, seed=12)

    trainer.cfg.gate_tolerance = -0.5  # no candidate can pass: logloss <= half the champion's
    (refused,) = trainer.add(more[:n])
    assert refused.adopted_version == "1" and refused.parent_version == "1"
    hold = more[n - round(n * trainer.cfg.holdout_fraction) : n]
    labels = np.array([ex.label for ex in hold], dtype=np.float32)
    assert refused.champion == pytest.approx(block_metrics(labels, store.load("1").predict(hold)), rel=1e-6)
    assert not refused.decision.accepted and refused.version is None
    assert store.resolve("champion") == "1" and store.versions() == ["1", "2"]

    trainer.cfg.gate_tolerance = 1.0
    (accepted,) = trainer.add(more[n:])
    assert accepted.adopted_version is None and accepted.decision.accepted and accepted.version == "3"
    assert store.resolve("champion") == "3" and store.lineage("3")["parent_version"] == "1"
