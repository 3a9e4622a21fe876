"""The scrape-time series of every worker of one ``ctr serve``, whichever worker answers the scrape.

With ``serving.workers`` > 1 the workers share one port, so each ``GET /metrics`` reaches one of
them. Request counters and the latency histogram already add up across workers in
prometheus-client's multiprocess files. The series a worker reads from its state at scrape time
(the version it serves, its swaps, its feature fallbacks, its in-flight count) have no such file:
served alone they showed whichever worker answered, so a counter jumped back and forth between
two workers' counts, which Prometheus reads as resets.

Here each worker renders those series, labelled ``worker="<i>"`` (its index: a replaced worker
takes its predecessor's, so a restart is a counter reset of that one series, as Prometheus
expects), into ``<multiprocess folder>/worker-state-<i>.prom`` at most every
:data:`PUBLISH_EVERY_S` from its event loop and at each scrape it answers, by an atomic rename;
the scrape answers every worker's file merged into one family per name.

Why by hand: prometheus-client's multiprocess mode stores only values that change as things happen
(``inc``, ``observe``, ``set``), in files of its own format; it has no hook for a custom collector.
The files here are its own text exposition, read back with its own parser.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from pipeline.core.metrics import Registry

__all__ = ["PUBLISH_EVERY_S", "WorkerStates"]

log = logging.getLogger(__name__)
PUBLISH_EVERY_S = 1.0
_PREFIX = "worker-state-"


class WorkerStates(Collector):
    """Publishes ``registry`` (this worker's scrape-time series) into ``folder`` and collects every
    worker's published series (see the module doc)."""

    def __init__(self, registry: Registry, folder: str | Path, worker: str) -> None:
        self.registry = registry
        self.folder = Path(folder)
        self.path = self.folder / f"{_PREFIX}{worker}.prom"
        self._published_at = float("-inf")

    def publish(self) -> None:
        """Write this worker's series now (atomically: a reader sees the old file or the new one)."""
        text = self.registry.render()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._published_at = time.monotonic()

    def publish_due(self) -> None:
        """:meth:`publish` unless it ran less than :data:`PUBLISH_EVERY_S` ago (the event loop's tick)."""
        if time.monotonic() - self._published_at >= PUBLISH_EVERY_S:
            try:
                self.publish()
            except OSError as exc:  # the folder gone or full: the scrape says so; serving goes on
                self._published_at = time.monotonic()
                log.warning("metrics: cannot publish this worker's series in %s: %s", self.folder, exc)

    def describe(self) -> list[Metric]:
        return []  # the families change between scrapes

    def collect(self) -> Iterator[Metric]:
        self.publish()  # this worker's series as of now; the others' at most PUBLISH_EVERY_S old
        families: dict[str, Metric] = {}
        for path in sorted(self.folder.glob(f"{_PREFIX}*.prom")):
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(family.name, family)
                if merged is not family:
                    merged.samples.extend(family.samples)
        yield from families.values()
