"""Prometheus text-format metrics without a client library: counters, gauges, histograms.

Each daemon owns one :class:`Registry`; the serving replica renders it at ``GET /metrics`` on its
own port, the joiner and the trainer on a small HTTP port of their own (:func:`serve_metrics`,
``daemon.joiner_metrics_port`` / ``daemon.trainer_metrics_port``; 0 turns it off).

>>> reg = Registry()
>>> reg.counter("ctr_events_total", "events read", kind="click").inc(2)
>>> print(reg.render().strip())
# HELP ctr_events_total events read
# TYPE ctr_events_total counter
ctr_events_total{kind="click"} 2.0
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "CONTENT_TYPE",
    "Histogram",
    "Registry",
    "Value",
    "export_consumer_state",
    "serve_metrics",
]

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
Labels = tuple[tuple[str, str], ...]


def _fmt_labels(labels: Labels, extra: str = "") -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    parts = [f'{k}="{esc(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Value:
    """One counter or gauge series; ``inc``/``set`` are atomic under the GIL-free lock."""

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def inc(self, by: float = 1.0) -> None:
        with self._lock:
            self.value += by

    def set(self, value: float) -> None:
        self.value = float(value)


class Histogram:
    """Cumulative-bucket histogram (seconds by default), as Prometheus expects it."""

    def __init__(self, buckets: Iterable[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = sorted(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value


class Registry:
    """Named metric families with labelled series, plus callbacks that fill gauges at scrape time."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, dict[Labels, Any]]] = {}
        self._collectors: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def _series(
        self, kind: str, name: str, help: str, labels: dict[str, str], make: Callable[[], Any]
    ) -> Any:
        with self._lock:
            fam = self._families.setdefault(name, (kind, help, {}))
            if fam[0] != kind:
                raise ValueError(f"metrics: {name} is a {fam[0]}, not a {kind}")
            key = tuple(sorted((k, str(v)) for k, v in labels.items()))
            if key not in fam[2]:
                fam[2][key] = make()
            return fam[2][key]

    def counter(self, name: str, help: str, **labels: str) -> Value:
        return self._series("counter", name, help, labels, Value)

    def gauge(self, name: str, help: str, **labels: str) -> Value:
        return self._series("gauge", name, help, labels, Value)

    def histogram(
        self, name: str, help: str, buckets: Iterable[float] = LATENCY_BUCKETS_S, **labels: str
    ) -> Histogram:
        return self._series("histogram", name, help, labels, lambda: Histogram(buckets))

    def clear(self, name: str) -> None:
        """Drop a family's series (a gauge whose label set changes, e.g. the partitions owned)."""
        with self._lock:
            if name in self._families:
                self._families[name][2].clear()

    def on_scrape(self, collect: Callable[[], None]) -> None:
        """``collect`` runs before each render (it sets gauges read from the daemon's state)."""
        self._collectors.append(collect)

    def render(self) -> str:
        for collect in self._collectors:
            try:
                collect()
            except Exception:  # a failed collector (broker away) must not fail the whole scrape
                log.debug("metrics: collector failed", exc_info=True)
        out: list[str] = []
        with self._lock:
            families = {n: (k, h, dict(s)) for n, (k, h, s) in sorted(self._families.items())}
        for name, (kind, help, series) in families.items():
            out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
            for labels, s in sorted(series.items()):
                if isinstance(s, Histogram):
                    acc = 0
                    for bound, n in zip([*s.bounds, math.inf], s.counts, strict=True):
                        acc += n
                        le = 'le="+Inf"' if math.isinf(bound) else f'le="{bound!r}"'
                        out.append(f"{name}_bucket{_fmt_labels(labels, le)} {acc}")
                    out.append(f"{name}_sum{_fmt_labels(labels)} {s.sum}")
                    out.append(f"{name}_count{_fmt_labels(labels)} {acc}")
                else:
                    out.append(f"{name}{_fmt_labels(labels)} {s.value}")
        return "\n".join(out) + "\n"


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


def serve_metrics(registry: Registry, host: str, port: int) -> ThreadingHTTPServer:
    """``GET /metrics`` on ``host:port`` from a daemon thread; returns the server (port 0: any)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "try /metrics")
                return
            body = registry.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would drown the daemon's own log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
