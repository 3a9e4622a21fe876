"""Shared set-up of the rollback tests: a registered model with versions 1..3 on the real MLflow
server and two ``ctr serve`` replicas serving its champion (one set-up per module: starting replicas
is the slow part), and headless Chromium for the MLflow UI.

Tests that roll back read the current champion first and pick another version, so they do not
depend on their order.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import RegistryConfig
from serving_bridge.replica_processes import ReplicaProcesses
from trainers.registry import MlflowModelStore
from trainers.testing import publish_versions

REPLICAS = 2
CHROMIUM = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


@dataclass
class Deployment:
    store: MlflowModelStore
    fleet: ReplicaProcesses
    env: dict[str, str]  # what a `ctr` command needs to reach this model, Redis and MLflow

    def other_version(self) -> tuple[str, str]:
        """(the current champion, the oldest version that is not it)."""
        current = self.store.resolve("champion")
        assert current is not None
        return current, next(v for v in self.store.versions() if v != current)


def deployment_env(services: dict[str, str], model: str, experiment: str, tmp: Path) -> dict[str, str]:
    return {
        "CTR_REGISTRY_TRACKING_URI": services["CTR_REGISTRY_TRACKING_URI"],
        "CTR_REGISTRY_MODEL_NAME": model,
        "CTR_REGISTRY_EXPERIMENT": experiment,
        "CTR_DAEMON_REDIS_URL": services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",  # the test db
        "CTR_DAEMON_STATE_DIR": str(tmp / "state"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


@pytest.fixture(name="deployment", scope="module")
def deployment_fixture(
    services: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """Versions 1..3 (champion -> 3) and two replicas that serve the champion; removed after."""
    tag = uuid.uuid4().hex[:12]
    model, experiment = f"it-model-rollback-{tag}", f"it-exp-rollback-{tag}"
    tmp = tmp_path_factory.mktemp("rollback")
    env = deployment_env(services, model, experiment, tmp)
    store = MlflowModelStore(
        RegistryConfig(model_name=model, experiment=experiment), services["CTR_REGISTRY_TRACKING_URI"]
    )
    start = time.perf_counter()
    fleet = None
    try:
        publish_versions(store, 3)
        published = time.perf_counter()
        fleet = ReplicaProcesses.start(REPLICAS, env, tmp / "replicas")
        assert fleet.wait_until_all("3", timeout_s=240), f"replicas never served version 3\n{fleet.logs()}"
        print(
            f"\nset-up: 3 versions published in {published - start:.1f} s, "
            f"{REPLICAS} replicas serving in {time.perf_counter() - published:.1f} s"
        )
        yield Deployment(store, fleet, env)
    finally:
        if fleet is not None:
            fleet.stop()
        try:
            store.client.delete_registered_model(model)
            store.client.delete_experiment(store.experiment_id)
        except Exception as e:  # a failed cleanup must not hide the test's own result
            print(f"warning: mlflow cleanup failed: {e!r}")


def _first(paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if Path(p).is_file()), None)


@pytest.fixture(name="browser", scope="module")
def browser_fixture() -> Iterator[Any]:
    """Headless Chromium driven by Debian's chromedriver, named explicitly so that Selenium Manager
    never runs (it would download a driver); ``deploy/browser.sh`` installs both."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = _first(CHROMIUM) or shutil.which("chromium")
    driver_path = _first(CHROMEDRIVER) or shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.fail("chromium/chromedriver missing: run deploy/browser.sh (make test does)", pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
