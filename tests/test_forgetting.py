"""Idle users and items are forgotten (``features.forget_idle_s``): the state holds the entities seen
lately, not every one ever seen; their changelog records are deleted; no example changes."""

from __future__ import annotations

import random

import pytest

from features.aggregations import FORGET_EVERY_MS, StreamingFeatures, next_forget_at
from features.item_stage import ItemStage
from pipeline.core.config import Config, FeatureConfig
from pipeline.core.events import Click, Impression, LabelledExample
from pipeline.join.partition_task import PartitionTask
from pipeline.join.task_records import state_from_records, track
from tests.test_partition_task import T0, play
from tests.test_task_records import canonical, checkpoint, offered

DAY = 86_400_000
FORGET_S = 2 * 86_400  # the shortest the default windows allow with a 1-day sequence ttl is 25 h


def churn(days: int = 30, seed: int = 3) -> tuple[list[Impression], list[Click]]:
    """An impression every ~10 minutes: 30% of them to three regulars, the rest to that day's own
    users (40 a day, never seen again); a fifth clicked, within 10 minutes."""
    rng = random.Random(seed)
    imps: list[Impression] = []
    clicks: list[Click] = []
    for day in range(days):
        for slot in range(144):
            ts = T0 + day * DAY + slot * 600_000 + rng.randrange(600_000)
            user = f"r{rng.randrange(3)}" if rng.random() < 0.3 else f"d{day}_{rng.randrange(40)}"
            iid = f"i{len(imps)}"
            imps.append(Impression(iid, ts, user, f"ad{rng.randrange(30)}", {"s": "x"}))
            if rng.random() < 0.2:
                clicks.append(Click(f"c{len(imps)}", iid, ts + rng.randrange(1_000, 600_000), user))
    clicks.sort(key=lambda c: c.ts)
    return imps, clicks


def churn_config(forget_s: int, sequence_length: int = 0) -> Config:
    cfg = Config()
    cfg.features.forget_idle_s = forget_s
    cfg.features.sequence_length = sequence_length
    cfg.features.sequence_ttl_s = 86_400
    return cfg


@pytest.mark.parametrize("sequence_length", [0, 3])
def test_forgetting_idle_users_changes_no_example_and_bounds_the_users_held(sequence_length: int) -> None:
    imps, clicks = churn()
    users = {i.user_id for i in imps}
    kept = PartitionTask(churn_config(0, sequence_length), 0)
    forgetting = PartitionTask(churn_config(FORGET_S, sequence_length), 0)
    assert play(forgetting, imps, clicks, seed=1) == play(kept, imps, clicks, seed=1)
    assert kept.features.users_held == len(users) > 1_000 and kept.features.forgotten == 0
    # the regulars and the users of the last ~3 days (2 idle days, then the next whole day)
    assert forgetting.features.users_held <= 3 + 4 * 40 < len(users) / 5
    assert forgetting.features.forgotten == len(users) - forgetting.features.users_held
    assert forgetting.features.past_forget == 0  # no event came late enough to have missed one
    if sequence_length:
        sequences = forgetting.features.to_state()["sequences"]
        assert sequences and set(sequences) <= set(forgetting.features.to_state()["users"])


def test_a_forgotten_users_record_is_deleted_and_a_restore_continues_exactly() -> None:
    cfg = churn_config(FORGET_S, sequence_length=2)
    imps, clicks = churn(days=12)
    whole = play(PartitionTask(cfg, 0), imps, clicks, seed=1)
    task = PartitionTask(cfg, 0)
    track(task)
    log: dict[bytes, bytes] = {}
    got: list = []
    deleted: set[bytes] = set()
    rng = random.Random(9)
    while sum(offered(task)) < (len(imps) + len(clicks)) * 2 // 3:
        got += play(task, imps, clicks, seed=rng.randrange(99), start=offered(task), stop_after=1)
        if rng.random() < 0.3:
            deleted |= {key for key, value in checkpoint(task, log) if value is None}
    deleted |= {key for key, value in checkpoint(task, log) if value is None}
    # whole days of users were deleted from the log, and the log holds what the task holds
    assert len(deleted) >= 4 * 40
    held = task.features.to_state()["users"]
    assert {key for key in log if key != b"m"} == {b"u" + user.encode() for user in held}
    state = state_from_records(log, cfg.joiner)
    assert state is not None and canonical(state) == canonical(task.to_state())
    again = PartitionTask(cfg, 0)
    again.load_state(state, cfg)
    got += play(again, imps, clicks, seed=5, start=tuple(state["next_offsets"].values()))
    assert got == whole


