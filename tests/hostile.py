"""A seeded corpus of malformed and hostile events, each with what the pipeline must do with it.

:func:`corpus` interleaves a valid stream (impressions and their clicks, dated ``start_ms`` onwards)
with at least ``hostile`` bad events. Each bad event carries its expected fate:

- a dead-letter reason (:data:`pipeline.core.events.REASONS`) for everything validation refuses, and
  ``user_mismatch`` for a click whose user differs from its impression's (the joiner refuses it);
- a documented joiner rule otherwise: ``duplicate_impression`` / ``duplicate_click`` (dropped and
  counted: at-least-once delivery repeats messages) and ``unknown_impression`` (a click whose
  impression never comes: held ``early_click_hold_s``, then counted as an orphan).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Corpus", "corpus"]

DAY_MS = 86_400_000


@dataclass
class Corpus:
    events: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # (kind, key, value) in order
    fates: Counter[str] = field(default_factory=Counter)  # expected fate -> how many hostile events
    valid_impressions: dict[str, int] = field(default_factory=dict)  # id -> ts
    unknown_clicks: list[int] = field(default_factory=list)  # ts of clicks for impressions never sent
    accepted_ts_max: int = 0  # newest event that passes validation (the joiner's watermark follows it)

    @property
    def hostile(self) -> int:
        return sum(self.fates.values())


RAW_IP, RAW_DEVICE = "10.9.8.7", "dev-0042"  # identifiers the hostile impressions carry


def _j(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _hostile_impression(rng: random.Random, now_ms: int, ts: int, n: int) -> tuple[str, bytes]:
    """One malformed impression (or raw bytes) and the dead-letter reason it must get."""
    good: dict[str, Any] = {
        "impression_id": f"h{n}",
        "ts": ts,
        "user_id": "evil",
        "item_id": "it1",
        "features": {"device_ip": RAW_IP, "device_id": RAW_DEVICE},  # PII: never raw in a dead letter
    }
    case = rng.randrange(24)
    if case == 0:
        return "bad_json", _j(good)[:-7]  # truncated
    if case == 1:
        return "bad_json", b"[" * 30_000 + b"]" * 30_000  # deep nesting: the parser's recursion limit
    if case == 2:
        return "bad_json", b""  # a tombstone
    if case == 3:
        return "not_an_object", rng.choice([b"[1,2,3]", b'"impression"', b"42", b"null", b"true"])
    if case == 4:
        return "bad_encoding", b"\xff\xfe" + _j(good) + b"\xc3\x28"
    if case == 5:
        return "too_large", _j({**good, "features": {"blob": "x" * 70_000}})
    if case == 6:
        gone = rng.choice(["impression_id", "ts", "user_id", "item_id"])
        return "missing_field", _j({k: v for k, v in good.items() if k != gone})
    if case == 7:
        return "unknown_field", _j({**good, rng.choice(["evil", "__proto__", "$where"]): {"x": 1}})
    if case == 8:
        return "bad_type", _j({**good, "ts": rng.choice(["yesterday", "1767225600000", 1.5e12, True, None])})
    if case == 9:
        return "bad_type", _j({**good, "user_id": rng.choice([42, ["u"], {"id": "u"}, None])})
    if case == 10:
        return "bad_type", _j({**good, "features": rng.choice([[], "site=news", 7])})
    if case == 11:
        nested: Any = "x"
        for _ in range(60):
            nested = {"n": nested}
        return "bad_type", _j({**good, "features": {"site": nested}})  # nested inside a field
    if case == 12:
        return "bad_type", _j({**good, "dense": {"price": rng.choice(["high", [1], None])}})
    if case == 13:
        return "bad_id", _j({**good, "impression_id": rng.choice(["", "has space", "x" * 200, "a/b", "é"])})
    if case == 14:
        return "bad_id", _j({**good, "user_id": "u" * 129})
    if case == 15 and rng.random() < 0.5:  # no float holds it: validation once raised OverflowError
        return "bad_value", _j({**good, "dense": {"p": rng.choice([10**400, -(10**309)])}})
    if case == 15:
        return (
            "bad_value",
            b'{"impression_id":"h%d","ts":%d,"user_id":"e","item_id":"i","dense":{"p":NaN}}'
            % (
                n,
                ts,
            ),
        )
    if case == 16:
        return "bad_value", _j({**good, "features": {"site": "s" * 257}})
    if case == 17:
        return "bad_value", _j({**good, "features": {f"f{i}": "v" for i in range(65)}})
    if case == 18:
        return "bad_value", _j({**good, "features": {"bad key!": "v"}})
    if case == 19:
        return "ts_too_old", _j({**good, "ts": rng.choice([now_ms - 30 * DAY_MS, 1_000, 946_684_799_999])})
    if case == 20:
        return "ts_in_future", _j({**good, "ts": now_ms + rng.choice([DAY_MS, 365 * DAY_MS, 10**15])})
    if case == 21:
        return "ts_in_future", _j({**good, "ts": 10**30})  # an integer no clock holds: refused, not crashed
    if case == 22:
        return "bad_type", _j({**good, "model_version": 7})
    return "missing_field", _j({})


def corpus(now_ms: int, start_ms: int, valid: int = 3_000, hostile: int = 10_000, seed: int = 11) -> Corpus:
    """A valid stream from ``start_ms`` (impressions evenly spread up to two minutes before
    ``now_ms``, a click on one in ten 30 s later) with ``hostile`` bad events spread through it."""
    rng = random.Random(seed)
    out = Corpus()
    step = max(1, (now_ms - start_ms - 120_000) // valid)
    timeline: list[tuple[int, int, str, bytes, bytes]] = []  # (ts, order, kind, key, value)

    def add(ts: int, kind: str, user: str, value: bytes, accepted: bool, after: bool = False) -> None:
        # `after`: a repeat sorts after its original (same ts)
        timeline.append((ts, len(timeline) + (10**9 if after else 0), kind, user.encode(), value))
        if accepted:
            out.accepted_ts_max = max(out.accepted_ts_max, ts)

    def impression(i: int) -> dict[str, Any]:
        return {
            "impression_id": f"imp{i}",
            "ts": start_ms + i * step,
            "user_id": f"u{i % 200}",
            "item_id": f"it{i % 50}",
            "features": {"site": f"s{i % 7}"},
        }

    def click(i: int, click_id: str, user: str, delay_ms: int) -> dict[str, Any]:
        return {
            "click_id": click_id,
            "impression_id": f"imp{i}",
            "ts": start_ms + i * step + delay_ms,
            "user_id": user,
        }

    for i in range(valid):
        imp = impression(i)
        add(imp["ts"], "impression", imp["user_id"], _j(imp), True)
        out.valid_impressions[imp["impression_id"]] = imp["ts"]
        if i % 10 == 0:
            add(
                imp["ts"] + 30_000,
                "click",
                imp["user_id"],
                _j(click(i, f"c{i}", imp["user_id"], 30_000)),
                True,
            )
    for n in range(hostile):
        i = rng.randrange(valid)
        user = f"u{i % 200}"
        ts = start_ms + i * step + rng.randrange(step)
        roll = rng.random()
        if roll < 0.04:  # a message delivered twice
            fate = "duplicate_impression"
            add(start_ms + i * step, "impression", user, _j(impression(i)), True, after=True)
        elif roll < 0.06 and i % 10 == 0:
            fate = "duplicate_click"
            add(
                start_ms + i * step + 30_000,
                "click",
                user,
                _j(click(i, f"c{i}", user, 30_000)),
                True,
                after=True,
            )
        elif roll < 0.08:  # a click on a real impression, from another user
            fate = "user_mismatch"
            add(
                start_ms + i * step + 5_000,
                "click",
                user,
                _j(click(i, f"m{n}", f"u{(i + 1) % 200}", 5_000)),
                True,
            )
        elif roll < 0.10:  # a click for an impression that never comes
            fate = "unknown_impression"
            ghost = {"click_id": f"o{n}", "impression_id": f"ghost{n}", "ts": ts, "user_id": user}
            add(ts, "click", user, _j(ghost), True)
            out.unknown_clicks.append(ts)
        elif roll < 0.55:
            fate, value = _hostile_impression(rng, now_ms, ts, n)
            add(ts, "impression", user, value, False)
        else:
            fate, value = _hostile_click(rng, now_ms, ts, n)
            add(ts, "click", user, value, False)
        out.fates[fate] += 1
    timeline.sort()
    out.events = [(kind, key, value) for _, _, kind, key, value in timeline]
    return out


def _hostile_click(rng: random.Random, now_ms: int, ts: int, n: int) -> tuple[str, bytes]:
    good: dict[str, Any] = {"click_id": f"hc{n}", "impression_id": "imp0", "ts": ts, "user_id": "u0"}
    case = rng.randrange(8)
    if case == 0:
        return "bad_json", b"{'click_id': 'single quotes'}"
    if case == 1:
        return "missing_field", _j({k: v for k, v in good.items() if k != "impression_id"})
    if case == 2:
        return "unknown_field", _j({**good, "features": {}})  # clicks carry no features
    if case == 3:
        return "bad_type", _j({**good, "impression_id": 12345})
    if case == 4:
        return "bad_id", _j({**good, "click_id": "drop table;"})
    if case == 5:
        return "ts_in_future", _j({**good, "ts": now_ms + 3 * DAY_MS})
    if case == 6:
        return "bad_encoding", _j(good)[:-2] + b"\xed\xa0\x80}"  # a UTF-16 surrogate in UTF-8
    return "not_an_object", b"[]"
