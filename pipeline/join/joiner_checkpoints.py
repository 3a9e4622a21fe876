"""The joiner's checkpoints: its whole state as one document (:meth:`JoinerCheckpoints.to_state`), or
per user for a changelog (:meth:`JoinerCheckpoints.entries`, see :mod:`pipeline.join.task_records`).

A base of :class:`pipeline.join.joiner.Joiner`, kept apart so that the join rules read on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from features.aggregations import next_forget_at
from pipeline.core import fast_json
from pipeline.core.events import Click, Impression
from pipeline.join.stats import JoinStats, Rejection
from pipeline.join.time_queue import TimeQueue

__all__ = ["JoinerCheckpoints"]


@dataclass(slots=True)
class _Pending:
    impression: Impression
    features: dict[str, Any]  # floats, and lists for behaviour sequences
    click_ts: int | None = None  # event time of the attributed click, if any
    conversion: list[Any] | None = None  # [ts, value] of the attributed conversion, if any
    as_dict: dict[str, Any] | None = None  # impression.to_dict(), kept: every checkpoint writes it
    entry: bytes | None = None  # its changelog entry (Joiner.entries), kept until the click changes it


class JoinerCheckpoints:
    """State methods of :class:`pipeline.join.joiner.Joiner` (which sets every attribute used here)."""

    max_ts: int
    stats: JoinStats
    changed: set[str] | None
    _owned: dict[str, dict[str, None]]
    _loaded_owners: dict[str, str]
    _loaded_stale: list[str]
    _next_forget: int
    features: Any  # Joiner's FeatureTracker (forget_idle, has_user), or None
    _pending: dict[str, _Pending]
    _pending_queue: TimeQueue
    _early: dict[str, Click]
    _early_queue: TimeQueue
    _done: dict[str, int]
    _done_queue: TimeQueue
    _out: list[Any]
    _rejected: list[Rejection]
    _window: int
    _hold: int
    _lag: int
    _conv_window: int
    _converting_queue: TimeQueue

    conversion_end: Callable[[int, int], int]  # ConversionJoin's

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable state; undrained output must be drained (and made durable) first."""
        return {
            **self.header(),
            "pending": [_pending_fields(p) for p in self._pending.values()],
            "early": [c.to_dict() for c in self._early.values()],
            "done": self._done,
        }

    def header(self) -> dict[str, Any]:
        """The state besides the impressions held: watermark and counters."""
        if self._out or self._rejected:
            raise RuntimeError("Joiner: drain() and drain_rejected() before checkpointing")
        return {"max_ts": self.max_ts, "stats": self.stats.as_dict()}

    def track_changes(self, everything: bool = False) -> None:
        """Remember from now on which users' entries change (incremental checkpoints);
        ``everything``: every user held now counts as changed (the first checkpoint writes them all)."""
        self._owned = {}
        owners, self._loaded_owners = self._loaded_owners, {}
        for iid in self._done:  # "": a finalised id of a whole-state checkpoint, whose user it lacks
            self._owned.setdefault(owners.get(iid, ""), {})[iid] = None
        for iid, p in self._pending.items():
            self._owned.setdefault(p.impression.user_id, {})[iid] = None
        for iid, c in self._early.items():
            self._owned.setdefault(c.user_id, {})[iid] = None
        self.changed = set(self._owned) if everything else set()
        self.changed.update(self._loaded_stale)  # records that hold nothing: deleted next checkpoint
        self._loaded_stale = []

    def _own(self, user: str, iid: str) -> None:
        self._owned.setdefault(user, {})[iid] = None
        self.changed.add(user)  # type: ignore[union-attr]  # only called when tracking

    def entries(self, user: str) -> list[bytes]:
        """What the joiner holds of ``user``'s impressions, as JSON changelog entries: ``["p",
        impression, features, click_ts]`` pending (and ``[ts, value]`` of its conversion, if one
        was attributed), ``["e", click]`` an early click waiting, ``["d", impression_id, forget_at]``
        finalised (forget_at negative for a positive).

        A pending entry stays as written after its window closes and a finalised one after its
        horizon passes: the header's watermark says which
        (:func:`pipeline.join.task_records.state_from_records`), so neither needs a write of its own.
        Ids of other users' entries (a reused id) are pruned."""
        owned = self._owned.get(user)
        if not owned or not self._holds(user, owned):
            self._owned.pop(user, None)
            return []
        out: list[bytes] = []
        for iid in owned:
            pending = self._pending.get(iid)
            if pending is not None and pending.impression.user_id == user:
                if pending.entry is None:
                    entry = ["p", *_pending_fields(pending)]
                    pending.entry = fast_json.dumps(entry)
                out.append(pending.entry)
            elif (click := self._early.get(iid)) is not None and click.user_id == user:
                out.append(fast_json.dumps(["e", click.to_dict()]))
            else:
                out.append(fast_json.dumps(["d", iid, self._done[iid]]))
        return out

    def _forget_idle(self, wm: int) -> None:
        """At a UTC midnight of the watermark (a place fixed by the events, so a replay and a
        restore forget where the first run did): forget the users idle past
        ``features.forget_idle_s`` and the notes of which ids users own once none is held. With
        changes tracked, each user whose record then holds nothing is marked changed: the next
        checkpoint deletes the record (:func:`pipeline.join.task_records.changes`)."""
        self._next_forget = next_forget_at(wm)
        gone = self.features.forget_idle(wm) if self.features is not None else []
        if self.changed is None:
            return
        self.changed.update(gone)  # their records: rewritten without the counters, or deleted
        for user in [u for u, ids in self._owned.items() if not self._holds(u, ids)]:
            del self._owned[user]
            if self.features is None or not self.features.has_user(user):
                self.changed.add(user)

    def _holds(self, user: str, owned: dict[str, None]) -> bool:
        """Drop from ``owned`` the ids of which nothing of ``user``'s is held any more (forgotten,
        or another user's now); whether any is left."""
        for iid in list(owned):
            pending = self._pending.get(iid)
            if pending is not None:
                mine = pending.impression.user_id == user
            elif (click := self._early.get(iid)) is not None:
                mine = click.user_id == user
            else:
                mine = iid in self._done
            if not mine:
                del owned[iid]
        return bool(owned)

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`to_state` output into a fresh joiner (same config)."""
        self.max_ts = state["max_ts"]
        self.stats = JoinStats(**state["stats"])
        self._pending.clear()
        pending_ends: list[tuple[int, str]] = []
        converting_ends: list[tuple[int, str]] = []
        wm = self.max_ts - self._lag
        for imp_d, feats, click_ts, *conversion in state["pending"]:
            imp = Impression.from_dict(imp_d)
            iid = imp.impression_id
            self._pending[iid] = _Pending(imp, feats, click_ts, conversion[0] if conversion else None)
            end = imp.ts + self._window
            if self._conv_window and click_ts is not None and end < wm:  # held for its correction
                converting_ends.append((self.conversion_end(imp.ts, click_ts), iid))
            else:
                pending_ends.append((end, iid))
        self._pending_queue = TimeQueue(pending_ends)
        self._converting_queue = TimeQueue(converting_ends)
        self._early = {c["impression_id"]: Click(**c) for c in state["early"]}
        self._early_queue = TimeQueue((c.ts + self._hold, iid) for iid, c in self._early.items())
        self._done = dict(state["done"])
        self._loaded_owners = dict(state.get("owners", {}))  # for track_changes
        self._loaded_stale = list(state.get("stale", ()))
        self._next_forget = next_forget_at(wm)
        self._done_queue = TimeQueue((abs(v), iid) for iid, v in self._done.items())


def _pending_fields(pending: _Pending) -> list[Any]:
    """A held impression as checkpointed: impression, features, click ts (and conversion, if any)."""
    fields = [_as_dict(pending), pending.features, pending.click_ts]
    return fields if pending.conversion is None else [*fields, pending.conversion]


def _as_dict(pending: _Pending) -> dict[str, Any]:
    """The pending impression as a dict, built once (a checkpoint writes every pending impression)."""
    if pending.as_dict is None:
        pending.as_dict = pending.impression.to_dict()
    return pending.as_dict
