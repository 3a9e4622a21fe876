"""The gauges a replica fills at scrape time (``GET /metrics``), read from its state.

Request counters (``ctr_serving_requests_total{code}``, ``ctr_serving_scored_total{arm,version}``)
and the latency histogram are counted by the request handler as requests happen.
"""

from __future__ import annotations

from typing import Any

__all__ = ["collect_replica_metrics"]


def collect_replica_metrics(server: Any) -> None:
    """Fill ``server.metrics`` from its router's replicas, feature reader and in-flight count."""
    m = server.metrics
    for arm, r in (("champion", server.router.champion), ("challenger", server.router.challenger)):
        if r is None:
            continue
        # champion: ctr_serving_version (the version of this replica); challenger: its own family
        family = "ctr_serving_version" if arm == "champion" else "ctr_serving_challenger_version"
        m.clear(family)  # one series: the version served now
        version = r.version
        if version is not None:
            # the version as a label (registry versions are strings) and, when numeric, as the value
            m.gauge(
                family, f"the model version this replica's {arm} arm serves", replica=r.name, version=version
            ).set(int(version) if version.isdigit() else 1)
        m.counter("ctr_serving_swaps_total", "hot swaps to a new version", replica=r.name, arm=arm).set(
            len(r.swaps)
        )
        m.counter(
            "ctr_serving_load_errors_total", "versions that failed to load", replica=r.name, arm=arm
        ).set(r.load_errors)
        m.counter(
            "ctr_serving_alias_check_errors_total", "registry lookups that failed", replica=r.name, arm=arm
        ).set(r.alias_check_errors)
        if r.swaps:
            m.gauge(
                "ctr_serving_last_swap_timestamp_seconds",
                "wall time of the last swap",
                replica=r.name,
                arm=arm,
            ).set(r.swaps[-1][1])
    champion = server.router.champion
    m.gauge("ctr_serving_ready", "1 once a model is loaded", replica=champion.name).set(int(champion.ready))
    m.gauge("ctr_serving_in_flight", "POST /score requests being processed").set(server.in_flight)
    if server.open_connections is not None:
        m.gauge("ctr_serving_connections", "open client connections").set(server.open_connections())
    features = server.features
    if features is not None:
        m.counter(
            "ctr_serving_feature_fallbacks_total",
            "requests scored with default features (online store failed)",
        ).set(features.fallbacks)
        m.counter("ctr_serving_feature_read_errors_total", "online store reads that failed").set(
            features.failures
        )
        m.gauge("ctr_serving_feature_store_up", "0 while the online store fails").set(int(features.healthy))
