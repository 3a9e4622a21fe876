"""A partition task's state as changelog records: a restore from the latest record of every key is
the task that wrote them, and a checkpoint writes only what changed."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.core.config import Config
from pipeline.core.events import Click, Conversion, Impression
from pipeline.join.partition_task import PartitionTask
from pipeline.join.task_records import changes, state_from_records, track
from tests.test_partition_task import T0, play, streams, with_conversions


def compacted(log: dict[bytes, bytes], records: list[tuple[bytes, bytes | None]]) -> None:
    """What log compaction keeps: the latest value of every key, tombstones removed."""
    for key, value in records:
        if value is None:
            log.pop(key, None)
        else:
            log[key] = value


def checkpoint(task: PartitionTask, log: dict[bytes, bytes]) -> list[tuple[bytes, bytes | None]]:
    task.drain()  # the daemon sends the examples and pushes the changed rows first
    task.joiner.drain_rejected()
    task.user_rows()  # as of the task's newest event, refreshes included
    records = changes(task)
    compacted(log, records)
    return records


def canonical(state: dict) -> str:
    """``to_state`` with its lists in a fixed order (dict order is not part of the state)."""
    state = json.loads(json.dumps(state))
    state["joiner"].pop("owners", None)  # whose finalised ids: the changelog bookkeeping
    state["joiner"].pop("stale", None)  # records to delete: the changelog bookkeeping too
    state["joiner"]["pending"].sort(key=lambda p: p[0]["impression_id"])
    state["joiner"]["early"].sort(key=lambda c: c["impression_id"])
    return json.dumps(state, sort_keys=True)


def offered(task: PartitionTask) -> tuple[int, ...]:
    return tuple(s.offered_upto for s in task.streams.values())


@pytest.mark.parametrize("stop_after", [3, 20, 45])
@pytest.mark.parametrize(("sequence_length", "conversions"), [(0, False), (3, False), (0, True)])
def test_a_task_restored_from_its_records_continues_exactly(
    stop_after: int, sequence_length: int, conversions: bool
) -> None:
    """Also with behaviour sequences, which live in the user's record beside its counters, and with
    clicked impressions held for their conversions."""
    cfg = Config()
    cfg.features.sequence_length = sequence_length
    cfg.joiner.conversion_window_s = 2_400.0 if conversions else 0.0
    imps, clicks = streams()
    convs = with_conversions(clicks) if conversions else []
    whole = play(PartitionTask(cfg, 0), imps, clicks, seed=1, conversions=convs)

    first = PartitionTask(cfg, 0)
    track(first)
    log: dict[bytes, bytes] = {}
    got: list = []
    rng = random.Random(7)
    for step in range(stop_after):
        got += play(first, imps, clicks, seed=step, start=offered(first), stop_after=1, conversions=convs)
        if rng.random() < 0.5:  # a checkpoint after some polls, not others
            checkpoint(first, log)
    checkpoint(first, log)

    state = state_from_records(log, cfg.joiner)
    assert state is not None
    assert canonical(state) == canonical(first.to_state())
    second = PartitionTask(cfg, 0)
    second.load_state(state, cfg)
    offsets = tuple(state["next_offsets"].values())
    got += play(second, imps, clicks, seed=2, start=offsets, conversions=convs)
    assert got == whole
    longest = max(len(json.loads(features).get("user_clicked_items", ())) for _, _, features, _ in whole)
    assert longest == sequence_length  # sequences were attached (and restored) when kept
    assert any(ex[0].endswith("#cv") and ex[3] == 1 for ex in whole) == conversions


def test_a_checkpoint_writes_the_users_that_changed_not_the_whole_state() -> None:
    rng = random.Random(3)
    task = PartitionTask(Config(), 0)
    track(task)
    log: dict[bytes, bytes] = {}
    for k in range(5_000):  # 5,000 users, one impression each: a state of 5,000 user records
        imp = Impression(f"i{k}", T0 + k * 100, f"u_{k}", f"ad{rng.randrange(50)}", {"s": "x"})
        task.offer("impression", k, imp)
    task.run(now=1e12)
    first = checkpoint(task, log)
    assert len(first) == 5_000 + 1  # every user, the header (items are the item stage's)
    assert checkpoint(task, log) == [first[-1]]  # nothing changed: the header alone
    for k in range(5_000, 5_010):  # ten more impressions of three users
        imp = Impression(f"i{k}", T0 + k * 100, f"u_{k % 3}", "ad1", {"s": "x"})
        task.offer("impression", k, imp)
    task.run(now=1e12)
    assert [key for key, _ in checkpoint(task, log)] == [b"uu_0", b"uu_1", b"uu_2", b"m"]


def test_a_finalised_id_reused_by_another_user_is_written_as_it_is_now() -> None:
    """Finalised entries are kept encoded between checkpoints; an id forgotten and reused by another
    user changes value, and the first user's next record must not restore the old one."""
    task = PartitionTask(Config(), 0)
    track(task)
    log: dict[bytes, bytes] = {}
    minute = 60_000
    offsets = iter(range(100))

    def offer(*events: Impression | Click) -> None:
        for ev in events:
            task.offer("impression" if isinstance(ev, Impression) else "click", next(offsets), ev)
        task.run(now=1e12)

    offer(Impression("b0", T0, "u_b", "ad1"))
    checkpoint(task, log)  # u_b's record is the log's first
    offer(Impression("i1", T0 + minute, "u_a", "ad1"), Impression("b1", T0 + 20 * minute, "u_b", "ad1"))
    checkpoint(task, log)  # i1 finalised (no click): u_a's record holds ["d", "i1", forget_at]
    later = T0 + 120 * minute  # past i1's dedup horizon: forgotten, free to be reused
    offer(Impression("i1", later, "u_b", "ad2"), Click("c1", "i1", later + minute, "u_b"))
    offer(
        Impression("b2", later + 20 * minute, "u_b", "ad1"),
        Impression("a2", later + 20 * minute, "u_a", "ad1"),
    )
    checkpoint(task, log)  # u_a changed (a2), u_b's i1 finalised as a positive
    assert task.joiner.to_state()["done"]["i1"] < 0
    state = state_from_records(log, Config().joiner)
    assert state is not None and canonical(state) == canonical(task.to_state())


