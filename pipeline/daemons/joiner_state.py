"""The joiner daemon's partition tasks and their state, kept in a compacted changelog topic.

A task's state lives in partition ``p`` of the changelog (:mod:`pipeline.kafka.changelog`), as keyed
records (:mod:`pipeline.join.task_records`), not on the machine that runs it:

- :meth:`TaskStates.open` builds the task of partition ``p`` from the latest committed record of
  every key: the same state whichever process (or machine) opens it, after a restart, a rebalance
  or the loss of the machine that ran it before;
- :meth:`TaskStates.checkpoint` writes only the keys that changed since the previous checkpoint,
  and the tasks' input offsets, in one transaction: its cost follows the input since the last
  checkpoint, not the number of users held.

A checkpoint file ``p<p>.json`` of an earlier version (whole-state JSON in ``daemon.state_dir``) is
read once when the changelog has nothing for ``p``; the first checkpoint then writes all of it.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from pathlib import Path
from typing import Any

from pipeline.core.checkpoints import claim_slot, read_json
from pipeline.core.config import Config
from pipeline.join.partition_task import PartitionTask
from pipeline.join.task_records import changes, state_from_records, track
from pipeline.kafka.changelog import Changelog
from pipeline.kafka.io import GroupSource

__all__ = ["TaskStates", "committed_states", "state_topic"]

log = logging.getLogger(__name__)


def state_topic(cfg: Config) -> str:
    """The joiner's changelog topic: ``kafka.joiner_state_topic``, or one named after its group and output."""
    k = cfg.kafka
    return k.joiner_state_topic or f"{k.group_id_prefix}-joiner-{k.examples_topic}-state"


def committed_states(cfg: Config) -> dict[int, dict[str, Any]]:
    """Every task's last committed state (the :meth:`PartitionTask.to_state` document), by partition."""
    changelog = Changelog(cfg.kafka, state_topic(cfg), cfg.kafka.partitions, "reader")
    out = {}
    for p in range(changelog.partition_count()):
        state = state_from_records(changelog.read(p), cfg.joiner)
        if state is not None:
            out[p] = state
    return out


class TaskStates:
    """Opens and checkpoints the joiner's tasks; see the module docstring."""

    def __init__(
        self, cfg: Config, source: GroupSource, topic_of: dict[str, str], partitions: int, folder: Path
    ) -> None:
        self.cfg, self.source, self.topic_of, self.folder = cfg, source, topic_of, folder
        k = cfg.kafka
        # stable across restarts in this folder, unique among the processes alive on this host
        slot = claim_slot(folder, "instance")
        where = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
        member = k.group_instance_id or f"{socket.gethostname()}-{where}"
        self.changelog = Changelog(
            k, state_topic(cfg), partitions, f"{k.group_id_prefix}-joiner-{member}-{slot}"
        )
        found = self.changelog.partition_count()
        if found != partitions:
            raise ValueError(
                f"joiner: the state topic {self.changelog.topic!r} has {found} partitions, the input topics "
                f"{partitions}: task p keeps its state in partition p; give it {partitions} partitions "
                "(or a new kafka.joiner_state_topic)"
            )

    def open(self, partition: int) -> tuple[PartitionTask, dict[str, int] | None]:
        """The task of ``partition`` as last committed, and per stream its next offset (None: new)."""
        started = time.monotonic()
        task = PartitionTask(self.cfg, partition, idle_s=self.cfg.daemon.idle_merge_s)
        latest = self.changelog.read(partition)
        state = state_from_records(latest, self.cfg.joiner)
        legacy = False
        if state is None:
            state = read_json(self.folder / f"p{partition}.json")
            legacy = state is not None
        if state is not None:
            task.load_state(state, self.cfg)
        track(task, everything=legacy)
        seconds = time.monotonic() - started
        log.info(
            "joiner: task for partition %d %s (%d state records, %.2f s)",
            partition,
            "from an old checkpoint file" if legacy else "restored" if state else "started",
            len(latest),
            seconds,
        )
        return task, None if state is None else state["next_offsets"]

    def offsets(self, tasks: dict[int, PartitionTask]) -> dict[str, int]:
        """``{"topic:partition": next offset}`` of every task's streams, as its state says."""
        return {
            f"{self.topic_of[kind]}:{p}": s.next_offset
            for p, t in tasks.items()
            for kind, s in t.streams.items()
        }

    def checkpoint(self, tasks: dict[int, PartitionTask]) -> dict[str, int] | None:
        """Commit what changed in ``tasks`` with their offsets, in one transaction; returns the offsets.

        Outputs must be durable first (examples flushed, features pushed). ``None``: this member no
        longer owns some task's partitions (a rebalance is under way): nothing was written, and the
        caller must drop its tasks, which reopen from the changelog. Raises if the transaction failed
        (nothing of it visible); the caller then drops its tasks too.
        """
        owned = set(self.source.assignment())
        snapshot = self.offsets(tasks)
        if not set(snapshot) <= owned:
            log.warning("joiner: partitions moved before the checkpoint; tasks reopen from the changelog")
            return None
        records = {p: changes(t) for p, t in sorted(tasks.items())}

        def transaction(offsets: dict[Any, Any], group_metadata: Any) -> None:
            self.changelog.commit(records, offsets, group_metadata)

        committed = self.source.commit(snapshot, transaction=transaction)
        if snapshot and committed != snapshot:  # moved in between: the transaction never ran
            return None
        return committed

    def close(self) -> None:
        self.changelog.close()
