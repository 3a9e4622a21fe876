"""A replay reads its input ahead when a stream it waits on is sparse or has ended: the tasks then
run as far as the daemon's would (seeing every stream's head), with the same examples in the same
order, and no longer hold a click-less partition's impressions (and every example) until the end."""

from __future__ import annotations

import dataclasses
import gzip
import random
from pathlib import Path

import pytest

from pipeline.core.config import Config
from pipeline.core.events import Click, Impression, LabelledExample
from pipeline.core.partitioning import partition_of
from pipeline.core.types import ManualClock, RawEvent
from pipeline.join import partitioned_join
from pipeline.join.lookahead import Lookahead
from pipeline.join.partition_task import NO_MORE, PartitionTask
from pipeline.join.partitioned_join import PROMISE_EVERY, PartitionedJoin
from pipeline.sources.files import UnreadableLog
from pipeline.sources.jsonl_mapping import write_jsonl
from pipeline.sources.open import open_source
from pipeline.sources.streams import JsonlSource
from tests.test_partitioned_join import Letters, as_kafka_holds, config, fed_as_the_daemon, slow_events

STALLED = 400  # events a task holds before the replay reads ahead (the module's, lowered for speed)


def without_clicks(raw: list[RawEvent], partition: int, keep_every: int = 0) -> list[RawEvent]:
    """The events, with the clicks of ``partition``'s users gone (``keep_every``: all but every n-th)."""
    out, n = [], 0
    for r in raw:
        if r.kind == "click" and partition_of(r.key.decode(), 3) == partition:  # type: ignore[union-attr]
            n += 1
            if not keep_every or n % keep_every:
                continue
        out.append(r)
    return out


def replayed(
    cfg: Config, raw: list[RawEvent], batch: int, ahead: bool
) -> tuple[list[LabelledExample], int, PartitionedJoin]:
    """The examples, the most events one task held after a batch, and the join."""

    def read_again() -> list[list[RawEvent]]:
        copies = [dataclasses.replace(r) for r in raw]
        return [copies[b : b + 1_000] for b in range(0, len(copies), 1_000)]

    join = PartitionedJoin(cfg, ManualClock(0), Letters(), read_again if ahead else None)
    out: list[LabelledExample] = []
    most = 0
    for b in range(0, len(raw), batch):
        out += join.step([dataclasses.replace(r) for r in raw[b : b + batch]])
        most = max(most, *(task.buffered for task in join.tasks))
    return out + join.finish(), most, join


@pytest.fixture(autouse=True)
def low_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitioned_join, "STALLED", STALLED)


# no click at all (its ~2,000 impressions held to the end); one in 40 (a sparse stream: 3 clicks)
@pytest.mark.parametrize(("keep_every", "held"), [(0, 1_500), (40, 800)])
def test_a_partition_without_clicks_no_longer_holds_its_impressions_until_the_end(
    keep_every: int, held: int
) -> None:
    cfg, raw = config(3), without_clicks(slow_events(6_000), 0, keep_every)
    waited, most_waiting, _ = replayed(cfg, raw, 250, ahead=False)
    read, most_read, join = replayed(cfg, raw, 250, ahead=True)
    assert join.lookahead is not None and join.lookahead.events == len(raw)
    assert most_waiting > held and most_read < STALLED + PROMISE_EVERY
    # the same examples in the same order, whatever the batch size, and what the daemon's tasks give
    assert [e.to_json() for e in read] == [e.to_json() for e in waited] and len(read) > 5_000
    small, _, _ = replayed(cfg, raw, 37, ahead=True)
    assert [e.to_json() for e in small] == [e.to_json() for e in read]
    assert join.stats["examples_past_merge_promise"] == 0 and join.stats["events_read_ahead"] == len(raw)
    daemon: list[bytes] = []
    for p, records in as_kafka_holds(raw, 3).items():
        daemon += fed_as_the_daemon(cfg, p, records, random.Random(p))
    assert sorted(e.to_json() for e in read) == sorted(daemon)


def test_conversions_joined_on_a_log_without_any_are_joined_as_the_log_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg, raw = config(3), slow_events(6_000)
    cfg.joiner.conversion_window_s = 600.0
    assert not any(r.kind == "conversion" for r in raw)
    waited, most_waiting, _ = replayed(cfg, raw, 250, ahead=False)
    read, most_read, _ = replayed(cfg, raw, 250, ahead=True)
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.join.partitioned_join"]
    assert len(said) == 1 and "waiting for its conversions," in said[0]  # once, naming the stream
    assert most_waiting > len(raw) // 4 and most_read < STALLED + PROMISE_EVERY
    assert [e.to_json() for e in read] == [e.to_json() for e in waited] and len(read) > 5_000


def test_without_a_stall_the_input_is_not_read_again() -> None:
    cfg, raw = config(3), slow_events(6_000)
    calls = []
    join = PartitionedJoin(cfg, ManualClock(0), Letters(), lambda: calls.append(1) or [])
    for b in range(0, len(raw), 250):
        join.step([dataclasses.replace(r) for r in raw[b : b + 250]])
    join.finish()
    assert join.lookahead is None and calls == [] and join.stats["events_read_ahead"] == 0


