"""Versions prepared for serving by a helper process (serving_bridge.model_cache), against an
embedded MLflow registry (sqlite) and real helper processes: what a worker loads is the version the
registry holds, traced as ``serving.inference`` says; the workers of a host prepare each version
once; failures reach the worker with their reason; a dead helper is replaced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import RegistryConfig, TrainerConfig
from pipeline.core.events import Impression
from serving_bridge import model_cache
from serving_bridge.model_cache import ModelHelper, PreparedModelStore
from serving_bridge.replica import Replica
from trainers.encoding import Encoder
from trainers.learner import SCORER_FILE, TorchLearner
from trainers.registry import MlflowModelStore
from trainers.testing import synthetic_examples

ITEMS = [f"item{i}" for i in range(100)]


def _trained(seed: int) -> TorchLearner:
    cfg = TrainerConfig(hash_buckets=1 << 12, device="cpu", seed=seed)
    examples = synthetic_examples(600, seed=seed)
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner


def _probs(learner: TorchLearner) -> np.ndarray:
    rows = [Impression("request", 1, "u_1", item, {"site": "site1"}, {}) for item in ITEMS]
    return learner.predict_rows(rows, [{}] * len(rows))


def _helper(store: MlflowModelStore) -> ModelHelper:
    return ModelHelper(store.cfg, store.tracking_uri)  # spawned: this process has threads and sqlite


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned helper imports torch and MLflow at nice 19 before its first answer: on a busy
    machine that alone can pass HELPER_PATIENCE_S. Tests of what the helper does wait for it."""
    monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 300.0)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowModelStore, list[str]]:
    out = tmp_path_factory.mktemp("mlflow")
    store = MlflowModelStore.embedded(RegistryConfig(model_name="cache-test", experiment="cache-test"), out)
    versions = [store.publish(_trained(seed), {"block": seed}, {"logloss": 0.5}) for seed in (1, 2, 3)]
    return store, versions


def test_serving_folder_round_trip_keeps_the_traced_probabilities(tmp_path: Path) -> None:
    learner = _trained(4)
    eager = _probs(learner)
    learner.use_inference("torchscript")
    back = TorchLearner.load_for_serving(learner.save_for_serving(tmp_path / "v"))
    assert back.inference == "torchscript" and (tmp_path / "v" / SCORER_FILE).is_file()
    np.testing.assert_allclose(_probs(back), eager, rtol=0, atol=1e-6)
    learner.use_inference("eager")
    plain = TorchLearner.load_for_serving(learner.save_for_serving(tmp_path / "e"))
    assert plain.inference == "eager" and not (tmp_path / "e" / SCORER_FILE).exists()
    np.testing.assert_array_equal(_probs(plain), eager)


def test_workers_of_a_host_prepare_each_version_once_off_the_request_path(
    registry: tuple[MlflowModelStore, list[str]], tmp_path: Path, patient: None
) -> None:
    store, (v1, v2, _) = registry
    first = PreparedModelStore(store, tmp_path / "models", _helper(store).start())
    second = PreparedModelStore(store, tmp_path / "models", _helper(store))  # another worker, same host
    try:
        pid = first.helper.pid
        assert pid is not None and os.getpriority(os.PRIO_PROCESS, pid) == 19
        a = first.load(v1)  # start-up: prepared in the worker itself
        b = first.load(v2)  # a swap: prepared by the helper
        assert (first.prepared_here, first.prepared_by_helper) == (1, 1)
        assert a.inference == b.inference == "torchscript" and b.version == v2
        for version, learner in ((v1, a), (v2, b)):
            np.testing.assert_allclose(_probs(learner), _probs(store.load(version)), rtol=0, atol=1e-6)
        again = second.load(v2)  # found prepared: nothing downloaded, no helper started
        assert (second.prepared_here, second.prepared_by_helper) == (0, 0) and second.helper.pid is None
        np.testing.assert_array_equal(_probs(again), _probs(b))
    finally:
        first.close()
        second.close()


