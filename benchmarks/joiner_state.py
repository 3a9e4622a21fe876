"""The joiner's state against its size: checkpoint cost and restore time, whole-state file vs changelog.

For each size (users), one partition task is filled the joiner's way: one impression per user
(event time 100 ms apart, 50 items, 5 % clicked), so it holds every user's counters (items are
counted by the trainer's item stage since 2026-12-02; the figures before it had 50 item records
more), the pending impressions of the last window and the finalised ids of the dedup horizon. Then, in the
same run:

- **before** (what the joiner did up to this change): every checkpoint writes the whole state as
  one JSON file (``write_json(to_state())``), and a moved task reads it back (``read_json`` +
  ``load_state``);
- **after** (``pipeline/daemons/joiner_state.py``): the task's first checkpoint writes every user
  to the changelog topic in one transaction (once in a task's life); then the task takes
  ``delta`` more events (a few seconds of a partition's input) and the next checkpoint writes only
  the users they touched; a moved task reads its changelog partition and loads it.

Reported per size: the records and seconds of both checkpoints, of both restores, and the whole
file's size. Needs Kafka (``./deploy/services.sh up``); the topic is deleted afterwards.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient

from pipeline.core.checkpoints import read_json, write_json
from pipeline.core.config import Config
from pipeline.core.events import Click, Impression
from pipeline.join.partition_task import PartitionTask
from pipeline.join.task_records import changes, state_from_records, track
from pipeline.kafka.changelog import Changelog

T0 = 1_767_225_600_000


def restored_in(latest: dict[bytes, bytes], cfg: Config) -> float:
    """Seconds to rebuild partition 0's task from the latest record of every key (a moved task)."""
    started = time.perf_counter()
    state = state_from_records(latest, cfg.joiner)
    assert state is not None
    PartitionTask(cfg, 0).load_state(state, cfg)
    return time.perf_counter() - started


def _feed(task: PartitionTask, start: int, n: int, users: int, rng: random.Random, fresh: bool) -> None:
    """``n`` impressions (a new user each when ``fresh``, else random known users), 5 % clicked."""
    clicks = task.streams["click"].offered_upto
    for k in range(start, start + n):
        user = f"u_{k if fresh else rng.randrange(users)}"
        ts = T0 + k * 100
        imp = Impression(f"i{k}", ts, user, f"ad{rng.randrange(50)}", {"s": "x"})
        task.offer("impression", k, imp)
        if rng.random() < 0.05:
            task.offer("click", clicks, Click(f"c{k}", f"i{k}", ts + 50, user))
            clicks += 1
        if k % 1_000 == 999:
            task.run(now=0.0)
    task.run(now=1e12)
    task.drain()
    task.joiner.drain_rejected()
    task.user_rows()  # what the daemon pushes to Redis before a checkpoint


def measure_state(bootstrap: str, sizes: list[int], delta: int = 5_000) -> dict[str, Any]:
    cfg = Config()
    cfg.kafka.bootstrap_servers = bootstrap
    cfg.kafka.transaction_timeout_ms = 900_000  # one first checkpoint of a million users
    out: dict[str, Any] = {"delta_events": delta, "sizes": {}}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for users in sizes:
            topic = f"bench-state-{uuid.uuid4().hex[:8]}"
            changelog = Changelog(cfg.kafka, topic, 1, f"bench-{topic}")
            try:
                out["sizes"][str(users)] = _one_size(cfg, changelog, users, delta)
            finally:
                changelog.close()
                admin.delete_topics([topic])
            row = out["sizes"][str(users)]
            print(
                f"state {users:>9,} users: before: checkpoint {row['before']['checkpoint_s']:6.2f} s "
                f"({row['before']['file_mb']:.0f} MB), restore {row['before']['restore_s']:6.2f} s | after: "
                f"checkpoint {row['after']['checkpoint_s']:6.2f} s ({row['after']['checkpoint_records']:,} "
                f"records; the first {row['after']['first_checkpoint_s']:.1f} s), restore "
                f"{row['after']['restore_s']:6.2f} s ({row['after']['restore_records']:,} records)",
                flush=True,
            )
    finally:
        admin.close()
    return out


def _one_size(cfg: Config, changelog: Changelog, users: int, delta: int) -> dict[str, Any]:
    rng = random.Random(users)
    task = PartitionTask(cfg, 0)
    track(task)
    _feed(task, 0, users, users, rng, fresh=True)
    started = time.perf_counter()
    first = {0: changes(task)}
    changelog.commit(first, {}, None)
    first_s = time.perf_counter() - started

    _feed(task, users, delta, users, rng, fresh=False)  # one checkpoint interval of input
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p0.json"
        started = time.perf_counter()
        write_json(path, task.to_state())
        before_s = time.perf_counter() - started
        size_mb = path.stat().st_size / 1e6
        started = time.perf_counter()
        PartitionTask(cfg, 0).load_state(read_json(path), cfg)
        before_restore_s = time.perf_counter() - started

    started = time.perf_counter()
    records = {0: changes(task)}
    changelog.commit(records, {}, None)
    after_s = time.perf_counter() - started

    started = time.perf_counter()
    latest = changelog.read(0)
    restore_s = time.perf_counter() - started + restored_in(latest, cfg)  # Kafka's read, then the load
    return {
        "users": users,
        "open_impressions": task.joiner.open_impressions,
        "before": {"checkpoint_s": before_s, "file_mb": size_mb, "restore_s": before_restore_s},
        "after": {
            "first_checkpoint_s": first_s,
            "first_checkpoint_records": len(first[0]),
            "checkpoint_s": after_s,
            "checkpoint_records": len(records[0]),
            "restore_s": restore_s,
            "restore_records": len(latest),
        },
    }
