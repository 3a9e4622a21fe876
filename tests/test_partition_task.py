"""A partition task's output depends on each stream's order only, not on how fetches interleave."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.core.config import Config
from pipeline.core.events import Click, Impression
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


def play(
    task: PartitionTask,
    imps: list[Impression],
    clicks: list[Click],
    seed: int,
    start: tuple[int, int] = (0, 0),
    stop_after: int | None = None,
) -> list[tuple[str, int, str]]:
    """Offer both streams in a random interleaving of fetch-sized chunks; return the examples."""
    rng = random.Random(seed)
    i, c = start
    out = []
    steps = 0
    while i < len(imps) or c < len(clicks):
        if stop_after is not None and steps >= stop_after:
            break
        steps += 1
        if c >= len(clicks) or (i < len(imps) and rng.random() < 0.5):
            for _ in range(rng.randrange(1, 30)):
                if i < len(imps):
                    task.offer("impression", i, imps[i])
                    i += 1
        else:
            for _ in range(rng.randrange(1, 30)):
                if c < len(clicks):
                    task.offer("click", c, clicks[c])
                    c += 1
        task.run(now=0.0)  # never idle: only the merge decides
        out += [(e.example_id, e.label, json.dumps(e.stream_features, sort_keys=True)) for e in task.drain()]
    if stop_after is None:
        task.run(now=1e12)  # the end: both streams idle
        task.joiner.flush()
        out += [(e.example_id, e.label, json.dumps(e.stream_features, sort_keys=True)) for e in task.drain()]
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
