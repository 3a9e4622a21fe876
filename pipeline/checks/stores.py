"""The model-store contract: publish numbers versions, aliases point at published ones, load gives
back the model that was published (or, for a store that keeps no weights, a clear KeyError)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.checks._common import fail, impl_name, within

__all__ = ["check_model_store"]

_UNKNOWN_VERSION = "987654321"  # a version number no store in a test reaches
_UNKNOWN_ALIAS = "contract-check-no-such-alias"


def _default_predict(model: Any) -> np.ndarray:
    from trainers.testing import synthetic_examples

    return np.asarray(model.predict(synthetic_examples(64, seed=99)))


def check_model_store(
    store: Any,
    make_model: Callable[[int], Any],
    *,
    keeps_weights: bool | None = None,
    predict: Callable[[Any], np.ndarray] = _default_predict,
    alias: str = "contract-check",
    timeout_s: float = 60.0,
    name: str | None = None,
) -> None:
    """Check ``store`` against :class:`pipeline.core.types.ModelStore` (plus ``set_alias``).

    ``make_model(seed)`` builds a model (different seeds, different predictions); ``predict(model)``
    scores a fixed probe set (default: 64 synthetic examples). ``keeps_weights`` (default: the
    store's ``keeps_weights`` attribute, else True) False declares a store that only numbers
    versions, whose ``load`` must then raise KeyError with a message naming the version.

    Rules: ``publish`` returns a new ``str`` version id per call and leaves the model as it was;
    ``resolve`` of an unknown alias is None; ``set_alias`` then ``resolve`` gives that version, and
    the alias moves; ``set_alias`` on an unknown version raises an error that names the version
    (promptly: not retried as an outage) and leaves the alias where it was; ``load(v)`` predicts
    exactly as the model published as ``v``; ``load`` of an unknown version raises.
    """
    impl = impl_name(store, name)
    keeps = getattr(store, "keeps_weights", True) if keeps_weights is None else keeps_weights
    models = [make_model(1), make_model(2)]
    before = [predict(m) for m in models]
    if np.array_equal(before[0], before[1]):
        fail(impl, "the check's models differ", "make_model(1) and make_model(2) predict the same")
    versions: list[str] = []
    for i, model in enumerate(models):
        lineage = {
            "block": i + 1,
            "parent_version": versions[-1] if versions else None,
            "position": {"check": i},
        }
        v = store.publish(model, lineage, {"auc": 0.5 + i / 10, "logloss": 0.4})
        if not isinstance(v, str) or not v:
            fail(impl, "publish returns a version id (str)", f"returned {v!r}")
        if v in versions:
            fail(impl, "publish returns a new version id each time", f"{v!r} again after {versions}")
        versions.append(v)
        if not np.array_equal(predict(model), before[i]):
            fail(impl, "publish leaves the model as it was", f"version {v}: its predictions changed")
    if (got := store.resolve(_UNKNOWN_ALIAS)) is not None:
        fail(impl, "resolve of an unknown alias is None", f"resolve({_UNKNOWN_ALIAS!r}) = {got!r}")
    for v in (versions[0], versions[1]):
        store.set_alias(alias, v)
        if (got := store.resolve(alias)) != v:
            fail(
                impl, "resolve gives the version set_alias set", f"set {alias!r} to {v}, resolve says {got!r}"
            )

    def unknown_alias_move() -> None:
        store.set_alias(alias, _UNKNOWN_VERSION)

    rule = "set_alias on an unknown version raises an error naming it"
    try:
        within(timeout_s, unknown_alias_move, impl, rule)
    except AssertionError:
        raise
    except Exception as exc:
        if _UNKNOWN_VERSION not in str(exc):
            fail(impl, rule, f"raised {type(exc).__name__}({exc}) without naming the version")
    else:
        fail(impl, rule, f"set_alias({alias!r}, {_UNKNOWN_VERSION!r}) was accepted silently")
    if (got := store.resolve(alias)) != versions[1]:
        fail(impl, "a refused set_alias leaves the alias where it was", f"{alias!r} now names {got!r}")
    for v, want in zip(versions, before, strict=True):
        if not keeps:
            try:
                store.load(v)
            except KeyError as exc:
                if v not in str(exc):
                    fail(
                        impl, "a store without weights raises KeyError naming the version", f"KeyError({exc})"
                    )
                continue
            fail(impl, "a store without weights raises KeyError on load", f"load({v!r}) returned")
        got_p = predict(within(timeout_s, functools.partial(store.load, v), impl, "load returns promptly"))
        if got_p.shape != want.shape or not np.allclose(got_p, want, rtol=0.0, atol=1e-9):
            diff = float(np.max(np.abs(got_p - want))) if got_p.shape == want.shape else got_p.shape
            fail(impl, "load(v) predicts as the model published as v", f"version {v}: max difference {diff}")
    try:
        within(timeout_s, lambda: store.load(_UNKNOWN_VERSION), impl, "load of an unknown version raises")
    except AssertionError:
        raise
    except Exception:
        return
    fail(impl, "load of an unknown version raises", f"load({_UNKNOWN_VERSION!r}) returned")