def hostile_streams(n: int = 3_000) -> tuple[list[Impression], list[Click]]:
    """Duplicates (soon and past the dedup horizon), clicks before their impression, clicks of
    another user, clicks of no impression, long event-time gaps: every branch of the joiner."""
    rng = random.Random(11)
    imps: list[Impression] = []
    clicks: list[Click] = []
    ts = T0
    for k in range(n):
        ts += rng.choice([1_000, 3_000, 20_000, 600_000, 5_400_000]) if k % 97 == 0 else 2_000
        user = f"u_{rng.randrange(40)}"
        iid = f"i{k}" if rng.random() > 0.05 or not imps else rng.choice(imps).impression_id
        imps.append(Impression(iid, ts, user, f"ad{rng.randrange(9)}", {"s": "x"}))
        r = rng.random()
        if r < 0.15:
            clicks.append(Click(f"c{k}", iid, ts + rng.randrange(-5_000, 1_200_000), user))
        elif r < 0.17:
            clicks.append(Click(f"c{k}", iid, ts + 1_000, f"u_{rng.randrange(40)}"))  # maybe not the user
        elif r < 0.18:
            clicks.append(Click(f"c{k}", f"nothing{k}", ts, user))  # orphan
    clicks.sort(key=lambda c: c.ts)
    return imps, clicks


def hostile_conversions(imps: list[Impression], clicks: list[Click]) -> list[Conversion]:
    """Conversions in and past the window, duplicated, of another user, of an impression never
    clicked, of no impression: every branch of the conversion join."""
    rng = random.Random(12)
    out = with_conversions(clicks, seed=13)
    for c in clicks[::7]:
        out.append(Conversion(f"late{c.click_id}", c.impression_id, c.ts + 3_000_000, c.user_id))
    for c in clicks[3::11]:
        out.append(Conversion(f"other{c.click_id}", c.impression_id, c.ts + 10_000, f"u_{rng.randrange(40)}"))
    for i in imps[5::50]:
        out.append(Conversion(f"view{i.impression_id}", i.impression_id, i.ts + 60_000, i.user_id))
    out.sort(key=lambda v: v.ts)
    return out


@pytest.mark.parametrize("stop_after", [10, 60, 150])
@pytest.mark.parametrize("conversions", [False, True])
def test_restores_hold_for_duplicates_early_orphan_and_foreign_clicks(
    stop_after: int, conversions: bool
) -> None:
    cfg = Config()
    cfg.joiner.conversion_window_s = 1_800.0 if conversions else 0.0
    imps, clicks = hostile_streams()
    convs = hostile_conversions(imps, clicks) if conversions else []
    whole = play(PartitionTask(cfg, 0), imps, clicks, seed=1, conversions=convs)
    task = PartitionTask(cfg, 0)
    track(task)
    log: dict[bytes, bytes] = {}
    got: list = []
    for step in range(stop_after):
        got += play(task, imps, clicks, seed=step, start=offered(task), stop_after=1, conversions=convs)
        if step % 3 == 0:
            checkpoint(task, log)
            state = state_from_records(log, cfg.joiner)
            assert state is not None and canonical(state) == canonical(task.to_state())
    checkpoint(task, log)
    state = state_from_records(log, cfg.joiner)
    assert state is not None
    again = PartitionTask(cfg, 0)
    again.load_state(state, cfg)
    track(again)
    got += play(again, imps, clicks, seed=5, start=tuple(state["next_offsets"].values()), conversions=convs)
    assert got == whole
    stats = again.joiner.stats
    if conversions:  # every branch taken
        assert min(stats.converted, stats.late_conversions, stats.duplicate_conversions) > 0
        assert min(stats.unclicked_conversions, stats.orphan_conversions) > 0


def test_records_without_a_header_are_refused() -> None:
    assert state_from_records({}, Config().joiner) is None
    with pytest.raises(ValueError, match="no header"):
        state_from_records({b"uu_1": b"[1,2,0,0]"}, Config().joiner)
