"""Streaming per-user and per-item counters over sliding event-time windows.

For every user and every item we count impressions and clicks over each window of
``cfg.windows_s`` (default 1 h and 24 h) and derive a smoothed CTR
``(clicks + a) / (impressions + a / prior)``. Windows are exact over buckets of ``cfg.bucket_s``:
the window of span ``W`` ending at ``ts`` holds the buckets ``(b - W/bucket, b]`` with
``b = ts // bucket``.

Point in time: :meth:`StreamingFeatures.lookup` reads the current state restricted to the window
ending at ``ts``; the joiner calls it for an impression *before* recording that impression, so an
example never sees its own impression or click (no leakage).

How it stays fast (the joiner calls lookup + record for every event) and small:
each entity keeps one list of *cumulative* counts per bucket, packed into one int
``bucket << 80 | cum_impressions << 40 | cum_clicks``. A window sum is then the difference of two
cumulative values found by ``bisect`` (packed ints sort by bucket), O(log n) for any ``ts``, and an
in-order event is one add on the list's last element. Buckets older than the longest window plus
``cfg.max_lateness_s`` behind the entity's newest bucket are expired (folded into ``base``); a
later event than that is dropped and counted in :attr:`StreamingFeatures.late_dropped`.

Forgetting (``cfg.forget_idle_s`` F > 0): :meth:`StreamingFeatures.forget_idle` drops every entity
whose newest event is more than F behind a watermark, so the state holds the entities seen lately,
not every one ever seen. An entity's counters and sequence are invisible to a lookup at least
M = max(longest window, ``sequence_ttl_s``) after its newest event, where a forgotten and a fresh
entity look the same; and a newer event of a forgotten entity starts a fresh one that counts as the
old one would. So forgetting changes the features of no event less than F - M behind the watermark
(8 days by default). A lookup of an entity not held, earlier than M past the newest horizon
forgotten, is counted (:attr:`StreamingFeatures.past_forget`): an upper bound on the events whose
features forgetting may have changed.

Rows for the online store (:meth:`StreamingFeatures.drain_dirty`): each changed entity's values
in the windows ending at the writer's clock, and a fresh row for every entity whose windows lost
an event since its last row (:mod:`features.window_exits`), so that serving reads what a lookup
at that time gives, not the counts as of the entity's last event.

Behaviour sequences (``cfg.sequence_length`` K > 0): per user, the last K clicked items and their
click times, in two list features, :data:`SEQUENCE_NAMES` (newest first). A lookup at ``ts`` shows
the clicks recorded so far with a time in ``(ts - sequence_ttl_s, ts]``: the same rule,
:func:`visible_sequence`, that serving applies to the stored row at request time.

>>> sf = StreamingFeatures(FeatureConfig(sequence_length=2))
>>> sf.record_impression("u1", "i1", 1_000)
>>> sf.lookup("u1", "i1", 2_000)["user_impressions_1h"]
1.0
>>> for ts, item in ((3_000, "a"), (4_000, "b"), (5_000, "c")):
...     sf.record_click("u1", item, ts)
>>> sf.lookup_user("u1", 4_500)["user_clicked_items"], sf.lookup_user("u1", 9_000)["user_clicked_items"]
(['b'], ['c', 'b'])
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from features.window_exits import WindowExits, next_exit
from pipeline.core.config import FeatureConfig

__all__ = [
    "FEATURE_NAMES",
    "FORGET_EVERY_MS",
    "SEQUENCE_NAMES",
    "FeatureRow",
    "StreamingFeatures",
    "entity_feature_names",
    "feature_names",
    "next_forget_at",
    "visible_sequence",
]

FeatureRow = dict[str, Any]  # join key, "event_timestamp" (tz-aware, UTC) and the entity's features

_IDX = 80  # bucket index lives above bit 80 of a packed value
_CUM = (1 << _IDX) - 1  # mask of the two cumulative counters
_FIELD = (1 << 40) - 1  # one 40-bit counter (10^12 events per entity before overflow)
_IMP = 1 << 40  # +1 impression
_CLICK = 1  # +1 click
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_STATE_VERSION = 1
# callers of forget_idle call it when their watermark passes a whole day (UTC): a sweep walks every
# entity held, so once a day costs a few checks an event where once an hour cost tens
FORGET_EVERY_MS = 86_400_000


def _label(seconds: int) -> str:
    """3600 -> '1h', 300 -> '5m', 90 -> '90s' (feature name suffix)."""
    if seconds % 3_600 == 0:
        return f"{seconds // 3_600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def entity_feature_names(entity: str, windows_s: Sequence[int]) -> tuple[str, ...]:
    """Feature names of one entity ("user" or "item"), window by window."""
    return tuple(
        f"{entity}_{kind}_{_label(w)}" for w in windows_s for kind in ("impressions", "clicks", "ctr")
    )


def feature_names(windows_s: Sequence[int]) -> tuple[str, ...]:
    """All feature names, user features first, in the order every consumer uses."""
    return entity_feature_names("user", windows_s) + entity_feature_names("item", windows_s)


FEATURE_NAMES: tuple[str, ...] = feature_names(FeatureConfig().windows_s)
SEQUENCE_NAMES = ("user_clicked_items", "user_clicked_ts")  # list features: item ids, click times (ms)


def next_forget_at(watermark_ms: int) -> int:
    """When :meth:`StreamingFeatures.forget_idle` is next due: the first whole day (UTC) after
    ``watermark_ms``. A place fixed by event time, so a replay and a restore forget where the first
    run did."""
    return (watermark_ms // FORGET_EVERY_MS + 1) * FORGET_EVERY_MS


def visible_sequence(
    items: Sequence[str], times: Sequence[int], at_ms: int, ttl_s: int
) -> tuple[list[str], list[int]]:
    """The entries of a stored sequence (newest first) that an impression at ``at_ms`` sees: click
    time in ``(at_ms - ttl, at_ms]``. The joiner and serving both apply it, so they agree.

    >>> visible_sequence(["c", "b", "a"], [30, 20, 10], at_ms=25, ttl_s=0)
    ([], [])
    >>> visible_sequence(["c", "b", "a"], [30_000, 20_000, 10_000], at_ms=25_000, ttl_s=10)
    (['b'], [20000])
    """
    lo = at_ms - ttl_s * 1_000
    keep = [k for k, t in enumerate(times) if lo < t <= at_ms]
    return [items[k] for k in keep], [int(times[k]) for k in keep]


class _Entity:
    """Counters of one user or item."""

    __slots__ = ("base", "buckets", "last_ts", "next_exit")

    def __init__(self) -> None:
        # packed cumulative counts, ascending by bucket; a list, not a deque: an empty deque
        # costs ~600 bytes (a list 56) and bisect on a list needs no O(n/64) block walks
        self.buckets: list[int] = []
        self.base = 0  # cumulative counts of everything already expired
        self.last_ts = 0  # newest event time seen (ms)
        self.next_exit = 0  # bucket at which its last row's windows next lose an event (0: none)


class StreamingFeatures:
    """Sliding-window impression/click counters per user and per item (see the module docstring)."""

    def __init__(self, cfg: FeatureConfig) -> None:
        if cfg.bucket_s <= 0 or not cfg.windows_s:
            raise ValueError(f"features: bucket_s={cfg.bucket_s} and windows_s={cfg.windows_s} invalid")
        for w in cfg.windows_s:
            if w <= 0 or w % cfg.bucket_s:
                raise ValueError(
                    f"features: window {w}s is not a positive multiple of bucket_s={cfg.bucket_s}"
                )
        if cfg.ctr_prior_clicks <= 0 or not 0 < cfg.ctr_prior_rate < 1:
            raise ValueError(
                f"features: need ctr_prior_clicks > 0 and 0 < ctr_prior_rate < 1, got "
                f"{cfg.ctr_prior_clicks} and {cfg.ctr_prior_rate}"
            )
        visible_s = max(max(cfg.windows_s), cfg.sequence_ttl_s if cfg.sequence_length else 0)
        if cfg.forget_idle_s and cfg.forget_idle_s < visible_s + cfg.max_lateness_s:
            raise ValueError(
                f"features: forget_idle_s={cfg.forget_idle_s} would forget entities whose counters or "
                f"sequence an in-order event still sees: set it to at least {visible_s + cfg.max_lateness_s} "
                "(the longest window or sequence_ttl_s, plus max_lateness_s), or 0 to never forget"
            )
        self.cfg = cfg
        self.windows_s = tuple(int(w) for w in cfg.windows_s)
        self.user_names = entity_feature_names("user", self.windows_s)
        self.item_names = entity_feature_names("item", self.windows_s)
        self.feature_names = self.user_names + self.item_names
        self._bucket_ms = cfg.bucket_s * 1_000
        self._spans = tuple(w // cfg.bucket_s for w in self.windows_s)
        # retention: the longest window plus the tolerated lateness, in buckets
        self._keep = max(self._spans) + -(-max(cfg.max_lateness_s, 0) // cfg.bucket_s)
        self._a = float(cfg.ctr_prior_clicks)
        self._a_over_prior = cfg.ctr_prior_clicks / cfg.ctr_prior_rate
        self._users: dict[str, _Entity] = {}
        self._items: dict[str, _Entity] = {}
        self._dirty_users: set[str] = set()
        self._dirty_items: set[str] = set()
        # entities changed since the last take_changes() (None: not tracked; see track_changes)
        self._changed: tuple[set[str], set[str]] | None = None
        # users and items whose rows a drain at a later time must refresh (drain_dirty's at_ms)
        self._exits = (WindowExits(), WindowExits())
        self._clock = 0  # the newest at_ms of drain_dirty
        self._stamp_us = 0  # the newest stamp of a row drained (µs since the epoch)
        # an entity with no events: counts 0 and the same formula's CTR (= the prior, to the ulp)
        self._zero = [0.0, 0.0, self._a / self._a_over_prior] * len(self._spans)
        self._seq_len, self._seq_ttl_s = cfg.sequence_length, cfg.sequence_ttl_s
        self.sequence_names = SEQUENCE_NAMES if self._seq_len else ()
        self._seqs: dict[str, list[tuple[int, str]]] = {}  # user -> (click ts, item), oldest first
        self.late_dropped = 0  # entity updates dropped: older than the retention behind its newest
        self._forget_ms, self._visible_ms = cfg.forget_idle_s * 1_000, visible_s * 1_000
        self.forgotten = 0  # entities forgotten (forget_idle)
        self.forgot_before = 0  # the newest horizon forgotten: entities whose newest event was older
        self.past_forget = 0  # lookups of an entity not held, earlier than visible_s past that horizon
        self._suspect_below = 0  # the bucket of forgot_before + visible_s: lookups before it are counted

    # -- hot path --------------------------------------------------------------------------------
    def lookup(self, user_id: str, item_id: str, ts_ms: int) -> dict[str, Any]:
        """Features of (user, item) in the windows ending at ``ts_ms``, from what is recorded so far."""
        b = ts_ms // self._bucket_ms
        vals = self._values(self._users.get(user_id), b) + self._values(self._items.get(item_id), b)
        out: dict[str, Any] = dict(zip(self.feature_names, vals))  # noqa: B905 (equal lengths; strict: 0.5 µs)
        if self._seq_len:
            self._attach_sequence(out, user_id, ts_ms)
        return out

    def record_impression(self, user_id: str, item_id: str, ts_ms: int) -> None:
        """Count one impression of ``item_id`` to ``user_id`` at event time ``ts_ms``."""
        self._add(self._users, self._dirty_users, user_id, ts_ms, _IMP)
        self._add(self._items, self._dirty_items, item_id, ts_ms, _IMP)

    def record_click(self, user_id: str, item_id: str, ts_ms: int) -> None:
        """Count one click (``ts_ms``: the click's event time) for the user and the clicked item."""
        self._add(self._users, self._dirty_users, user_id, ts_ms, _CLICK)
        self._add(self._items, self._dirty_items, item_id, ts_ms, _CLICK)
        if self._seq_len:
            self._clicked(user_id, item_id, ts_ms)

    def lookup_user(self, user_id: str, ts_ms: int) -> dict[str, Any]:
        """The user's features alone, in the windows ending at ``ts_ms``."""
        vals = self._values(self._users.get(user_id), ts_ms // self._bucket_ms)
        out: dict[str, Any] = dict(zip(self.user_names, vals))  # noqa: B905 (equal lengths)
        if self._seq_len:
            self._attach_sequence(out, user_id, ts_ms)
        return out

    def record_user(self, user_id: str, ts_ms: int, click: bool, item_id: str | None = None) -> None:
        """Count one impression (or, ``click``, one click of ``item_id``) of ``user_id`` at ``ts_ms``;
        the item's own counters are not touched (the item stage's, :mod:`features.item_stage`)."""
        self._add(self._users, self._dirty_users, user_id, ts_ms, _CLICK if click else _IMP)
        if click and item_id is not None and self._seq_len:
            self._clicked(user_id, item_id, ts_ms)

    def _clicked(self, user_id: str, item_id: str, ts_ms: int) -> None:
        """Add a click to the user's sequence (in click-time order), keeping the newest K."""
        seq = self._seqs.get(user_id)
        if seq is None:
            seq = self._seqs[user_id] = []
        entry = (ts_ms, item_id)
        if not seq or seq[-1] <= entry:
            seq.append(entry)
        else:  # a click attributed out of time order: its place by time (then item id)
            seq.insert(bisect_left(seq, entry), entry)
        if len(seq) > self._seq_len:
            del seq[0]

    def _attach_sequence(self, out: dict[str, Any], user_id: str, ts_ms: int) -> None:
        visible = visible_sequence(*self.sequence(user_id), ts_ms, self._seq_ttl_s)
        out.update(zip(SEQUENCE_NAMES, visible, strict=True))

    def sequence(self, user_id: str) -> tuple[list[str], list[int]]:
        """The user's stored sequence, newest first (every entry kept, whatever its age)."""
        seq = self._seqs.get(user_id, ())
        return [i for _, i in reversed(seq)], [t for t, _ in reversed(seq)]

    def lookup_item(self, item_id: str, ts_ms: int) -> dict[str, float]:
        """The item's features alone, in the windows ending at ``ts_ms``."""
        vals = self._values(self._items.get(item_id), ts_ms // self._bucket_ms)
        return dict(zip(self.item_names, vals))  # noqa: B905 (equal lengths)

    def record_item(self, item_id: str, ts_ms: int, clicked: bool) -> None:
        """Count one impression of ``item_id`` at ``ts_ms`` and, if ``clicked``, its click at the
        same time (a labelled example's, :mod:`features.item_stage`): no user is touched."""
        self._add(self._items, self._dirty_items, item_id, ts_ms, _IMP + _CLICK if clicked else _IMP)

    def _values(self, ent: _Entity | None, b: int) -> list[float]:
        """impressions, clicks, ctr per window ending at bucket ``b``; inlined for speed (hot path)."""
        if ent is None:
            if b < self._suspect_below:
                self.past_forget += 1
            return self._zero[:]
        dq, base = ent.buckets, ent.base
        last = dq[-1]
        if last >> _IDX <= b:  # fast path: ts at/after the entity's newest bucket
            hi = last & _CUM
        else:
            i = bisect_left(dq, (b + 1) << _IDX)  # packed values of buckets <= b are below this
            hi = (dq[i - 1] if i else base) & _CUM
        out: list[float] = []
        a, a_over_prior = self._a, self._a_over_prior
        for span in self._spans:
            i = bisect_left(dq, (b - span + 1) << _IDX)
            d = hi - ((dq[i - 1] if i else base) & _CUM)  # cumulative, so no borrow between fields
            imps, clicks = d >> 40, d & _FIELD
            out += (float(imps), float(clicks), (clicks + a) / (imps + a_over_prior))
        return out

    def _add(self, table: dict[str, _Entity], dirty: set[str], key: str, ts_ms: int, delta: int) -> None:
        ent = table.get(key)
        if ent is None:
            ent = table[key] = _Entity()
        b = ts_ms // self._bucket_ms
        dq = ent.buckets
        if not dq:
            dq.append(b << _IDX | ((ent.base & _CUM) + delta))
        else:
            last = dq[-1]
            head = last >> _IDX
            if b == head:  # the common case: same bucket as the newest event
                dq[-1] = last + delta
            elif b > head:
                dq.append(b << _IDX | ((last & _CUM) + delta))
                k = bisect_left(dq, (b - self._keep + 1) << _IDX)  # buckets out of the retention
                if k:
                    ent.base = dq[k - 1]
                    del dq[:k]  # a memmove of at most a few hundred pointers
            elif b <= head - self._keep:  # too late: its bucket was already expired
                self.late_dropped += 1
                return
            else:  # out of order inside the retention: fix this bucket and every later one
                i = bisect_left(dq, b << _IDX)
                if i == len(dq) or dq[i] >> _IDX != b:
                    prev = dq[i - 1] if i else ent.base
                    dq.insert(i, b << _IDX | (prev & _CUM))
                for j in range(i, len(dq)):
                    dq[j] += delta
        if ts_ms > ent.last_ts:
            ent.last_ts = ts_ms
        dirty.add(key)

    # -- forgetting ------------------------------------------------------------------------------
    def forget_idle(self, watermark_ms: int) -> list[str]:
        """Forget every user and item whose newest event is more than ``forget_idle_s`` behind
        ``watermark_ms`` (see the module docstring); the users forgotten (none if it is 0)."""
        if not self._forget_ms:
            return []
        before = watermark_ms - self._forget_ms
        users = self._forget(self._users, self._dirty_users, 0, before)
        for user in users:
            self._seqs.pop(user, None)
        self._forget(self._items, self._dirty_items, 1, before)
        self._forgot(before)
        return users

    def _forgot(self, before: int) -> None:
        """Entities whose newest event was before ``before`` are gone: lookups of an entity not
        held, earlier than ``visible_s`` after the newest such horizon, are counted from now on."""
        if before > self.forgot_before:
            self.forgot_before = before
            self._suspect_below = -(-(before + self._visible_ms) // self._bucket_ms)

    def _forget(self, table: dict[str, _Entity], dirty: set[str], kind: int, before: int) -> list[str]:
        gone = [ident for ident, ent in table.items() if ent.last_ts < before]
        for ident in gone:
            del table[ident]
        if gone:
            dirty.difference_update(gone)  # a row of stale counters: serving has one just as stale
            if self._changed is not None:  # their records are deleted (take_changes: None)
                self._changed[kind].update(gone)
            self.forgotten += len(gone)
        return gone

    def has_user(self, user_id: str) -> bool:
        return user_id in self._users

    @property
    def users_held(self) -> int:
        return len(self._users)

    # -- pushing and checkpoints -----------------------------------------------------------------
    def defaults(self) -> dict[str, Any]:
        """Features of a (user, item) never seen: counts 0, CTR = the prior."""
        out: dict[str, Any] = dict(zip(self.feature_names, self._zero + self._zero, strict=True))
        out.update((name, []) for name in self.sequence_names)
        return out

    def drain_dirty(self, at_ms: int | None = None) -> tuple[list[FeatureRow], list[FeatureRow]]:
        """Rows of the users and items changed since the last drain, for the feature store.

        ``at_ms``: the writer's clock (a partition's newest event time; the item stage's visible
        time). Each row then holds the entity's values in the windows ending at ``at_ms`` (or at its
        newest event if later), stamped with that time, and the entities whose last rows' windows
        lost an event since (an hour after a user's last impression, its 1 h count is 0) get a
        fresh row though nothing new happened to them (:mod:`features.window_exits`): the online
        store holds what a lookup at ``at_ms`` gives. ``None``: each row as of its entity's newest
        event, and no refresh.

        Every row of a drain is stamped later than every row of the drains before it (the time of
        the row, bumped by 1 µs where needed; the newest stamp is in :attr:`header`, so across
        checkpoints too): Feast's Redis store silently drops a row not newer than the one it holds,
        which would lose an update made by a late or same-millisecond event. A refresh changes
        no state: only the entities whose events changed them count as changed (take_changes).
        """
        if self._changed is not None:  # before the refreshes: those change nothing to checkpoint
            self._changed[0].update(self._dirty_users)
            self._changed[1].update(self._dirty_items)
        if at_ms is not None:
            at_ms = self._clock = max(at_ms, self._clock)  # a clock that went back: held at its newest
            at = at_ms // self._bucket_ms
            self._refresh(self._users, self._dirty_users, self._exits[0], at)
            self._refresh(self._items, self._dirty_items, self._exits[1], at)
        after = self._stamp_us  # every row of this drain is stamped after the drains before it
        users = self._drain(self._users, self._dirty_users, "user_id", self.user_names, at_ms, after, 0)
        items = self._drain(self._items, self._dirty_items, "item_id", self.item_names, at_ms, after, 1)
        for row in users if self._seq_len else ():  # the stored sequence, whole: serving filters it
            row.update(zip(SEQUENCE_NAMES, self.sequence(row["user_id"]), strict=True))
        return users, items

    @staticmethod
    def _refresh(table: dict[str, _Entity], dirty: set[str], exits: WindowExits, at: int) -> None:
        """Mark dirty every entity whose last row's windows lost an event by bucket ``at``."""
        for bucket, ident in exits.due(at):
            ent = table.get(ident)
            if ent is not None and ent.next_exit == bucket:  # else: rescheduled or forgotten since
                ent.next_exit = 0
                dirty.add(ident)

    def track_changes(self, everything: bool = False) -> None:
        """Remember which entities change, for :meth:`take_changes` (incremental checkpoints);
        ``everything``: count every entity held now as changed (a first incremental checkpoint)."""
        self._changed = (set(self._users), set(self._items)) if everything else (set(), set())

    def take_changes(self) -> tuple[dict[str, list[int] | None], dict[str, list[int] | None]]:
        """Users and items changed since the last call, as :meth:`to_state` writes them (``None``:
        forgotten since). Changed rows must have been pushed first (:meth:`drain_dirty`): the
        changes do not say "dirty"."""
        if self._changed is None:
            raise RuntimeError("StreamingFeatures.take_changes: call track_changes() first")
        if self._dirty_users or self._dirty_items:
            raise RuntimeError("StreamingFeatures.take_changes: drain_dirty() (push) before checkpointing")
        users, items = self._changed
        self._changed = (set(), set())
        return _flat_or_none(self._users, users), _flat_or_none(self._items, items)

    def _drain(
        self,
        table: dict[str, _Entity],
        dirty: set[str],
        key: str,
        names: tuple[str, ...],
        at_ms: int | None,
        after_us: int,
        kind: int,
    ) -> list[FeatureRow]:
        rows: list[FeatureRow] = []
        exits = self._exits[kind]
        ints = [k % 3 != 2 for k in range(len(names))]  # counts are Int64 in Feast, CTRs Float64
        stamped: tuple[int, datetime] = (-1, _EPOCH)  # with a clock, every row has the same stamp
        for ident in dirty:
            ent = table[ident]
            ref = ent.last_ts if at_ms is None or at_ms < ent.last_ts else at_ms
            stamp = max(ref * 1_000, after_us + 1)
            if stamp != stamped[0]:
                stamped = (stamp, _EPOCH + timedelta(microseconds=stamp))
                if stamp > self._stamp_us:
                    self._stamp_us = stamp
            b = ref // self._bucket_ms
            row: FeatureRow = {key: ident, "event_timestamp": stamped[1]}
            row.update(zip(names, [int(v) if i else v for v, i in zip(self._values(ent, b), ints)]))  # noqa: B905
            rows.append(row)
            if at_ms is not None:
                self._schedule(ent, ident, b, exits)
        dirty.clear()
        return rows

    def _schedule(self, ent: _Entity, ident: str, at: int, exits: WindowExits) -> None:
        """Set when the windows of ``ent``'s row as of bucket ``at`` next lose an event."""
        nxt = next_exit(ent.buckets, _IDX, at, self._spans)
        if nxt and nxt != ent.next_exit:
            exits.add(nxt, ident)
        ent.next_exit = nxt

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable state (buckets unpacked to ``[bucket, cum_imps, cum_clicks]`` triples)."""

        def dump(table: dict[str, _Entity]) -> dict[str, list[int]]:
            return {ident: _flat(e) for ident, e in table.items()}

        return {
            **self.header,
            "users": dump(self._users),
            "items": dump(self._items),
            "sequences": {u: _flat_sequence(seq) for u, seq in self._seqs.items()},
            "dirty_users": sorted(self._dirty_users),
            "dirty_items": sorted(self._dirty_items),
        }

    def user_state(self, user_id: str) -> list[int] | None:
        """One user's counters as :meth:`to_state` writes them (None: no events yet)."""
        ent = self._users.get(user_id)
        return None if ent is None else _flat(ent)

    def user_sequence_state(self, user_id: str) -> list[Any] | None:
        """One user's sequence as :meth:`to_state` writes it (None: no click kept)."""
        seq = self._seqs.get(user_id)
        return _flat_sequence(seq) if seq else None

    @property
    def header(self) -> dict[str, Any]:
        """The state besides the entities (:meth:`to_state` without users, items and dirty sets)."""
        return {
            "version": _STATE_VERSION,
            "bucket_s": self.cfg.bucket_s,
            "late_dropped": self.late_dropped,
            "forgotten": self.forgotten,
            "forgot_before": self.forgot_before,
            "past_forget": self.past_forget,
            "clock": self._clock,
            "stamp_us": self._stamp_us,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], cfg: FeatureConfig) -> StreamingFeatures:
        """Rebuild from :meth:`to_state`; the bucket size must match (buckets mean nothing otherwise)."""
        if state.get("version") != _STATE_VERSION or state.get("bucket_s") != cfg.bucket_s:
            raise ValueError(
                f"features: state version {state.get('version')} / bucket_s {state.get('bucket_s')} "
                f"does not match version {_STATE_VERSION} / bucket_s {cfg.bucket_s}"
            )
        sf = cls(cfg)

        def load(flat_by_id: Mapping[str, list[int]]) -> dict[str, _Entity]:
            out = {}
            for ident, flat in flat_by_id.items():
                e = out[ident] = _Entity()
                e.last_ts, pushed_us, base_i, base_c = flat[:4]  # pushed_us: 0 since the header has it
                sf._stamp_us = max(sf._stamp_us, pushed_us)
                e.base = base_i << 40 | base_c
                e.buckets.extend(
                    b << _IDX | i << 40 | c for b, i, c in zip(*[iter(flat[4:])] * 3, strict=True)
                )
            return out

        sf._users, sf._items = load(state["users"]), load(state["items"])
        sf._clock = int(state.get("clock", 0))
        sf._stamp_us = max(sf._stamp_us, int(state.get("stamp_us", 0)))
        # the last drain refreshed every row whose windows lost an event by its clock: each row
        # pushed is as of then (or of the entity's newest event, if later or drained without one)
        for table, exits in zip((sf._users, sf._items), sf._exits, strict=True):
            for ident, ent in table.items():
                sf._schedule(ent, ident, max(ent.last_ts, sf._clock) // sf._bucket_ms, exits)
        for user, flat_seq in state.get("sequences", {}).items():  # absent: written without sequences
            pairs = [(int(t), str(i)) for t, i in zip(flat_seq[::2], flat_seq[1::2], strict=True)]
            if sf._seq_len and pairs:
                sf._seqs[user] = pairs[-sf._seq_len :]
        sf._dirty_users, sf._dirty_items = set(state["dirty_users"]), set(state["dirty_items"])
        sf.late_dropped = int(state.get("late_dropped", 0))
        sf.forgotten, sf.past_forget = int(state.get("forgotten", 0)), int(state.get("past_forget", 0))
        sf._forgot(int(state.get("forgot_before", 0)))  # absent: written before forgetting
        return sf


def _flat_or_none(table: dict[str, _Entity], idents: set[str]) -> dict[str, list[int] | None]:
    """:func:`_flat` of each of ``idents`` (sorted), ``None`` for one no longer held."""
    return {i: None if (e := table.get(i)) is None else _flat(e) for i in sorted(idents)}


def _flat_sequence(seq: list[tuple[int, str]]) -> list[Any]:
    """A sequence as ``[ts, item, ts, item, ...]``, oldest first."""
    return [x for entry in seq for x in entry]


def _flat(e: _Entity) -> list[int]:
    """One entity as ``[last_ts, 0, base_imps, base_clicks, (bucket, cum_imps, cum_clicks)...]``
    (the 0 was the entity's last row stamp, now the header's ``stamp_us`` for all of them)."""
    flat = [e.last_ts, 0, (e.base >> 40) & _FIELD, e.base & _FIELD]
    for v in e.buckets:
        flat += (v >> _IDX, (v >> 40) & _FIELD, v & _FIELD)
    return flat
