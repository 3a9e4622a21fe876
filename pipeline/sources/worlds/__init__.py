"""Synthetic worlds: the project's simulator and generators of other mechanisms of real ad logs.

Each world is a seeded, deterministic stream of ``ctr simulate``'s events (``seed`` and
``stream(n_impressions)``, what :class:`pipeline.sources.streams.SimulatorSource` replays):

- ``simulator``: :class:`pipeline.sources.simulator.Simulator`, drifting interests (the default);
- ``lifecycle``: ads born and wearing out, position bias, daily seasonality, CTR ~0.5%
  (:mod:`pipeline.sources.worlds.lifecycle`);
- ``lifecycle-cv``: ``lifecycle`` whose clicks convert (a fifth of them, a click-to-conversion delay
  of ~30 min median: :mod:`pipeline.sources.conversions`), for the conversion model;
- ``shifts``: abrupt interest shifts, bursts of new users, clicks past the attribution window,
  CTR ~2-3% (:mod:`pipeline.sources.worlds.shifts`);
- ``catalog``: a churning catalogue whose items' quality wanders, advertisers that carry over to
  new items, an upstream quality score, heavy users, CTR ~7-8% (:mod:`pipeline.sources.worlds.catalog`;
  written after the defaults were chosen, to check them).

The ``simulator`` world converts clicks too when ``simulator.conversion_rate > 0``.

>>> sorted(WORLDS)
['catalog', 'lifecycle', 'lifecycle-cv', 'shifts', 'simulator']
"""

from __future__ import annotations

from pipeline.core.config import SimulatorConfig
from pipeline.sources.conversions import ConversionSpec
from pipeline.sources.simulator import Simulator
from pipeline.sources.worlds.base import World
from pipeline.sources.worlds.catalog import CatalogWorld
from pipeline.sources.worlds.lifecycle import LifecycleParams, LifecycleWorld
from pipeline.sources.worlds.shifts import ShiftsWorld

__all__ = ["WORLDS", "open_world"]

WORLDS = ("simulator", "lifecycle", "lifecycle-cv", "shifts", "catalog")


def open_world(name: str, seed: int, simulator: SimulatorConfig | None = None) -> Simulator | World:
    """The world ``name`` for ``seed``; ``simulator`` configures the ``simulator`` world only."""
    if name == "simulator":
        return Simulator(simulator or SimulatorConfig(), seed)
    if name == "lifecycle":
        return LifecycleWorld(seed)
    if name == "lifecycle-cv":
        return LifecycleWorld(seed, LifecycleParams(conversions=ConversionSpec(rate=0.2)))
    if name == "shifts":
        return ShiftsWorld(seed)
    if name == "catalog":
        return CatalogWorld(seed)
    raise ValueError(f"unknown world {name!r}; known: {', '.join(WORLDS)}")
