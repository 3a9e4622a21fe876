"""Synthetic worlds: the project's simulator and generators of other mechanisms of real ad logs.

Each world is a seeded, deterministic stream of ``ctr simulate``'s events (``seed`` and
``stream(n_impressions)``, what :class:`pipeline.sources.streams.SimulatorSource` replays):

- ``simulator``: :class:`pipeline.sources.simulator.Simulator`, drifting interests (the default);
- ``lifecycle``: ads born and wearing out, position bias, daily seasonality, CTR ~0.5%
  (:mod:`pipeline.sources.worlds.lifecycle`);
- ``shifts``: abrupt interest shifts, bursts of new users, clicks past the attribution window,
  CTR ~2-3% (:mod:`pipeline.sources.worlds.shifts`).

>>> sorted(WORLDS)
['lifecycle', 'shifts', 'simulator']
"""

from __future__ import annotations

from pipeline.core.config import SimulatorConfig
from pipeline.sources.simulator import Simulator
from pipeline.sources.worlds.base import World
from pipeline.sources.worlds.lifecycle import LifecycleWorld
from pipeline.sources.worlds.shifts import ShiftsWorld

__all__ = ["WORLDS", "open_world"]

WORLDS = ("simulator", "lifecycle", "shifts")


def open_world(name: str, seed: int, simulator: SimulatorConfig | None = None) -> Simulator | World:
    """The world ``name`` for ``seed``; ``simulator`` configures the ``simulator`` world only."""
    if name == "simulator":
        return Simulator(simulator or SimulatorConfig(), seed)
    if name == "lifecycle":
        return LifecycleWorld(seed)
    if name == "shifts":
        return ShiftsWorld(seed)
    raise ValueError(f"unknown world {name!r}; known: {', '.join(WORLDS)}")
