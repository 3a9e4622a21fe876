"""Streaming features and the Feast feature store they go into.

- :mod:`features.aggregations`: per-user and per-item sliding-window counters (pure Python, the
  joiner's hot path; imports nothing heavy);
- :mod:`features.item_stage`: item counters over all traffic, on examples in the trainer's merge
  order (the same whatever the partition count);
- :mod:`features.repo.definitions`: the Feast entities, push sources and feature views;
- :mod:`features.store`: open the store for a profile, push rows, read them for serving
  (imports Feast, which takes seconds: keep it out of this ``__init__``).

**Feast without typeguard's instrumentation.** Feast decorates its classes (``FeatureView``,
``Entity``, ``Field``, the data sources...) with typeguard's ``@typechecked``, which parses and
recompiles the source of every method when the module is imported: 6 of the 11 s that
``import feast`` took on the 2-core CI machine (cProfile: ``typeguard._decorators.typechecked``),
paid again by every daemon start, restart after a crash, serving worker and CLI command. typeguard
documents the decorator as a development aid that ``python -O`` turns into a no-op; this package
does the same for the decorator alone, before any module of it imports Feast, so that asserts keep
working (``-O`` would strip them). Nothing else in the lock uses typeguard. What is lost is Feast
checking its constructors' argument types at run time; ``tests/test_feature_store.py`` builds every
definition in a process that imported Feast first, with the checks on. Measured: ``import feast``
11.3 s -> 5.1 s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__: list[str] = ["feast_typechecked"]


def _unchecked(target: Any = None, **_: Any) -> Any:
    """``typeguard.typechecked`` as under ``python -O``: the target itself (also when called with
    options first, ``@typechecked(...)``)."""
    return target if target is not None else (lambda decorated: decorated)


def _without_typeguard() -> None:
    if "feast" in sys.modules:  # imported already (by a test module, say): nothing left to save
        return
    try:
        import typeguard
    except ImportError:  # a Feast without typeguard: nothing to turn off
        return
    unchecked: Callable[..., Any] = _unchecked
    typeguard.typechecked = unchecked


_without_typeguard()


def feast_typechecked() -> bool:
    """Did Feast come instrumented by typeguard in this process (imported before this package)?"""
    import feast

    return any("check_argument_types" in n for n in feast.Field.__init__.__code__.co_names)
