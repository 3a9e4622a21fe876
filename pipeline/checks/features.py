"""The online feature reader contract: what was pushed is read back; the unknown gets defaults."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.checks._common import fail, impl_name
from pipeline.core.config import FeatureConfig

__all__ = ["check_feature_reader"]

Push = Callable[[Sequence[dict[str, Any]], Sequence[dict[str, Any]]], None]


def check_feature_reader(
    reader: Any, writer: Any, *, cfg: FeatureConfig | None = None, name: str | None = None
) -> None:
    """Check ``reader.get(user_id, item_ids)`` against rows written with ``writer``.

    ``writer``: a :class:`features.store.FeatureWriter` (anything with ``push(user_rows,
    item_rows)``) or such a callable. The check counts a few impressions and clicks in
    :class:`features.aggregations.StreamingFeatures`, pushes the drained rows, reads them back, then
    pushes newer values for some of the entities and reads again. Entity ids are unique per call, so
    a shared store can be used.

    Rules: one dict per candidate, keys in ``feature_names`` order; the values are those of the
    user's and the item's last pushed rows; an entity never pushed gets
    :meth:`StreamingFeatures.defaults` (counts 0, CTR the prior); a candidate repeated gets the same
    dict each time; no candidates, no rows. With ``cfg.sequence_length`` > 0 each row ends with the
    user's behaviour sequence, the clicks of its last pushed row within ``sequence_ttl_s`` of now.
    """
    from features.aggregations import StreamingFeatures, visible_sequence

    impl = impl_name(reader, name)
    push: Push = writer.push if hasattr(writer, "push") else writer
    sf = StreamingFeatures(cfg or FeatureConfig())
    defaults = sf.defaults()
    tag = f"{time.time_ns():x}"
    users = [f"chk-u{i}-{tag}" for i in range(3)]
    items = [f"chk-i{i}-{tag}" for i in range(4)]
    now = time.time_ns() // 1_000_000 - 600_000  # recent: inside every window and any view's TTL
    rows: dict[str, dict[str, Any]] = {}

    def write(events: list[tuple[str, str, bool]], ts: int) -> None:
        for k, (u, i, click) in enumerate(events):
            sf.record_impression(u, i, ts + k)
            if click:
                sf.record_click(u, i, ts + k + 1)
        user_rows, item_rows = sf.drain_dirty()
        push(user_rows, item_rows)
        rows.update({r["user_id"]: r for r in user_rows} | {r["item_id"]: r for r in item_rows})

    def expected(user: str, item: str) -> dict[str, Any]:
        u, i = rows.get(user), rows.get(item)
        out: dict[str, Any] = {
            n: float(src[n]) if src is not None else defaults[n]
            for n in sf.feature_names
            for src in [u if n in sf.user_names else i]
        }
        if sf.sequence_names:
            items, times = (u[n] for n in sf.sequence_names) if u is not None else ([], [])
            now_ms = time.time_ns() // 1_000_000
            visible = visible_sequence(items, times, now_ms, sf.cfg.sequence_ttl_s)
            out.update(zip(sf.sequence_names, visible, strict=True))
        return out

    def read(user: str, candidates: list[str], when: str) -> None:
        got = reader.get(user, candidates)
        if not isinstance(got, list) or len(got) != len(candidates):
            fail(impl, "one dict per candidate", f"{when}: {len(got)} rows for {len(candidates)} candidates")
        for item, row in zip(candidates, got, strict=True):
            if list(row) != [*sf.feature_names, *sf.sequence_names]:
                fail(impl, "keys in feature_names order", f"{when}, item {item}: keys {list(row)}")
            want = expected(user, item)
            if row != want:
                bad = {n: (row[n], want[n]) for n in want if row[n] != want[n]}
                rule = (
                    "an entity never pushed gets the documented defaults"
                    if user not in rows or item not in rows
                    else "the rows written are read back"
                )
                fail(impl, rule, f"{when}, user {user}, item {item}: (got, expected) {bad}")

    write([(users[0], items[0], True), (users[0], items[1], False), (users[1], items[0], False)], now)
    candidates = [items[0], items[1], items[3], items[0]]  # pushed, pushed, never pushed, repeated
    read(users[0], candidates, "after the first push")
    read(users[2], candidates, "a user never pushed")
    read(users[2], [items[3], items[3]], "user and items never pushed")
    got = reader.get(users[0], candidates)
    if got[0] != got[3]:
        fail(impl, "a repeated candidate gets the same features", f"{got[0]} != {got[3]}")
    if reader.get(users[0], []) != []:
        fail(impl, "no candidates, no rows", "get(user, []) returned rows")
    write([(users[0], items[1], True), (users[2], items[1], True), (users[0], items[1], False)], now + 60_000)
    read(users[0], candidates, "after newer rows were pushed")
    read(users[2], candidates, "a user pushed in the second round")
