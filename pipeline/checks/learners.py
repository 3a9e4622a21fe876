"""The learner contract (river's ``check_estimator``, for :class:`pipeline.core.types.Learner`)."""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from pipeline.checks._common import fail, impl_name
from pipeline.core.events import LabelledExample
from pipeline.core.types import Learner

__all__ = ["check_learner", "odd_examples", "round_trip"]

LearnerFactory = Callable[[Sequence[LabelledExample], int], Any]


def round_trip(learner: Any, folder: Path) -> Any:
    """What the trainers expose to persist a learner: ``save``/``load`` (weights, optimizer state,
    counters) where the class has both, else ``clone()`` (a learner that is only ever copied)."""
    if hasattr(learner, "save") and hasattr(type(learner), "load"):
        return type(learner).load(learner.save(folder / "learner"))
    return learner.clone()


def odd_examples(examples: Sequence[LabelledExample]) -> list[LabelledExample]:
    """Examples a live stream brings: unseen users, items, feature names and values; features,
    dense inputs or stream features missing; an empty id."""
    base = examples[0]
    imp = base.impression
    new = msgspec.structs.replace(
        imp,
        impression_id="odd-new",
        user_id="u_never_seen",
        item_id="item_never_seen",
        features={**imp.features, "brand_new_field": "x", **dict.fromkeys(imp.features, "never-seen-value")},
        dense={**imp.dense, "brand_new_dense": 3.0},
    )
    bare = msgspec.structs.replace(
        imp, impression_id="odd-bare", user_id="", item_id="", features={}, dense={}
    )
    return [
        msgspec.structs.replace(
            base, impression=new, stream_features={**base.stream_features, "new_stream": 1.0}
        ),
        msgspec.structs.replace(base, impression=bare, stream_features={}),
        msgspec.structs.replace(
            base, impression=msgspec.structs.replace(bare, impression_id="odd-none"), label=0
        ),
    ]


def _probabilities(impl: str, p: Any, n: int, what: str) -> np.ndarray:
    rule = "predict returns one probability in [0, 1] per example"
    if not isinstance(p, np.ndarray) or p.shape != (n,):
        fail(impl, rule, f"{what}: {type(p).__name__} of shape {getattr(p, 'shape', None)}, expected ({n},)")
    if not (np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()):
        fail(impl, rule, f"{what}: values {p[~(np.isfinite(p) & (p >= 0) & (p <= 1))][:5]}")
    return p


def _same(impl: str, rule: str, a: np.ndarray, b: np.ndarray, what: str) -> None:
    if not np.array_equal(a, b):
        fail(impl, rule, f"{what}: max difference {float(np.max(np.abs(a - b))):.3g}")


def check_learner(
    make_learner: LearnerFactory,
    *,
    train: Sequence[LabelledExample] | None = None,
    test: Sequence[LabelledExample] | None = None,
    persist: Callable[[Any, Path], Any] = round_trip,
    name: str | None = None,
) -> None:
    """Check the learners ``make_learner(train, seed)`` builds (it may fit an encoder on ``train``).

    Rules: a :class:`pipeline.core.types.Learner`; ``learn`` returns a finite mean loss and neither
    ``learn`` nor ``predict`` changes its input; ``predict`` returns one probability in [0, 1] per
    example (none for none), the same each time; the same seed on the same data gives bit-identical
    predictions; ``persist`` (default :func:`round_trip`) gives a learner that predicts the same
    and, after learning the same block, still predicts the same as the original (optimizer state
    and counters persist too) while the original is left as it was; unseen and missing features
    (:func:`odd_examples`) neither crash ``learn`` nor ``predict``.
    Default data: 300 training and 100 test examples of :func:`trainers.testing.synthetic_examples`.
    """
    from trainers.testing import synthetic_examples

    train = list(train) if train is not None else synthetic_examples(300, seed=5)
    test = list(test) if test is not None else synthetic_examples(100, seed=6)
    half = len(train) // 2
    learner = make_learner(train, 7)
    impl = impl_name(learner, name)
    if not isinstance(learner, Learner):
        fail(impl, "implements pipeline.core.types.Learner", "needs learn(examples) and predict(examples)")
    _probabilities(impl, learner.predict(test), len(test), "before any learning")
    _probabilities(impl, learner.predict([]), 0, "no examples")

    kept = copy.deepcopy(train)
    loss = learner.learn(train[:half])
    if not isinstance(loss, float) or not math.isfinite(loss):
        fail(impl, "learn returns a finite mean loss", f"returned {loss!r}")
    p = _probabilities(impl, learner.predict(train), len(train), "after learning")
    if train != kept:
        fail(impl, "inputs are not mutated", "learn or predict changed the examples it was given")
    p = _probabilities(impl, learner.predict(test), len(test), "unseen test examples")
    _same(impl, "predict is repeatable", p, learner.predict(test), "scoring twice")

    twin = make_learner(train, 7)
    twin.learn(train[:half])
    _same(impl, "the same seed gives the same result", p, twin.predict(test), "two learners, seed 7")

    with tempfile.TemporaryDirectory(prefix="check-learner-") as tmp:
        copied = persist(learner, Path(tmp))
        _probabilities(impl, copied.predict(test), len(test), "after a state round trip")
        _same(impl, "state round-trips", p, copied.predict(test), "original vs restored")
        learner.learn(train[half:])
        copied.learn(train[half:])
        _same(
            impl,
            "state round-trips",
            learner.predict(test),
            copied.predict(test),
            "both learned one more block",
        )
        fresh = persist(twin, Path(tmp) / "twin")
        fresh.learn(train[half:])
        _same(
            impl,
            "a restored copy is independent",
            p,
            twin.predict(test),
            "learning the copy moved the original",
        )

    odd = odd_examples(train)
    kept_odd = copy.deepcopy(odd)
    try:
        _probabilities(impl, learner.predict(odd), len(odd), "unseen and missing features")
        learner.learn(odd)
        _probabilities(impl, learner.predict(odd + test), len(odd) + len(test), "after learning odd examples")
    except AssertionError:
        raise
    except Exception as exc:
        fail(impl, "unseen or missing features do not crash", f"{type(exc).__name__}: {exc}")
    if odd != kept_odd:
        fail(impl, "inputs are not mutated", "learn or predict changed odd examples")
