"""Versions prepared for serving by a helper process (serving_bridge.model_cache), against an
embedded MLflow registry (sqlite) and real helper processes: what a worker loads is the version the
registry holds, traced as ``serving.inference`` says; the workers of a host prepare each version
once; failures reach the worker with their reason; a dead helper is replaced. A multi-task version
(ESMM) prepared and loaded the same way serves its pCVR beside the click probabilities."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from pipeline.core.config import RegistryConfig, TrainerConfig
from pipeline.core.events import Impression, LabelledExample
from serving_bridge import model_cache
from serving_bridge.model_cache import ModelHelper, PreparedModelStore
from serving_bridge.replica import Replica
from trainers.encoding import Encoder
from trainers.learner import SCORER_FILE, TASKS_SCORER_FILE, TorchLearner
from trainers.registry import MlflowModelStore
from trainers.testing import synthetic_examples

ITEMS = [f"item{i}" for i in range(100)]


def _trained(seed: int) -> TorchLearner:
    cfg = TrainerConfig(hash_buckets=1 << 12, device="cpu", seed=seed)
    examples = synthetic_examples(600, seed=seed)
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner


def with_conversions(examples: list[LabelledExample], seed: int = 0) -> list[LabelledExample]:
    """``examples`` as the joiner emits them with conversions joined: a never-clicked impression
    once (conversion 0), a clicked one twice (conversion unknown, then its correction with the final
    conversion); a third of the items convert 60% of their clicks, the others 5%."""
    rng = np.random.default_rng(seed)
    out = []
    for ex in examples:
        if not ex.label:
            out.append(msgspec.structs.replace(ex, conversion=0))
            continue
        rate = 0.6 if int(ex.impression.item_id.removeprefix("item")) % 3 == 0 else 0.05
        end = ex.label_ts + 100_000
        converted = int(rng.random() < rate)
        out += [ex, LabelledExample(ex.impression, 1, end, ex.stream_features, converted, True)]
    return out


def esmm_learner(seed: int = 0, n: int = 600) -> TorchLearner:
    """A small ESMM (clicks and conversions) fitted on ``n`` synthetic impressions with conversions."""
    cfg = TrainerConfig(
        model="esmm", hash_buckets=1 << 10, embedding_dim=4, hidden=(8,), device="cpu", seed=seed, threads=1
    )
    examples = with_conversions(synthetic_examples(n, seed=seed), seed)
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner


class _OneVersion:
    """A store holding one version under ``champion``."""

    def __init__(self, learner: TorchLearner) -> None:
        self.learner = learner

    def resolve(self, alias: str) -> str | None:
        return "1" if alias == "champion" else None

    def load(self, version: str) -> TorchLearner:
        return self.learner


def _probs(learner: TorchLearner) -> np.ndarray:
    rows = [Impression("request", 1, "u_1", item, {"site": "site1"}, {}) for item in ITEMS]
    return learner.predict_rows(rows, [{}] * len(rows))


def _helper(store: MlflowModelStore) -> ModelHelper:
    return ModelHelper(store.cfg, store.tracking_uri)  # spawned: this process has threads and sqlite


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine can starve a nice-19 helper past HELPER_PATIENCE_S: tests of what the
    helper does wait for it (and for its start, :meth:`ModelHelper.wait_ready`)."""
    monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 300.0)


def _started(helper: ModelHelper) -> ModelHelper:
    """``helper``, its start (imports, warm-up) done: until then a worker prepares versions itself."""
    assert helper.wait_ready(300.0)
    return helper


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowModelStore, list[str]]:
    out = tmp_path_factory.mktemp("mlflow")
    store = MlflowModelStore.embedded(RegistryConfig(model_name="cache-test", experiment="cache-test"), out)
    versions = [store.publish(_trained(seed), {"block": seed}, {"logloss": 0.5}) for seed in (1, 2, 3, 4)]
    store.set_alias("champion", versions[0])  # what a helper warms up with
    return store, versions


