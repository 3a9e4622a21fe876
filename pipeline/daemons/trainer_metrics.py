"""The trainer daemon's per-block Prometheus series (``ctr trainer``'s ``/metrics``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.metrics import Registry

__all__ = ["collect", "declare", "record_block"]

TRAIN_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300)


def declare(m: Registry) -> Registry:
    """The trainer's histograms, declared when it starts (all buckets zero before the first block)."""
    m.histogram("ctr_trainer_block_train_seconds", "fine-tuning time of one block", TRAIN_BUCKETS_S)
    return m


def record_block(m: Registry, report: Any) -> None:
    """A block's series: blocks and gate refusals by kind, train time, throughput, progressive metrics."""
    decision = "accepted" if report.decision.accepted else "refused"
    m.counter("ctr_trainer_blocks_total", "blocks trained, by gate decision", decision=decision).inc()
    if not report.decision.accepted:
        kind = report.decision.kind or "other"
        m.counter("ctr_trainer_gate_refusals_total", "blocks refused by the gate, by why", kind=kind).inc()
    m.histogram(
        "ctr_trainer_block_train_seconds",
        "fine-tuning time of one block",
        TRAIN_BUCKETS_S,
    ).observe(report.train_seconds)
    m.gauge("ctr_trainer_examples_per_second", "training throughput of the last block").set(
        report.examples_per_s
    )
    m.gauge("ctr_trainer_block_event_time_max_seconds", "newest impression time of the last block").set(
        report.event_time_max / 1000
    )
    for name in ("auc", "logloss"):
        if name in report.online:
            m.gauge(
                f"ctr_trainer_progressive_{name}", "the champion on the last block, before learning it"
            ).set(report.online[name])
    for name in ("auc", "clicked_auc", "clicked_calibration", "logloss"):  # a multi-task champion's
        if f"cvr_{name}" in report.online:  # conversion task
            m.gauge(
                f"ctr_trainer_progressive_cvr_{name}",
                "the champion's conversion task on the last block, before learning it (pCTCVR; "
                "clicked_*: pCVR among clicks)",
            ).set(report.online[f"cvr_{name}"])


def collect(
    m: Registry, counters: Mapping[str, int], version: str | None, retries: Mapping[str, int]
) -> None:
    """The series read at scrape time: examples and duplicates read, the champion's version, MLflow
    calls retried by what they were."""
    m.counter("ctr_trainer_examples_total", "new examples read (duplicates excluded)").set(
        counters["examples"]
    )
    m.counter("ctr_trainer_duplicates_total", "examples dropped as joiner replays").set(
        counters["duplicates"]
    )
    if version is not None and str(version).isdigit():
        m.gauge("ctr_trainer_champion_version", "the registered version the trainer fine-tunes").set(
            int(version)
        )
    for what, n in list(retries.items()):
        m.counter("ctr_trainer_registry_retries_total", "MLflow calls retried, by what", call=what).set(n)
