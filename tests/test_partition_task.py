"""A partition task's output depends on each stream's order only, not on how fetches interleave."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.core.config import Config
from pipeline.core.events import Click, Conversion, Impression
from pipeline.join.partition_task import PartitionTask

T0 = 1_767_225_600_000


def streams(n: int = 400) -> tuple[list[Impression], list[Click]]:
    rng = random.Random(4)
    imps, clicks = [], []
    for k in range(n):
        ts = T0 + k * 3_000
        user = f"u_{rng.randrange(9)}"
        imps.append(Impression(f"i{k}", ts, user, f"ad{rng.randrange(6)}", {"s": "x"}))
        if rng.random() < 0.2:
            clicks.append(Click(f"c{k}", f"i{k}", ts + rng.randrange(1_000, 1_200_000), user))
    clicks.sort(key=lambda c: c.ts)
    return imps, clicks


def with_conversions(clicks: list[Click], seed: int = 5) -> list[Conversion]:
    """A conversion after some of ``clicks`` (a few late, a few duplicated), in ts order."""
    rng = random.Random(seed)
    out = []
    for c in clicks:
        if rng.random() < 0.3:
            out.append(
                Conversion(
                    f"v{c.impression_id}", c.impression_id, c.ts + rng.randrange(0, 3_000_000), c.user_id
                )
            )
            if rng.random() < 0.1:
                out.append(Conversion(f"w{c.impression_id}", c.impression_id, out[-1].ts + 5, c.user_id))
    out.append(Conversion("v-nowhere", "i-nowhere", clicks[len(clicks) // 2].ts, clicks[0].user_id))
    out.sort(key=lambda v: v.ts)
    return out


def play(
    task: PartitionTask,
    imps: list[Impression],
    clicks: list[Click],
    seed: int,
    start: tuple[int, ...] = (0, 0, 0),
    stop_after: int | None = None,
    conversions: list[Conversion] = (),  # type: ignore[assignment]
) -> list[tuple[str, int, str, int | None]]:
    """Offer the streams in a random interleaving of fetch-sized chunks; return the examples."""
    rng = random.Random(seed)
    events: list[list] = [imps, clicks, list(conversions)]
    kinds = ("impression", "click", "conversion")
    at = [*start, 0, 0][:3]
    out = []
    steps = 0

    def drained() -> list[tuple[str, int, str, int | None]]:
        return [
            (e.example_id, e.label, json.dumps(e.stream_features, sort_keys=True), e.conversion)
            for e in task.drain()
        ]

    while any(at[k] < len(events[k]) for k in range(3)):
        if stop_after is not None and steps >= stop_after:
            break
        steps += 1
        k = rng.choice([k for k in range(3) if at[k] < len(events[k])])
        for _ in range(rng.randrange(1, 30)):
            if at[k] < len(events[k]):
                task.offer(kinds[k], at[k], events[k][at[k]])
                at[k] += 1
        task.run(now=0.0)  # never idle: only the merge decides
        out += drained()
    if stop_after is None:
        task.run(now=1e12)  # the end: every stream idle
        task.joiner.flush()
        out += drained()
    return out


def test_same_streams_any_interleaving_same_examples() -> None:
    imps, clicks = streams()
    runs = [play(PartitionTask(Config(), 0), imps, clicks, seed) for seed in range(4)]
    assert len(runs[0]) == len(imps)
    assert all(r == runs[0] for r in runs[1:])


@pytest.mark.parametrize("stop_after", [3, 20, 45])
def test_resume_from_checkpoint_reemits_identical_examples(stop_after: int) -> None:
    imps, clicks = streams()
    whole = play(PartitionTask(Config(), 0), imps, clicks, seed=1)

    first = PartitionTask(Config(), 0)
    got = play(first, imps, clicks, seed=1, stop_after=stop_after)
    state = json.loads(json.dumps(first.to_state()))
    second = PartitionTask(Config(), 0)
    second.load_state(state, Config())
    offsets = state["next_offsets"]
    got += play(second, imps, clicks, seed=2, start=(offsets["impression"], offsets["click"]))
    assert got == whole


def conversion_config() -> Config:
    cfg = Config()
    cfg.joiner.conversion_window_s = 2_400.0
    return cfg


def test_conversions_any_interleaving_same_examples_and_corrections() -> None:
    imps, clicks = streams()
    convs = with_conversions(clicks)
    runs = [play(PartitionTask(conversion_config(), 0), imps, clicks, s, conversions=convs) for s in range(4)]
    assert all(r == runs[0] for r in runs[1:])
    firsts = [r for r in runs[0] if not r[0].endswith("#cv")]
    corrections = {r[0][:-3]: r[3] for r in runs[0] if r[0].endswith("#cv")}
    assert len(firsts) == len(imps)
    assert {r[0] for r in firsts if r[1] == 1} == set(corrections)  # every click corrected once
    assert all(r[3] == (None if r[1] else 0) for r in firsts)  # a click's conversion: not final yet
    assert 0 < sum(corrections.values()) < len(corrections)


@pytest.mark.parametrize("stop_after", [3, 20, 60])
def test_resume_with_conversions_held_reemits_identical_examples(stop_after: int) -> None:
    cfg = conversion_config()
    imps, clicks = streams()
    convs = with_conversions(clicks)
    whole = play(PartitionTask(cfg, 0), imps, clicks, seed=1, conversions=convs)
    first = PartitionTask(cfg, 0)
    got = play(first, imps, clicks, seed=1, stop_after=stop_after, conversions=convs)
    state = json.loads(json.dumps(first.to_state()))
    second = PartitionTask(cfg, 0)
    second.load_state(state, cfg)
    start = tuple(state["next_offsets"][k] for k in ("impression", "click", "conversion"))
    got += play(second, imps, clicks, seed=2, start=start, conversions=convs)
    assert got == whole
    held = [p for p in state["joiner"]["pending"] if p[2] is not None]  # clicked, correction to come
    assert (len(held) > 0, any(len(p) == 4 for p in held)) == (stop_after >= 20, stop_after >= 60)


def test_conversions_not_joined_change_nothing_but_their_count() -> None:
    """Offered ahead of the merge (no conversion stream), their times must not move the watermark."""
    imps, clicks = streams()
    convs = with_conversions(clicks)
    plain = play(PartitionTask(Config(), 0), imps, clicks, seed=3)
    task = PartitionTask(Config(), 0)
    for k, v in enumerate(convs):  # all of them first: their times are ahead of every impression's
        task.offer("conversion", k, v)
    assert play(task, imps, clicks, seed=3) == plain
    assert task.joiner.stats.ignored_conversions == task.joiner.stats.conversions == len(convs)


def test_a_task_counts_its_users_only() -> None:
    """An item's traffic is in every partition: its counts are the item stage's (features.item_stage)."""
    task = PartitionTask(Config(), 2)
    task.offer("impression", 0, Impression("i1", T0, "u_1", "ad1", {}))
    task.offer("impression", 1, Impression("i2", T0 + 1_000, "u_1", "ad1", {}))
    task.run(now=1e12)
    task.joiner.flush()
    users, items = task.features.drain_dirty()
    assert [r["user_id"] for r in users] == ["u_1"] and users[0]["user_impressions_1h"] == 2 and not items
    second = task.drain()[1]
    assert second.stream_features["user_impressions_1h"] == 1.0  # the first, before the update
    assert not [name for name in second.stream_features if not name.startswith("user_")]