def test_a_helper_still_starting_is_not_waited_for_nor_replaced(tmp_path: Path, patient: None) -> None:
    """A fresh deployment: replicas start before the trainer's first version. The helper does not
    say it is ready unwarmed (its first prepare would pay ~7 s of imports at nice 19, past the
    patience on a busy host); it asks for the champion until there is one and warms up with it.
    Until it is ready it is not asked: the worker prepares versions itself at once (it waited
    HELPER_PATIENCE_S for a helper still importing), and the helper is not replaced."""
    store = MlflowModelStore.embedded(RegistryConfig(model_name="fresh", experiment="fresh"), tmp_path / "r")
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), inference="eager")
    starting = cache.helper.pid
    try:
        first, second, third = (store.publish(_trained(s), {"block": s}, {"logloss": 0.5}) for s in (1, 2, 3))
        cache.load(first)  # start-up: prepared in the worker
        np.testing.assert_array_equal(
            _probs(cache.load(second)), _probs(store.load(second))
        )  # no champion yet
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 0) and cache.helper.pid == starting
        store.set_alias("champion", second)
        _started(cache.helper)  # warmed up with it
        np.testing.assert_array_equal(_probs(cache.load(third)), _probs(store.load(third)))
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 1) and cache.helper.pid == starting
    finally:
        cache.close()


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
    store, (v1, v2, *_) = registry
    first = PreparedModelStore(store, tmp_path / "models", _started(_helper(store).start()))
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
    store, (v1, v2, v3, v4) = registry
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), inference="eager")
    try:
        cache.load(v1)  # start-up: prepared in the worker
        _started(cache.helper)
        with pytest.raises(RuntimeError, match="preparing version 999 failed in the model helper"):
            cache.load("999")
        assert not (tmp_path / "models" / "999-eager").exists()
        assert cache.load(v2).inference == "eager"  # the same helper goes on
        killed = cache.helper.pid
        cache.helper.kill()
        np.testing.assert_array_equal(_probs(cache.load(v3)), _probs(store.load(v3)))
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 1)  # v3: not waiting on a dead one
        assert cache.helper.pid not in (None, killed)  # its successor, started at once
        _started(cache.helper)
        np.testing.assert_array_equal(_probs(cache.load(v4)), _probs(store.load(v4)))
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 2)
    finally:
        cache.close()


