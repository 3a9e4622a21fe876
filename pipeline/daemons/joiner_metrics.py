"""``ctr joiner``'s ``/metrics``: counters, rates, the join rate, clicks by outcome, lag, outages.

Rates and the lag are measured on the daemon's thread at each checkpoint; the scrape (on the
metrics thread) only reads them and the counters, never the consumer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.core.metrics import Registry, export_consumer_state
from pipeline.join.stats import click_outcomes, conversion_outcomes

__all__ = ["CHECKPOINT_BUCKETS_S", "CHECKPOINT_PHASES", "JoinerMetrics"]

CHECKPOINT_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 30)
# a checkpoint's steps, in order: producers acknowledged, Feast push, the state transaction
CHECKPOINT_PHASES = ("flush", "features", "state")


class JoinerMetrics:
    """The joiner daemon's series, read from ``daemon`` (counters, tasks, outages, dead reasons)."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon
        self.registry = Registry()
        self.registry.on_scrape(self.collect)
        self.registry.histogram(  # declared now: it exists (all zeros) before the first checkpoint
            "ctr_joiner_checkpoint_seconds",
            "flush + feature push + one transaction of the changed state and the offsets",
            CHECKPOINT_BUCKETS_S,
        )
        self.lag: dict[str, int] = {}  # per partition, refreshed at each checkpoint
        self.rates = {"events": 0.0, "examples": 0.0, "join_rate": 0.0}  # refreshed at each checkpoint
        self.rate_base = (time.monotonic(), 0, 0)  # (when, events, examples) at the last checkpoint
        self.phase_seconds: dict[str, float] = dict.fromkeys(CHECKPOINT_PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time of one checkpoint step (one of CHECKPOINT_PHASES; failed ones too)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phase_seconds[name] += time.monotonic() - started

    def update_rates(self) -> None:
        """Events/s in and examples/s out since the last checkpoint; the share of clicks attributed."""
        now, c = time.monotonic(), self.daemon.counters
        when, events, examples = self.rate_base
        if now - when >= 0.5:
            self.rates["events"] = (c["events"] - events) / (now - when)
            self.rates["examples"] = (c["examples"] - examples) / (now - when)
            self.rate_base = (now, c["events"], c["examples"])
        stats = [t.joiner.stats for t in self.daemon.tasks.values()]
        clicks = sum(s.clicks - s.duplicate_clicks for s in stats)
        self.rates["join_rate"] = sum(s.positives for s in stats) / clicks if clicks else 0.0

    def collect(self) -> None:
        """Scrape time (metrics thread): read the counters and the lag the last checkpoint measured."""
        m, c, d = self.registry, self.daemon.counters, self.daemon
        m.counter("ctr_joiner_events_total", "raw impressions, clicks and conversions read").set(c["events"])
        m.counter("ctr_joiner_examples_total", "labelled examples produced").set(c["examples"])
        m.counter("ctr_joiner_checkpoints_total", "checkpoints (durable output + commit)").set(
            c["checkpoints"]
        )
        for phase, seconds in list(self.phase_seconds.items()):
            m.counter(
                "ctr_joiner_checkpoint_phase_seconds_total",
                "time spent in each step of the checkpoints: flush, features, state",
                phase=phase,
            ).set(seconds)
        r = self.rates
        m.gauge("ctr_joiner_events_per_second", "impressions + clicks read per second").set(r["events"])
        m.gauge("ctr_joiner_examples_per_second", "labelled examples written per second").set(r["examples"])
        m.gauge("ctr_joiner_join_rate", "clicks attributed to an impression / distinct clicks read").set(
            r["join_rate"]
        )
        for what, n in list(d.outages.items()):
            m.counter("ctr_joiner_outages_total", "writes that failed and forced a replay", error=what).set(n)
        export_consumer_state(m, "joiner", self.lag, d.dead_reasons)
        stats = [t.joiner.stats for t in list(d.tasks.values())]
        for outcome, n in click_outcomes(stats).items():
            m.counter(
                "ctr_joiner_clicks_total", "clicks read, by what the join made of them", outcome=outcome
            ).set(n)
        for outcome, n in conversion_outcomes(stats).items():
            m.counter(
                "ctr_joiner_conversions_total",
                "conversions read, by what the join made of them",
                outcome=outcome,
            ).set(n)
        m.counter(
            "ctr_joiner_corrections_total", "clicked examples re-emitted with their conversion label"
        ).set(sum(s.corrections for s in stats))
        m.gauge("ctr_joiner_partitions", "partition tasks held").set(len(d.tasks))
        features = [t.features for t in list(d.tasks.values())]
        m.gauge(
            "ctr_joiner_users_held", "users whose counters the partition tasks hold (the idle are forgotten)"
        ).set(sum(f.users_held for f in features))
        m.counter(
            "ctr_joiner_users_forgotten_total", "users forgotten, idle past features.forget_idle_s"
        ).set(sum(f.forgotten for f in features))
