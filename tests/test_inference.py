"""The traced and frozen inference path (``serving.inference = "torchscript"``) scores like eager.

Every model, every batch size a request may have, the bf16 autocast that CUDA runs (here on the
CPU, and on CUDA where there is one), a learner that learns again, a graph that cannot be traced,
and a replica hot-swapping between two versions served through the traced path.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pipeline.core.config import ConfigError, TrainerConfig
from pipeline.core.config_loader import load_config
from pipeline.core.events import Impression
from serving_bridge.replica import Replica
from trainers.encoding import Encoder
from trainers.inference import frozen_scorer, probe_inputs
from trainers.learner import TorchLearner
from trainers.testing import InMemoryModelStore, synthetic_examples

MODELS = ["deepfm", "dcnv2", "lr", "din", "esmm"]
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


def trained(model: str, device: str = "cpu", seed: int = 3, **kw: object) -> TorchLearner:
    base: dict[str, object] = dict(hash_buckets=1 << 12, embedding_dim=8, hidden=(32, 16), batch_size=256)
    cfg = TrainerConfig(**(base | kw), model=model, device=device, seed=seed)  # type: ignore[arg-type]
    examples = synthetic_examples(1_500, seed=seed)
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("model", "min_count"), [(m, 0) for m in MODELS] + [("deepfm", 2), ("dcnv2", 2)])
def test_torchscript_gives_the_eager_probabilities(model: str, min_count: int, device: str) -> None:
    learner = trained(model, device, min_count=min_count)
    traced = learner.clone()
    assert traced.use_inference("torchscript") == "torchscript"
    tol = 1e-6 if device == "cpu" else 1e-3  # CUDA: both in bf16
    for n in (1, 100, 1_000):  # one candidate, a request, the most a request may carry
        examples = synthetic_examples(n, seed=9)
        np.testing.assert_allclose(traced.predict(examples), learner.predict(examples), rtol=0, atol=tol)


@pytest.mark.parametrize("model", MODELS)
def test_the_bf16_trace_cuda_runs_matches_eager_bf16_on_the_cpu(model: str) -> None:
    learner = trained(model)
    dims = {"n_fields": learner.encoder.id_columns, "n_dense": len(learner.encoder.dense_names)}
    cpu = torch.device("cpu")
    scorer = frozen_scorer(learner.model, **dims, device=cpu, amp_dtype=torch.bfloat16)
    assert scorer is not None
    ids, dense = probe_inputs(100, dims["n_fields"], dims["n_dense"], 1 << 12, cpu)
    learner.model.eval()  # as predict runs it (in training mode every id read was admitted first)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = learner.model(ids, dense).float(), scorer(ids, dense).float()
    assert float((torch.sigmoid(got) - torch.sigmoid(want)).abs().max()) < 1e-2
    with torch.inference_mode():  # the casts are in the graph: bf16 whatever the caller's autocast
        assert torch.equal(scorer(ids, dense).float(), got)


def test_learning_again_drops_the_traced_graph_and_copies_score_eagerly() -> None:
    learner = trained("deepfm")
    learner.use_inference("torchscript")
    assert learner.clone().inference == "eager"
    learner.learn(synthetic_examples(1_000, seed=4))
    assert learner.inference == "eager"  # else it would score with the weights before this block
    test = synthetic_examples(200, seed=9)
    before = learner.predict(test)
    learner.use_inference("torchscript")
    np.testing.assert_allclose(learner.predict(test), before, rtol=0, atol=1e-6)


def test_a_model_that_cannot_be_traced_is_served_eagerly_with_a_warning(monkeypatch, caplog) -> None:
    learner = trained("lr")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no tracer in this torch")

    monkeypatch.setattr(torch.jit, "trace", broken)
    with caplog.at_level(logging.WARNING, logger="trainers.inference"):
        assert learner.use_inference("torchscript") == "eager"
    assert "no tracer in this torch" in caplog.text
    assert len(learner.predict(synthetic_examples(5, seed=9))) == 5
    with pytest.raises(ValueError, match="'onnx' is not one of"):
        learner.use_inference("onnx")


def test_a_replica_hot_swaps_between_versions_served_through_torchscript() -> None:
    store = InMemoryModelStore()
    v1, v2 = (store.publish(trained("deepfm", seed=s), {}, {}) for s in (3, 5))
    store.set_alias("champion", v1)
    replica = Replica("r1", store, None, lambda user: user, inference="torchscript")  # type: ignore[arg-type]
    items = [f"item{i}" for i in range(100)]
    assert replica.check_once() and replica.version == v1
    first = replica.score("u_1", {"site": "site1"}, items)
    assert first.version == v1
    store.set_alias("champion", v2)
    assert replica.check_once() and replica.version == v2
    second = replica.score("u_1", {"site": "site1"}, items)
    assert second.version == v2 and replica._current is not None
    assert replica._current.learner.inference == "torchscript"
    np.testing.assert_allclose(first.probabilities, _eager(store, v1, items), rtol=0, atol=1e-6)
    np.testing.assert_allclose(second.probabilities, _eager(store, v2, items), rtol=0, atol=1e-6)
    assert first.probabilities != second.probabilities


def _eager(store: InMemoryModelStore, version: str, items: list[str]) -> list[float]:
    """What the eager learner of ``version`` gives the replica's request (same rows, no features)."""
    learner = store.load(version)
    rows = [Impression("request", 1, "u_1", item, {"site": "site1"}, {}) for item in items]
    return [float(p) for p in learner.predict_rows(rows, [{}] * len(rows))]


def test_serving_inference_is_a_checked_choice_defaulting_to_torchscript() -> None:
    assert load_config(env={}).serving.inference == "torchscript"
    assert load_config(env={"CTR_SERVING_INFERENCE": "eager"}).serving.inference == "eager"
    with pytest.raises(ConfigError, match=r"serving\.inference must be one of"):
        load_config(env={"CTR_SERVING_INFERENCE": "onnx"})


@pytest.mark.parametrize("path", ["eager", "torchscript"])
def test_din_scores_a_short_sequence_over_its_used_columns_as_over_all_of_them(path: str) -> None:
    """A request reads only the sequence columns its user fills (a user with 3 clicks: 3 of 10);
    the probabilities are those of the full-width inputs, where the rest is masked."""
    from trainers.calibration import apply_platt
    from trainers.encoding import SEQUENCE_KEY

    learner = trained("din", sequence_length=10)
    assert learner.use_inference(path) == path
    items = [f"item{i}" for i in range(100)]
    seen: list[int] = []
    learner.model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    for clicked in (["item3", "item7", "item1"], []):
        stream = [{SEQUENCE_KEY: clicked}] * len(items)
        batch = learner.encoder.encode_request("u_1", items, {"site": "site1"}, None, stream)
        assert batch.ids.shape[1] == len(learner.encoder.fields) + 10
        learner.model.eval()
        with torch.inference_mode():
            full = learner.model(torch.from_numpy(batch.ids), torch.from_numpy(batch.dense)).double().numpy()
        want = apply_platt(full, learner.calibration)
        got = learner.predict_request("u_1", items, {"site": "site1"}, stream)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    if path == "eager":  # the traced graph runs without the module's hooks
        assert seen[1::2] == [len(learner.encoder.fields) + 3, len(learner.encoder.fields) + 1]
