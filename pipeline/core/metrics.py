"""Prometheus metrics on prometheus-client: one :class:`Registry` per daemon, rendered at ``/metrics``.

Two kinds of series, both exposed by prometheus-client's own text exposition:

- **histograms** are prometheus-client :class:`~prometheus_client.Histogram` objects, observed as
  things happen; a histogram without labels exists (all buckets zero) from the moment it is
  declared, so a daemon declares its histograms when it starts;
- **counters and gauges read from the daemon's state** (events read, the version served, the lag a
  checkpoint measured) are :class:`Value` cells that the daemon sets or increments, and that the
  registry's custom collector (:meth:`Registry.collect`) turns into metric families at each scrape,
  after running the ``on_scrape`` callbacks that refresh them.

The serving replica renders its registry at ``GET /metrics`` on its own port, the joiner and the
trainer on a small HTTP port of their own (:func:`serve_metrics`, prometheus-client's server;
``daemon.joiner_metrics_port`` / ``daemon.trainer_metrics_port``; 0 turns it off).

>>> reg = Registry()
>>> reg.counter("ctr_events_total", "events read", kind="click").inc(2)
>>> print(reg.render().strip())
# HELP ctr_events_total events read
# TYPE ctr_events_total counter
ctr_events_total{kind="click"} 2.0
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client import values as prometheus_values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS_S",
    "MULTIPROC_MARKER",
    "Registry",
    "Value",
    "export_consumer_state",
    "multiprocess_dir",
    "serve_metrics",
]

log = logging.getLogger(__name__)
CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
Labels = tuple[tuple[str, str], ...]
disable_created_metrics()  # no *_created series: nothing here reads them, and they double the text


MULTIPROC_MARKER = "CTR_METRICS_MULTIPROC_DIR"


def multiprocess_dir() -> str:
    """The folder where this process's metrics add up with its sibling workers', or "" when off.

    Our own variable, set (with prometheus-client's two) only by ``ctr serve``'s worker parent:
    Feast sets ``PROMETHEUS_MULTIPROC_DIR`` to a temp folder of its own when it is imported, and
    every child process inherits it, so that variable says nothing about whether this process is
    one of several workers (two replicas started from one shell summed each other's counters).
    """
    return os.environ.get(MULTIPROC_MARKER, "")


def _in_process_values_unless_workers() -> None:
    """Keep metric values in this process's memory unless it is one of ``ctr serve``'s workers.

    prometheus-client picks its value class once, from the environment, when it is imported; with
    Feast's ``PROMETHEUS_MULTIPROC_DIR`` set (see :func:`multiprocess_dir`) it stores every value in
    files keyed by name and labels only, so two registries in one process (the embedded profile's
    two replicas, or two apps in a test) read each other's counts. Its metrics read the class at
    construction (``values.ValueClass``): setting it here covers every metric made after import.
    """
    if not multiprocess_dir():
        prometheus_values.ValueClass = prometheus_values.MutexValue


_in_process_values_unless_workers()


class Value:
    """One counter or gauge series, read at scrape time; ``inc`` and ``set`` are thread-safe."""

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def inc(self, by: float = 1.0) -> None:
        with self._lock:
            self.value += by

    def set(self, value: float) -> None:
        self.value = float(value)


class Registry(Collector):
    """A prometheus-client registry holding histograms and this collector of :class:`Value` series."""

    def __init__(self, const_labels: dict[str, str] | None = None) -> None:
        self.const_labels: Labels = tuple(sorted((const_labels or {}).items()))  # on every Value series
        self.prometheus = CollectorRegistry(auto_describe=True)
        self._families: dict[str, tuple[str, str, dict[Labels, Value]]] = {}
        self._histograms: dict[str, tuple[Histogram, tuple[str, ...]]] = {}
        self._collectors: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.prometheus.register(self)

    def _series(self, kind: str, name: str, help: str, labels: dict[str, str]) -> Value:
        with self._lock:
            fam = self._families.setdefault(name, (kind, help, {}))
            if fam[0] != kind:
                raise ValueError(f"metrics: {name} is a {fam[0]}, not a {kind}")
            key = tuple(sorted((k, str(v)) for k, v in labels.items()))
            if key not in fam[2]:
                fam[2][key] = Value()
            return fam[2][key]

    def counter(self, name: str, help: str, **labels: str) -> Value:
        return self._series("counter", name, help, labels)

    def gauge(self, name: str, help: str, **labels: str) -> Value:
        return self._series("gauge", name, help, labels)

    def histogram(
        self, name: str, help: str, buckets: Iterable[float] = LATENCY_BUCKETS_S, **labels: str
    ) -> Any:
        """The prometheus-client histogram ``name`` (declared on first use), or its labelled child."""
        with self._lock:
            if name not in self._histograms:
                names = tuple(sorted(labels))
                hist = Histogram(name, help, names, buckets=tuple(buckets), registry=self.prometheus)
                self._histograms[name] = (hist, names)
            hist, names = self._histograms[name]
        if tuple(sorted(labels)) != names:
            raise ValueError(f"metrics: {name} has labels {list(names)}, not {sorted(labels)}")
        return hist.labels(**labels) if names else hist

    def clear(self, name: str) -> None:
        """Drop a family's series (a gauge whose label set changes, e.g. the partitions owned)."""
        with self._lock:
            if name in self._families:
                self._families[name][2].clear()

    def on_scrape(self, collect: Callable[[], None]) -> None:
        """``collect`` runs before each scrape (it sets values read from the daemon's state)."""
        self._collectors.append(collect)

    def describe(self) -> list[Metric]:
        return []  # families change between scrapes: describe nothing, collect at each scrape

    def collect(self) -> Iterator[Metric]:
        """prometheus-client's custom-collector hook: the :class:`Value` families, refreshed now."""
        for refresh in self._collectors:
            try:
                refresh()
            except Exception:  # a failed collector (broker away) must not fail the whole scrape
                log.debug("metrics: collector failed", exc_info=True)
        with self._lock:
            families = [(n, k, h, dict(s)) for n, (k, h, s) in sorted(self._families.items())]
        for name, kind, help, series in families:
            series = {labels + self.const_labels: cell for labels, cell in series.items()}
            label_names = sorted({k for labels in series for k, _ in labels})
            make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = make(name, help, labels=label_names)
            for labels, cell in sorted(series.items()):
                values = dict(labels)
                family.add_metric([values.get(k, "") for k in label_names], cell.value)
            yield family

    def render(self) -> str:
        return generate_latest(self.prometheus).decode()


def export_consumer_state(
    registry: Registry, daemon: str, lag: dict[str, int], dead_reasons: dict[str, int]
) -> None:
    """The series every consuming daemon reports: lag per partition and dead letters by reason."""
    for reason, n in list(dead_reasons.items()):
        registry.counter(
            "ctr_dead_letters_total", "dead letters by reason", daemon=daemon, reason=reason
        ).set(n)
    registry.clear("ctr_consumer_lag")
    for tp, n in sorted(lag.items()):
        topic, partition = tp.rsplit(":", 1)
        registry.gauge(
            "ctr_consumer_lag", "end offset - next offset", daemon=daemon, topic=topic, partition=partition
        ).set(n)


def serve_metrics(registry: Registry, host: str, port: int) -> Any:
    """``GET /metrics`` on ``host:port`` (prometheus-client's server, a daemon thread); returns the
    server (``server_address``, ``shutdown()``); port 0: any free one."""
    server, _thread = start_http_server(port, host, registry=registry.prometheus)
    return server