def test_a_task_runs_the_other_streams_up_to_the_bound_it_is_told() -> None:
    cfg = config(1)
    imps = [Impression(f"i{n}", 1_000 * n, "u", "a") for n in range(1, 6)]

    def run(bound: int | None) -> list[str]:
        task = PartitionTask(cfg, 0)
        for n, imp in enumerate(imps):
            task.offer("impression", n, imp)
        task.run(now=0.0, at_end=lambda kind: False, ahead=lambda kind: bound)
        return [iid for iid in task.joiner._pending]

    assert run(None) == []  # not known: wait, as before
    assert run(3_000) == ["i1", "i2"]  # a click may still come at 3 s: the impression at 3 s waits
    assert run(NO_MORE) == ["i1", "i2", "i3", "i4", "i5"]  # none comes: every impression
    # a buffered head is taken at its time whatever the bound; the bound holds back the other stream
    task = PartitionTask(cfg, 0)
    task.offer("impression", 0, imps[0])
    task.offer("click", 0, Click("c1", "i1", 1_500, "u"))
    asked: list[str] = []
    task.run(now=0.0, at_end=lambda kind: False, ahead=lambda kind: asked.append(kind) or 0)
    assert [*task.joiner._pending] == ["i1"] and task.buffered == 1 and set(asked) == {"impression"}


def test_a_bound_is_the_earliest_time_still_to_come_and_ignores_events_without_one() -> None:
    raw = [
        RawEvent("click", {"ts": 50}, "f", key=b"u"),
        RawEvent("impression", {"ts": 10}, "f", key=b"u"),
        RawEvent("click", b'{"ts": 30, "features": {"ts": 1}}', "f", key=b"u"),
        RawEvent("click", b"not json", "f", key=b"u"),
        RawEvent("click", {"ts": 40}, "f", key=None),  # no key: partition 0, as the replay routes it
        RawEvent("click", {"ts": 10**30}, "f", key=b"u"),  # refused later; a bound never overflows
    ]
    ahead = Lookahead([raw[:2], raw[2:]], lambda key: 1, ["impression", "click"])
    assert ahead.events == 6
    assert [ahead.bound("click", 1, n) for n in range(7)] == [
        30,
        30,
        30,
        NO_MORE - 1,
        NO_MORE - 1,
        NO_MORE - 1,
        NO_MORE,
    ]
    assert ahead.bound("click", 0, 0) == 40 and ahead.bound("click", 0, 5) == NO_MORE
    assert ahead.bound("impression", 1, 1) == 10 and ahead.bound("impression", 1, 2) == NO_MORE
    assert ahead.bound("conversion", 1, 0) == NO_MORE


def test_a_file_source_reads_again_from_where_it_began_without_moving(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_jsonl(
        [
            (
                "impression",
                {"impression_id": f"i{n}", "ts": 1_767_225_600_000 + n, "user_id": "u", "item_id": "a"},
            )
            for n in range(50)
        ],
        path,
    )
    everything = [r.value for batch in JsonlSource([path], batch_size=7).batches() for r in batch]
    source = JsonlSource([path], batch_size=7)
    batches = source.batches()
    first = [r.value for r in next(batches)] + [r.value for r in next(batches)]
    position = source.snapshot()
    assert [r.value for batch in source.read_again() for r in batch] == everything
    assert source.snapshot() == position and source.clock.now_ms() == position["clock_ms"]
    assert first + [r.value for batch in batches for r in batch] == everything
    resumed = JsonlSource([path], batch_size=7, resume=position)
    rest = [r.value for batch in resumed.batches() for r in batch]
    assert [r.value for batch in resumed.read_again() for r in batch] == rest == everything[14:]


AVAZU = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "avazu_first_hour"


@pytest.mark.skipif(not AVAZU.is_dir(), reason="needs ../shared/datasets")
def test_the_avazu_sample_and_merged_jsonl_files_read_again_as_they_read(tmp_path: Path) -> None:
    imps, clicks = tmp_path / "imps.jsonl", tmp_path / "clicks.jsonl"
    t0 = 1_767_225_600_000
    write_jsonl(
        [
            ("impression", {"impression_id": f"i{n}", "ts": t0 + 10 * n, "user_id": "u", "item_id": "a"})
            for n in range(30)
        ],
        imps,
    )
    write_jsonl(
        [
            ("click", {"click_id": f"c{n}", "impression_id": f"i{n}", "ts": t0 + 10 * n + 5, "user_id": "u"})
            for n in range(0, 30, 3)
        ],
        clicks,
    )
    cfg = Config()
    for source in (
        open_source(cfg, "avazu", AVAZU / "avazu_train_first_9999.csv", seed=1, impressions=0),
        open_source(cfg, "jsonl", imps, seed=1, impressions=0, clicks=clicks),
    ):
        batches = source.batches()
        head = next(batches)
        again = [r.value for batch in source.read_again() for r in batch]  # type: ignore[attr-defined]
        assert again == [r.value for r in head] + [r.value for batch in batches for r in batch]
        assert len(again) > 30


def test_a_damaged_file_reads_again_up_to_the_damage_and_the_replay_still_stops_there(tmp_path: Path) -> None:
    plain = tmp_path / "log.jsonl"
    t0 = 1_767_225_600_000
    write_jsonl(
        [
            ("impression", {"impression_id": f"i{n}", "ts": t0 + n, "user_id": f"u{n}", "item_id": "a"})
            for n in range(3_000)
        ],
        plain,
    )
    cut = tmp_path / "log.jsonl.gz"
    cut.write_bytes(gzip.compress(plain.read_bytes())[:-2_000])  # cut short: the gzip trailer and more
    source = JsonlSource([cut], batch_size=100)
    delivered: list[RawEvent] = []
    with pytest.raises(UnreadableLog):
        for batch in source.batches():
            delivered += batch
    again = [r for batch in source.read_again() for r in batch]
    assert [r.value for r in again] == [r.value for r in delivered] and len(delivered) > 1_000
