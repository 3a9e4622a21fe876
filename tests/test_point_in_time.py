"""No leakage, no skew: what the joiner attaches is what serving read from the Feast online store.

Before each impression the test pushes the features to the embedded Feast store and reads them
back the way a replica does; the example the joiner later emits for that impression must carry
exactly those values (computed before the impression itself updated them).
"""

from __future__ import annotations

import random
from pathlib import Path

from features.aggregations import StreamingFeatures
from features.store import FeatureWriter, OnlineFeatureReader, open_store
from pipeline.core.config import Config
from pipeline.core.events import Click, Impression
from pipeline.join.joiner import Joiner

T0 = 1_767_225_600_000


def test_examples_carry_the_values_serving_read_before_the_impression(tmp_path: Path) -> None:
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
    for n in range(300):  # 300 impressions over 25 minutes: no window expires, every value is exact
        ts = T0 + n * 5_000
        user, item = f"u_{rng.randrange(6)}", f"ad{rng.randrange(5)}"
        writer.push(*features.drain_dirty())
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
    assert max(ex.stream_features["user_clicks_1h"] for ex in examples) >= 5
    # full sequences, ones with clicks past the ttl dropped, and the newest click first
    lengths = [len(ex.stream_features["user_clicked_items"]) for ex in examples]
    assert max(lengths) == 4 and 0 in lengths
    assert any(
        0 < len(ex.stream_features["user_clicked_items"]) < min(4, ex.stream_features["user_clicks_1h"])
        for ex in examples
    )
    for ex in examples:
        times = ex.stream_features["user_clicked_ts"]
        assert times == sorted(times, reverse=True) and all(ex.impression.ts - 600_000 < t for t in times)
