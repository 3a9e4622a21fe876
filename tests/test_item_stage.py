"""The item stage: global item statistics, point in time, whatever the partition count."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from features.item_stage import ItemStage
from features.store import FeatureWriter, OnlineFeatureReader, open_store
from pipeline.core.config import Config
from pipeline.core.events import Impression, LabelledExample
from pipeline.core.types import RawEvent
from pipeline.sources.simulator import Simulator
from tests.test_partitioned_join import config, replay

T0 = 1_767_225_600_000


def delay_ms(cfg: Config) -> int:
    return int((cfg.joiner.attribution_window_s + cfg.joiner.watermark_lag_s) * 1_000)


def item_features(examples: list[LabelledExample]) -> dict[str, dict[str, float]]:
    return {
        e.example_id: {k: v for k, v in e.stream_features.items() if k.startswith("item_")} for e in examples
    }


@pytest.fixture(scope="module")
def merged() -> dict[int, list[LabelledExample]]:
    """The simulator's stream (3 h of event time, 300 items) through the replay's joiner with 1 and
    with 3 partitions."""
    sim_cfg = dataclasses.replace(Config().simulator, events_per_s=1.0, items=300)
    raw = [RawEvent(k, e, "sim", key=e["user_id"].encode()) for k, e in Simulator(sim_cfg, 5).stream(10_800)]
    return {p: replay(config(p), raw, 700)[0] for p in (1, 3)}


def test_item_features_are_the_same_with_1_and_3_partitions(merged: dict[int, list[LabelledExample]]) -> None:
    one, three = merged[1], merged[3]
    assert {e.example_id for e in one} == {e.example_id for e in three}  # the same examples,
    assert not any(item_features(one).values())  # the joiner's carry no item features
    cfg = config(1)
    for examples in (one, three):
        ItemStage(cfg.features, delay_ms(cfg)).attach(examples)
    assert item_features(one) == item_features(three)
    seen = [f for f in item_features(one).values() if f["item_impressions_24h"] > 0]
    assert len(seen) > len(one) // 2 and any(f["item_clicks_24h"] > 0 for f in seen)


def test_an_example_counts_exactly_the_examples_of_its_item_before_its_time_minus_the_delay(
    merged: dict[int, list[LabelledExample]],
) -> None:
    cfg = config(3)
    d, bucket_ms, span = delay_ms(cfg), cfg.features.bucket_s * 1_000, 3_600 // cfg.features.bucket_s
    examples = merged[3]
    truth = [(e.impression.item_id, e.impression.ts, e.label) for e in examples]
    ItemStage(cfg.features, d).attach(examples)
    for e in examples[:: len(examples) // 300]:
        visible = e.impression.ts - d
        first_bucket = visible // bucket_ms - span + 1  # the 1 h window: its buckets up to `visible`'s
        before = [y for item, ts, y in truth if item == e.impression.item_id and ts < visible]
        inside = [
            y
            for item, ts, y in truth
            if item == e.impression.item_id and ts < visible and ts // bucket_ms >= first_bucket
        ]
        f = e.stream_features
        assert (f["item_impressions_1h"], f["item_clicks_1h"]) == (len(inside), sum(inside))
        assert f["item_impressions_24h"] <= len(before)


def test_a_checkpoint_in_the_middle_changes_nothing(merged: dict[int, list[LabelledExample]]) -> None:
    cfg = config(3)
    examples = merged[3]
    whole = ItemStage(cfg.features, delay_ms(cfg))
    want = item_features(whole.attach([LabelledExample(e.impression, e.label, e.label_ts) for e in examples]))
    half = len(examples) // 2
    first = ItemStage(cfg.features, delay_ms(cfg))
    got = [LabelledExample(e.impression, e.label, e.label_ts) for e in examples]
    first.attach(got[:half])
    state = json.loads(json.dumps(first.to_state()))
    ItemStage.from_state(state, cfg.features, delay_ms(cfg)).attach(got[half:])
    assert item_features(got) == want
    with pytest.raises(ValueError, match="delay_ms"):
        ItemStage.from_state(state, cfg.features, delay_ms(cfg) + 1)


def test_examples_carry_the_item_values_serving_read_before_the_impression(tmp_path: Path) -> None:
    """Before each impression the stage's rows are pushed to the Feast store and read back as a
    replica reads them; the example must carry those item values (the stage's own definition)."""
    cfg = Config()
    cfg.joiner.attribution_window_s, cfg.joiner.watermark_lag_s = 60.0, 0.0  # D = 60 s
    stage = ItemStage.of(cfg)
    store = open_store(tmp_path / "feast", "embedded", cfg=cfg.features)
    writer, reader = FeatureWriter(store, cfg.features), OnlineFeatureReader(store, cfg.features)
    rng = random.Random(11)
    served: dict[str, dict[str, float]] = {}
    examples = []
    for n in range(300):  # 300 impressions over 25 minutes: no window expires, every value is exact
        ts = T0 + n * 5_000
        imp = Impression(f"i{n}", ts, f"u_{rng.randrange(6)}", f"ad{rng.randrange(5)}")
        stage.advance(ts - stage.delay_ms)  # what the trainer has counted when the impression comes
        writer.push([], stage.drain_rows())
        row = reader.get(imp.user_id, [imp.item_id])[0]
        served[imp.impression_id] = {k: v for k, v in row.items() if k.startswith("item_")}
        examples += stage.attach([LabelledExample(imp, int(rng.random() < 0.3), ts)])
    for ex in examples:
        assert item_features([ex])[ex.example_id] == served[ex.example_id], ex.example_id
    assert max(ex.stream_features["item_clicks_1h"] for ex in examples) >= 5  # the values moved


def test_a_correction_gets_its_first_emissions_item_features_and_counts_nothing() -> None:
    cfg = Config()
    cfg.joiner.conversion_window_s = 3_600.0
    d = delay_ms(cfg)

    def ex(i: str, ts: int, label: int, **kw: object) -> LabelledExample:
        return LabelledExample(Impression(i, T0 + ts, "u", "ad-1"), label, T0 + ts, {}, **kw)  # type: ignore[arg-type]

    def seen(examples: list[LabelledExample]) -> list[float]:
        return [e.stream_features["item_impressions_1h"] for e in examples]

    stage = ItemStage.of(cfg)
    assert seen(stage.attach([ex("a", 0, 1), ex("b", 1_000, 0, conversion=0), ex("c", d + 5_000, 1)])) == [
        0.0,
        0.0,
        2.0,  # a and b
    ]
    state = json.loads(json.dumps(stage.to_state()))  # held across a checkpoint
    stage = ItemStage.from_state(state, cfg.features, d, corrections=True)
    assert seen(stage.attach([ex("z", 2 * d + 10_000, 0, conversion=0)])) == [3.0]  # a, b, c
    assert seen(stage.attach([ex("c", d + 5_000, 1, conversion=1, correction=True)])) == [2.0]  # as c was
    assert seen(stage.attach([ex("y", 3 * d + 20_000, 0, conversion=0)])) == [
        4.0
    ]  # the correction: not counted
    assert list(stage.to_state()["to_correct"]) == ["a"]  # c's entry went with its correction