def test_the_record_of_an_orphan_clicks_user_is_deleted_also_after_a_restore() -> None:
    """A user known only by a click whose impression never came holds nothing once the click is
    orphaned: the daily forgetting deletes its record, and so does the first checkpoint after a
    restore that found the record holding nothing."""
    cfg = Config()
    offsets = {"impression": 0, "click": 0}

    def offer(task: PartitionTask, *events: Impression | Click) -> None:
        for ev in events:
            kind = "impression" if isinstance(ev, Impression) else "click"
            task.offer(kind, offsets[kind], ev)
            offsets[kind] += 1
        task.run(now=1e12)

    def regular(task: PartitionTask, minutes: int) -> None:  # moves the watermark
        offer(task, Impression(f"r{minutes}", T0 + minutes * 60_000, "regular", "ad1"))

    task = PartitionTask(cfg, 0)
    track(task)
    log: dict[bytes, bytes] = {}
    regular(task, 0)
    offer(task, Click("c1", "never", T0 + 60_000, "lonely"))
    assert (b"ulonely", None) not in checkpoint(task, log) and b"ulonely" in log
    regular(task, 20)  # the click's hold (early_click_hold_s, 15 min) ended: orphaned; no whole day yet
    checkpoint(task, log)
    assert b"ulonely" in log  # the record still says "early click"; the restore sees past it
    restored = PartitionTask(cfg, 0)
    state = state_from_records(log, cfg.joiner)
    assert state is not None and state["joiner"]["stale"] == ["lonely"]
    restored.load_state(state, cfg)
    track(restored)
    assert (b"ulonely", None) in checkpoint(restored, dict(log))
    regular(task, 24 * 60 + 1)  # the first whole day: the running task deletes it too
    assert (b"ulonely", None) in checkpoint(task, log) and b"ulonely" not in log


def test_a_lookup_that_may_have_missed_a_forgotten_entity_is_counted() -> None:
    sf = StreamingFeatures(FeatureConfig(forget_idle_s=FORGET_S))
    sf.record_impression("u_old", "ad1", T0)
    sf.record_impression("u_new", "ad2", T0 + 2 * DAY)
    assert sf.forget_idle(T0 + 2 * DAY + 1) == ["u_old"]  # idle 2 days and 1 ms
    assert sf.users_held == 1 and sf.forgotten == 2  # the user and its item
    assert sf.lookup_user("u_new", T0 + 2 * DAY)["user_impressions_1h"] == 1.0
    assert sf.lookup_user("u_other", T0 + 3 * DAY)["user_impressions_1h"] == 0.0  # past every window
    assert sf.past_forget == 0
    # u_old's 24 h window at T0 + 1 h would have held its impression: counted
    assert sf.lookup_user("u_old", T0 + 3_600_000)["user_impressions_24h"] == 0.0
    assert sf.past_forget == 1
    restored = StreamingFeatures.from_state(sf.to_state(), sf.cfg)
    assert (restored.forgotten, restored.forgot_before, restored.past_forget) == (2, sf.forgot_before, 1)
    restored.lookup_user("u_old", T0 + 3_600_000)
    assert restored.past_forget == 2


def test_the_item_stage_forgets_idle_items_and_attaches_the_same_features() -> None:
    rng = random.Random(2)
    examples = []
    for k in range(6_000):  # 25 days; each ad lives 2 days
        ts = T0 + k * 360_000
        item = f"ad{ts // (2 * DAY)}_{rng.randrange(5)}"
        examples.append((f"i{k}", ts, item, int(rng.random() < 0.1)))

    def attached(forget_s: int) -> tuple[list[dict], ItemStage]:
        stage = ItemStage(FeatureConfig(forget_idle_s=forget_s), delay_ms=60_000)
        out = []
        for iid, ts, item, label in examples:
            ex = LabelledExample(Impression(iid, ts, "u", item), label, ts)
            out.append(dict(stage.attach([ex])[0].stream_features))
        return out, stage

    kept, kept_stage = attached(0)
    got, stage = attached(FORGET_S)
    assert got == kept
    held = len(stage.to_state()["features"]["items"])
    assert held <= 3 * 5 < len(kept_stage.to_state()["features"]["items"]) == 13 * 5
    again = ItemStage.from_state(stage.to_state(), stage.stats.cfg, 60_000)
    assert again.to_state() == stage.to_state()


def test_forgetting_sooner_than_the_features_see_is_refused() -> None:
    with pytest.raises(ValueError, match=r"forget_idle_s=86400 would forget.*at least 90000"):
        StreamingFeatures(FeatureConfig(forget_idle_s=86_400))
    with pytest.raises(ValueError, match="at least 608400"):  # the 7-day sequence ttl + 1 h
        StreamingFeatures(FeatureConfig(forget_idle_s=FORGET_S, sequence_length=3))
    StreamingFeatures(FeatureConfig(forget_idle_s=0, sequence_length=3))  # never: always valid


def test_forgetting_is_due_at_whole_days_of_the_watermark() -> None:
    assert next_forget_at(0) == FORGET_EVERY_MS
    assert next_forget_at(FORGET_EVERY_MS - 1) == FORGET_EVERY_MS
    assert next_forget_at(FORGET_EVERY_MS) == 2 * FORGET_EVERY_MS
    assert FORGET_EVERY_MS == DAY and next_forget_at(T0 + 5) == T0 + DAY  # UTC midnights
