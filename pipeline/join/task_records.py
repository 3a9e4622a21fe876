"""A partition task's state as keyed records, for a compacted changelog topic (Kafka Streams' way).

:meth:`PartitionTask.to_state` is one document: a checkpoint that writes it whole costs as much as
the whole state (every user, every pending impression), however little changed. Split by key, a
checkpoint writes only the keys that changed since the previous one, and the latest record of every
key *is* the state (which is what log compaction keeps):

- ``u<user id>``: the user's feature counters, behaviour sequence (if kept) and the joiner's entries
  of the user's impressions (:meth:`Joiner.entries`: pending, early click, finalised); deleted (a
  tombstone) once it would hold none of them: a user forgotten (``features.forget_idle_s``), a
  click orphaned with no impression of its user held;
- ``i<item key>``: one item's counters (written before the item stage took item counts to the
  trainer: still read);
- ``m``: the task's header: watermark and counters, the features' header, and per stream the first
  offset not yet processed. Written last in every checkpoint.

Keyed by user, not by impression: a checkpoint writes one record per user with new events, not one
or two per impression (kafka-python spends tens of microseconds per record, the joiner's budget for a
whole event). A user's record changes only with the user's events: an impression finalised or
forgotten later is not rewritten; :func:`state_from_records` applies the header's watermark to every
entry instead, exactly as :meth:`Joiner.advance` did before the checkpoint (a pending impression
whose window ended is finalised, an id past its horizon or a click past its hold is gone), so a task
restored from its changelog is the task that wrote it (same examples, same features; tested).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core import fast_json
from pipeline.core.config import JoinerConfig
from pipeline.join.partition_task import PartitionTask

__all__ = ["Records", "changes", "state_from_records", "track"]

Records = list[tuple[bytes, bytes | None]]  # (key, value or None for a tombstone), in write order
HEADER = b"m"


def track(task: PartitionTask, everything: bool = False) -> None:
    """Start remembering what changes in ``task``; ``everything``: count all it holds as changed
    (a task loaded from a whole-state file, whose first incremental checkpoint writes it all)."""
    task.joiner.track_changes(everything)
    task.features.track_changes(everything)


def changes(task: PartitionTask) -> Records:
    """The records of everything that changed in ``task`` since the last call, header last.

    The task's output must be drained and its features pushed first (what the records describe
    must already be durable downstream); raises ``RuntimeError`` otherwise or if not tracked."""
    joiner = task.joiner
    if joiner.changed is None:
        raise RuntimeError("task_records.changes: call track(task) first")
    header = {
        "partition": task.partition,
        "joiner": joiner.header(),
        "features": task.features.header,
        "next_offsets": {kind: s.next_offset for kind, s in task.streams.items()},
    }
    users, items = task.features.take_changes()
    out: Records = []
    for user in sorted(joiner.changed | users.keys()):
        flat = users.get(user) or task.features.user_state(user)
        seq = task.features.user_sequence_state(user)
        entries = joiner.entries(user)
        if flat is None and seq is None and not entries:
            out.append((b"u" + user.encode(), None))
            continue
        value = b'{"f":%s,"j":[%s]%s}' % (
            fast_json.dumps(flat),
            b",".join(entries),
            b',"s":' + fast_json.dumps(seq) if seq else b"",
        )
        out.append((b"u" + user.encode(), value))
    joiner.changed = set()
    out += [(b"i" + i.encode(), None if flat is None else fast_json.dumps(flat)) for i, flat in items.items()]
    out.append((HEADER, fast_json.dumps(header)))
    return out


def state_from_records(latest: Mapping[bytes, bytes], cfg: JoinerConfig) -> dict[str, Any] | None:
    """The :meth:`PartitionTask.load_state` document of the latest value of every key (tombstones
    already removed), or ``None`` for an empty changelog; see the module docstring."""
    raw_header = latest.get(HEADER)
    if raw_header is None:
        if latest:
            raise ValueError(
                f"joiner state: {len(latest)} records but no header record: the changelog is not a "
                "joiner's, or was written by a different version"
            )
        return None
    header = fast_json.loads(raw_header)
    window, horizon = int(cfg.attribution_window_s * 1000), int(cfg.dedup_horizon_s * 1000)
    hold = int(cfg.early_click_hold_s * 1000)
    conv_window = int(cfg.conversion_window_s * 1000)
    wm = header["joiner"]["max_ts"] - int(cfg.watermark_lag_s * 1000)  # what advance() last used
    pending: list[Any] = []
    early: list[Any] = []
    done: dict[str, int] = {}
    owners: dict[str, str] = {}
    stale: list[str] = []  # records that hold nothing any more (see track_changes)
    users: dict[str, Any] = {}
    sequences: dict[str, Any] = {}
    items: dict[str, Any] = {}
    for key, raw in latest.items():
        kind, ident = key[:1], key[1:].decode()
        if kind == HEADER:
            continue
        value = fast_json.loads(raw)
        if kind == b"i":
            items[ident] = value
            continue
        if kind != b"u":
            raise ValueError(f"joiner state: unknown record {key[:40]!r}: {raw[:80]!r}")
        if value["f"] is not None:
            users[ident] = value["f"]
        if "s" in value:
            sequences[ident] = value["s"]
        held = len(pending) + len(early) + len(done)
        for entry in value["j"]:
            if entry[0] == "p":
                imp, click_ts = entry[1], entry[3]
                end = imp["ts"] + window
                if conv_window and click_ts is not None:  # held for its correction (ConversionJoin)
                    end = max(end, click_ts + conv_window)
                if end >= wm:
                    pending.append(entry[1:])
                    continue
                iid, forget_at = imp["impression_id"], end + horizon  # finalised since (Joiner._emit)
                entry = ["d", iid, -forget_at if click_ts is not None else forget_at]
            if entry[0] == "e" and entry[1]["ts"] + hold >= wm:  # else: orphaned since
                early.append(entry[1])
            elif entry[0] == "d" and abs(entry[2]) >= wm:  # else: forgotten since
                done[entry[1]] = entry[2]
                owners[entry[1]] = ident
        if value["f"] is None and "s" not in value and held == len(pending) + len(early) + len(done):
            stale.append(ident)
    return {
        "partition": header["partition"],
        "joiner": {
            **header["joiner"],
            "pending": pending,
            "early": early,
            "done": done,
            "owners": owners,
            "stale": stale,
        },
        "features": {
            **header["features"],
            "users": users,
            "items": items,
            "sequences": sequences,
            "dirty_users": [],
            "dirty_items": [],
        },
        "next_offsets": header["next_offsets"],
    }