def test_a_starved_helper_is_replaced_and_the_worker_prepares_the_version_itself(
    registry: tuple[MlflowModelStore, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nice-19 helper on a saturated host gets next to no CPU: SIGSTOP is that, to the limit. The
    swap must not wait on it for ever: after HELPER_PATIENCE_S the worker prepares the version."""
    store, (v1, v2, v3, _) = registry
    monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 1.0)
    cache = PreparedModelStore(store, tmp_path / "models", _helper(store).start(), inference="eager")
    try:
        cache.load(v1)
        stopped = _started(cache.helper).pid
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        np.testing.assert_array_equal(_probs(cache.load(v2)), _probs(store.load(v2)))
        assert (cache.prepared_here, cache.prepared_by_helper) == (2, 0)
        with pytest.raises(ProcessLookupError):  # the stopped helper was killed ...
            os.kill(stopped, 0)
        assert cache.helper.pid not in (None, stopped)  # ... and its successor started at once
        _started(cache.helper)
        monkeypatch.setattr(model_cache, "HELPER_PATIENCE_S", 120.0)  # its first prepare, on a busy host
        cache.load(v3)  # the next swap has the new helper
        assert cache.prepared_by_helper == 1
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
    store, (v1, *_) = registry
    folder = tmp_path / "models" / f"{v1}-eager"
    folder.parent.mkdir()
    model_cache.prepare(store, v1, folder, "eager", None)  # the helper, late
    first = sorted(p.name for p in folder.iterdir())
    model_cache.prepare(store, v1, folder, "eager", None)  # the worker, later still
    assert sorted(p.name for p in folder.iterdir()) == first
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left
    cache = PreparedModelStore(store, tmp_path / "models", None, inference="eager")  # type: ignore[arg-type]
    np.testing.assert_array_equal(_probs(cache.load(v1)), _probs(store.load(v1)))


def _score_both(replica: Replica, learner: TorchLearner) -> None:
    """The replica's answer for 20 candidates: pCTR is ``predict_request``'s, pCVR column 1 of
    ``predict_request_tasks`` (what ``learner``, the version it serves, gives for the request)."""
    items, ctx = ITEMS[:20], {"site": "site1", "device": "dev0"}
    scored = replica.score("u_1", ctx, items)
    assert scored.conversions is not None and len(scored.conversions) == len(scored.probabilities) == 20
    assert all(0.0 <= p <= 1.0 for p in scored.conversions)
    stream = [{}] * len(items)
    tasks = learner.predict_request_tasks("u_1", items, ctx, stream)
    assert scored.conversions == [float(p) for p in tasks[:, 1]]
    clicks = learner.predict_request("u_1", items, ctx, stream)
    if learner.inference == "eager":
        assert scored.probabilities == [float(p) for p in clicks]
    else:  # two traced graphs (forward, task logits): the same arithmetic, but not pinned bit for bit
        np.testing.assert_allclose(scored.probabilities, clicks, rtol=0, atol=1e-6)
    assert len(set(scored.conversions)) > 1  # the conversion tower learned something per item


@pytest.mark.parametrize("inference", ["eager", "torchscript"])
def test_an_esmm_version_served_by_a_replica_answers_pctr_and_pcvr(tmp_path: Path, inference: str) -> None:
    trained = esmm_learner(seed=2)
    assert trained.use_inference(inference) == inference
    served = TorchLearner.load_for_serving(trained.save_for_serving(tmp_path / "v"))
    assert served.inference == inference and served.multi_task
    assert (tmp_path / "v" / TASKS_SCORER_FILE).is_file() == (inference == "torchscript")
    replica = Replica("r1", _OneVersion(served), None, lambda user: user)
    assert replica.check_once() and replica.load_errors == 0  # the warm-up ran both paths
    _score_both(replica, served)
    np.testing.assert_allclose(  # and it is the trained model's
        replica.score("u_1", {}, ITEMS[:5]).conversions,
        trained.predict_request_tasks("u_1", ITEMS[:5], {}, [{}] * 5)[:, 1],
        rtol=0,
        atol=1e-6,
    )


def test_a_click_only_version_answers_no_conversions() -> None:
    replica = Replica("r1", _OneVersion(_trained(6)), None, lambda user: user)
    assert replica.check_once()
    scored = replica.score("u_1", {}, ITEMS[:3])
    assert scored.conversions is None and len(scored.probabilities) == 3


def test_a_published_esmm_version_prepared_for_serving_answers_pcvr(tmp_path: Path) -> None:
    """The path of ``ctr serve``: registry -> prepared (traced) folder -> replica."""
    store = MlflowModelStore.embedded(RegistryConfig(model_name="esmm-cache", experiment="esmm"), tmp_path)
    version = store.publish(esmm_learner(seed=3), {"block": 1}, {"logloss": 0.5})
    store.set_alias("champion", version)
    cache = PreparedModelStore(store, tmp_path / "models", None, inference="torchscript")  # type: ignore[arg-type]
    replica = Replica("r1", cache, None, lambda user: user)
    assert replica.check_once() and cache.prepared_here == 1  # the first load: prepared in the worker
    assert (tmp_path / "models" / f"{version}-torchscript" / TASKS_SCORER_FILE).is_file()
    _score_both(replica, replica._current.learner)  # type: ignore[union-attr]
    eager = store.load(version).predict_request_tasks("u_1", ITEMS[:20], {}, [{}] * 20)
    np.testing.assert_allclose(replica.score("u_1", {}, ITEMS[:20]).conversions, eager[:, 1], atol=1e-6)
