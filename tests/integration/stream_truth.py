"""What a correct joiner must emit for a simulated stream: the shared oracle of the daemon tests."""

from __future__ import annotations

from pipeline.sources.simulator import Simulator
from serving_bridge.server import kafka_partition


def expected_labels(
    sim: Simulator, impressions: int, partitions: int, window_s: float, lag_s: float
) -> dict[str, int]:
    """Impression id -> label for every impression of ``sim.stream(impressions)`` (published by
    user id over ``partitions``) whose attribution window ends before its partition's watermark:
    the partition's newest event time minus ``lag_s``. Only those are final when the stream ends."""
    newest = [0] * partitions
    imps: dict[str, tuple[int, int]] = {}
    for kind, ev in sim.stream(impressions):
        p = kafka_partition(ev["user_id"], partitions)
        newest[p] = max(newest[p], ev["ts"])
        if kind == "impression":
            imps.setdefault(ev["impression_id"], (ev["ts"], p))
    truth = sim.ground_truth(impressions, window_s)
    return {i: truth[i] for i, (ts, p) in imps.items() if ts + window_s * 1000 < newest[p] - lag_s * 1000}
