"""In-process test doubles for the trainer side: a synthetic labelled stream and a model store.

>>> exs = synthetic_examples(4, seed=1)
>>> len(exs), sorted(exs[0].impression.features)
(4, ['device', 'site'])
>>> store = InMemoryModelStore()
>>> store.resolve("champion") is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.core.config import TrainerConfig
from pipeline.core.events import Impression, LabelledExample

__all__ = [
    "InMemoryModelStore",
    "publish_versions",
    "small_trainer_config",
    "synthetic_examples",
    "tiny_learner",
]

_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def synthetic_examples(
    n: int,
    seed: int = 0,
    *,
    truth_seed: int = 1234,
    users: int = 300,
    items: int = 60,
    start_index: int = 0,
    bias: float = -2.0,
) -> list[LabelledExample]:
    """``n`` examples whose labels follow a fixed logistic truth over user, item, site and a CTR feature.

    The truth (per-value weights) depends only on ``truth_seed``; ``seed`` draws the impressions and
    labels, so two seeds give disjoint samples of the same distribution (train vs unseen test data).
    Each example also carries its user's behaviour sequence: the items of the user's earlier
    positives in this sample, newest first, at most 5.
    """
    truth = np.random.default_rng(truth_seed)
    w_user = truth.normal(0.0, 1.0, users)
    w_item = truth.normal(0.0, 1.0, items)
    w_site = truth.normal(0.0, 0.7, 8)
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, n)
    i = rng.integers(0, items, n)
    s = rng.integers(0, 8, n)
    d = rng.integers(0, 3, n)
    ctr = rng.random(n) * 0.2
    logit = bias + w_user[u] + w_item[i] + w_site[s] + 5.0 * ctr
    labels = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    out = []
    clicked: dict[int, list[str]] = {}  # per user, the items of its positives so far, newest first
    for k in range(n):
        ts = _START_MS + (start_index + k) * 100
        imp = Impression(
            f"imp{start_index + k}",
            ts,
            f"u_{u[k]}",
            f"item{i[k]}",
            {"site": f"site{s[k]}", "device": f"dev{d[k]}"},
            {"price": float(1 + i[k] % 5)},
        )
        out.append(
            LabelledExample(
                imp,
                int(labels[k]),
                ts + 60_000,
                {
                    "user_ctr_1h": float(ctr[k]),
                    "user_impressions_1h": float(u[k] % 9),
                    "user_clicked_items": list(clicked.get(u[k], ())),  # a behaviour sequence (DIN)
                },
            )
        )
        if labels[k]:
            clicked[u[k]] = [f"item{i[k]}", *clicked.get(u[k], ())][:5]
    return out


class InMemoryModelStore:
    """A model store in a dict, with aliases and lineage like the real one.

    ``publish`` keeps a full copy (optimizer state too, so a trainer resuming from it can learn).
    """

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}
        self.lineages: dict[str, dict[str, Any]] = {}
        self.metrics: dict[str, dict[str, float]] = {}
        self.aliases: dict[str, str] = {}

    def publish(self, model: Any, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        version = str(len(self.models) + 1)
        self.models[version] = model.clone()
        self.lineages[version] = dict(lineage)
        self.metrics[version] = dict(metrics)
        return version

    def set_alias(self, alias: str, version: str) -> None:
        if version not in self.models:
            raise KeyError(f"InMemoryModelStore: no version {version!r}")
        self.aliases[alias] = version

    def resolve(self, alias: str) -> str | None:
        return self.aliases.get(alias)

    def load(self, version: str) -> Any:
        model = self.models[version].clone()
        model.version = version
        return model

    def versions(self) -> list[str]:
        return sorted(self.models, key=int)

    def lineage(self, version: str) -> dict[str, Any]:
        return dict(self.lineages[version])

    def find_by_tag(self, key: str, value: str) -> str | None:
        """The oldest version whose lineage ``key`` is ``value`` (as a tag: compared as strings)."""
        hits = [v for v, lin in self.lineages.items() if key in lin and str(lin[key]) == value]
        return min(hits, key=int, default=None)


def small_trainer_config(**overrides: Any) -> TrainerConfig:
    """A logistic-regression trainer that closes a block every 2,000 examples in about a second on
    one CPU thread; every finite candidate passes its gate (``gate_tolerance`` 1.0)."""
    base: dict[str, Any] = dict(
        model="lr",
        hash_buckets=1 << 14,
        batch_size=256,
        device="cpu",
        threads=1,
        train_every=2_000,
        holdout_fraction=0.2,
        gate_tolerance=1.0,
        seed=3,
    )
    return TrainerConfig(**(base | overrides))


def publish_versions(store: Any, count: int, *, seed: int = 11) -> Any:
    """Run ``count`` blocks of a small trainer into ``store`` (versions 1..count, alias ``champion``
    on the last); the trainer, for more blocks (``synthetic_examples(..., seed=seed + 1)``)."""
    from trainers.incremental import IncrementalTrainer

    cfg = small_trainer_config()
    trainer = IncrementalTrainer(cfg, store)
    examples, n = synthetic_examples(count * cfg.train_every, seed=seed), cfg.train_every
    reports = []
    for i in range(count):  # one block per call, with a Kafka-like position (two partitions)
        offsets = [{f"examples:{p}": b * n // 2 for p in (0, 1)} for b in (i, i + 1)]
        position = {"kafka_offsets_from": offsets[0], "kafka_offsets_to": offsets[1]}
        reports += trainer.add(examples[i * n : (i + 1) * n], position=position)
    versions = [r.version for r in reports]
    if len(versions) != count or None in versions:
        raise RuntimeError(f"publish_versions: expected {count} published blocks, got {versions}")
    return trainer


def tiny_learner(seed: int = 0, n: int = 400) -> Any:
    """A small DeepFM on the CPU fitted on ``n`` synthetic examples: quick to publish, load and swap
    (serving tests and benchmarks). Each ``seed`` gives different weights, so versions differ."""
    from trainers.encoding import Encoder
    from trainers.learner import TorchLearner

    cfg = TrainerConfig(
        hash_buckets=1 << 12, embedding_dim=4, hidden=(8,), batch_size=128, device="cpu", seed=seed, threads=1
    )
    examples = synthetic_examples(n, seed=seed)
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
    learner.learn(examples)
    return learner