def test_a_failed_prepare_raises_its_reason_and_a_dead_helper_is_replaced(
    registry: tuple[MlflowModelStore, list[str]], tmp_path: Path, patient: None
) -> None:
    store, (v1, v2, v3) = registry
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), inference="eager")
    try:
        cache.load(v1)
        with pytest.raises(RuntimeError, match="preparing version 999 failed in the model helper"):
            cache.load("999")
        assert not (tmp_path / "models" / "999-eager").exists()
        assert cache.load(v2).inference == "eager"  # the same helper goes on
        cache.helper.kill()
        np.testing.assert_array_equal(_probs(cache.load(v3)), _probs(store.load(v3)))
        assert cache.prepared_by_helper == 2
    finally:
        cache.close()


def test_a_starved_helper_is_replaced_and_the_worker_prepares_the_version_itself(
    registry: tuple[MlflowModelStore, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nice-19 helper on a saturated host gets next to no CPU: SIGSTOP is that, to the limit. The
    swap must not wait on it for ever: after HELPER_PATIENCE_S the worker prepares the version."""
    store, (v1, v2, v3) = registry
    monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 1.0)
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), inference="eager")
    try:
        cache.load(v1)
        stopped = cache.helper.pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        np.testing.assert_array_equal(_probs(cache.load(v2)), _probs(store.load(v2)))
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 0)
        assert cache.helper.pid is None  # the stopped helper was killed
        with pytest.raises(ProcessLookupError):
            os.kill(stopped, 0)
        monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 120.0)  # a new helper's start-up
        cache.load(v3)  # the next swap has a new helper again
        assert cache.prepared_by_helper == 1 and cache.helper.pid not in (None, stopped)
    finally:
        cache.close()


def test_a_replica_swaps_through_prepared_versions_and_old_folders_go(
    registry: tuple[MlflowModelStore, list[str]],
    tmp_path: Path,
    patient: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, versions = registry
    monkeypatch.setattr(model_cache, "_EVICT_AFTER_S", -1.0)  # no minute to wait here
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), keep=2)
    replica = Replica("r1", cache, None, lambda user: user)
    try:
        for version in versions:
            store.set_alias("champion", version)
            assert replica.check_once() and replica.version == version
            assert replica.score("u_1", {}, ITEMS[:3]).version == version
        left = sorted(p.name for p in (tmp_path / "models").iterdir() if p.is_dir())
        assert left == [f"{v}-torchscript" for v in versions[-2:]]
    finally:
        cache.close()


def test_a_forked_helper_exits_with_its_worker(tmp_path: Path) -> None:
    """``ctr serve`` forks its helper: the child must not keep the worker's end of the pipe, or it
    outlives a worker that was killed (and holds its listener)."""
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pipeline.core.config import RegistryConfig\n"
            "from serving_bridge.model_cache import ModelHelper\n"
            f"h = ModelHelper(RegistryConfig(model_name='fork-test'), 'sqlite:///{tmp_path}/m.db').start('fork')\n"
            "print(h.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    helper = int(worker.stdout.readline())
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _alive(helper):
        time.sleep(0.1)
    assert not _alive(helper)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # an exited child not reaped yet (its parent is gone: init reaps it)


def test_a_version_prepared_twice_at_once_is_served_not_failed(
    registry: tuple[MlflowModelStore, list[str]], tmp_path: Path
) -> None:
    """A helper given up on (HELPER_PATIENCE_S) may finish after all while its worker prepares the
    same version: the second to finish finds the folder there and uses it (it failed with ENOTEMPTY,
    and the replica stayed on the old version until the next swap)."""
    store, (v1, _, _) = registry
    folder = tmp_path / "models" / f"{v1}-eager"
    folder.parent.mkdir()
    model_cache.prepare(store, v1, folder, "eager", None)  # the helper, late
    first = sorted(p.name for p in folder.iterdir())
    model_cache.prepare(store, v1, folder, "eager", None)  # the worker, later still
    assert sorted(p.name for p in folder.iterdir()) == first
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left
    cache = PreparedModelStore(store, tmp_path / "models", None, inference="eager")  # type: ignore[arg-type]
    np.testing.assert_array_equal(_probs(cache.load(v1)), _probs(store.load(v1)))
