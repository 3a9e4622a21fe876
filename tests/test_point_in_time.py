"""No leakage, no skew: what the joiner attaches is what serving read from the Feast online store.

Before each impression the test pushes the features to the embedded Feast store and reads them
back the way a replica does; the example the joiner later emits for that impression must carry
exactly those values (computed before the impression itself updated them). Over hours, too:
windows empty as time passes, and the rows pushed as of the request time say so.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from features.aggregations import StreamingFeatures
from features.store import FeatureWriter, OnlineFeatureReader, open_store
from pipeline.core.config import Config
from pipeline.core.events import Click, Impression
from pipeline.join.joiner import Joiner

T0 = 1_767_225_600_000


# the gaps between impressions: 25 minutes in all, where no window expires; or 3-4 hours where
# users go idle for more than an hour and come back, and every window loses events as time passes
@pytest.mark.parametrize("gaps_ms", [(5_000,), (5_000, 5_000, 60_000, 600_000)], ids=["minutes", "hours"])
def test_examples_carry_the_values_serving_read_before_the_impression(
    tmp_path: Path, gaps_ms: tuple[int, ...]
) -> None:
    cfg = Config()
    cfg.joiner.watermark_lag_s = 0
    cfg.features.sequence_length = 4  # the behaviour sequence too: the last 4 clicks of 10 min
    cfg.features.sequence_ttl_s = 600
    features = StreamingFeatures(cfg.features)
    joiner = Joiner(cfg.joiner, features)
    store = open_store(tmp_path / "feast", "embedded", cfg=cfg.features)
    writer, reader = FeatureWriter(store, cfg.features), OnlineFeatureReader(store, cfg.features)
    rng = random.Random(11)
    served: dict[str, dict[str, object]] = {}
    ts = T0
    for n in range(300):
        ts += rng.choice(gaps_ms)
        users = 6 if len(gaps_ms) == 1 else 6 + n // 60  # later, new users while others idle
        user, item = f"u_{rng.randrange(users)}", f"ad{rng.randrange(5)}"
        writer.push(*features.drain_dirty(ts))  # as of the request: what a replica reads then
        served[f"i{n}"] = reader.get(user, [item], at_ms=ts)[0]
        joiner.process(Impression(f"i{n}", ts, user, item, {"site": "s"}))
        if rng.random() < 0.3:
            joiner.process(Click(f"c{n}", f"i{n}", ts + rng.randrange(1_000, 4_000), user))
    joiner.flush()
    examples = joiner.drain()
    assert len(examples) == 300 and 0 < sum(e.label for e in examples) < 300
    for ex in examples:
        assert ex.stream_features == served[ex.example_id], ex.example_id
    # and the values really moved: later impressions of a busy user see its earlier clicks
    assert max(ex.stream_features["user_clicks_1h"] for ex in examples) >= (5 if len(gaps_ms) == 1 else 3)
    # over hours, users came back after an hour away: their rows were refreshed though they were idle
    back = sum(
        ex.stream_features["user_impressions_1h"] == 0 < ex.stream_features["user_impressions_24h"]
        for ex in examples
    )
    assert (back > 10) if len(gaps_ms) > 1 else back == 0
    # full sequences, ones with clicks past the ttl dropped, and the newest click first (clicks
    # minutes apart fill the sequence; hours apart, the ttl of 10 minutes leaves one at most)
    lengths = [len(ex.stream_features["user_clicked_items"]) for ex in examples]
    assert max(lengths) == (4 if len(gaps_ms) == 1 else 1) and 0 in lengths
    assert any(
        0 < len(ex.stream_features["user_clicked_items"]) < min(4, ex.stream_features["user_clicks_1h"])
        for ex in examples
    )
    for ex in examples:
        times = ex.stream_features["user_clicked_ts"]
        assert times == sorted(times, reverse=True) and all(ex.impression.ts - 600_000 < t for t in times)
