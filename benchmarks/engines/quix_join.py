"""The closest Quix Streams (3.28.1) version of our joiner, for docs/state-engines.md.

Runs in its own venv (benchmarks/engines/README.md), reads the stream ``harness.py produce`` wrote:

    python benchmarks/engines/quix_join.py --tag T --name R [--idle-s 8] [--state-dir DIR]

What it does, in Quix's terms:

- ``app.dataframe(impressions).concat(app.dataframe(clicks))``: one stream keyed by user id. Quix
  aligns the two topics' partition *p* by timestamp (``require_time_alignment``: it pops from the
  buffer with the smallest next timestamp and waits while a non-idle buffer is empty); both topics
  take their timestamps from the events' ``ts`` (``timestamp_extractor``);
- ``.apply(join, stateful=True, expand=True)``: per user, in the RocksDB store (changelog topic,
  ``processing_guarantee="exactly-once"``): pending impressions with their point-in-time user
  counters, held early clicks, finalised ids for dedup (with a horizon), the user's sliding-window
  counters (1 h, 24 h over 5 min buckets, as features/aggregations.py);
- emission: Quix gives a stateful function only the state of *the message's key* and no timers,
  so an impression is finalised when an event *of the same user* moves that user's event time past
  its window end + the watermark lag (our joiner: the partition's watermark, over all users);
- per-item counters are left out: they would need the state of other keys (or a ``group_by``
  repartition by item, which loses the point-in-time order against the user stream);
- the sink: ``to_topic(engines-T-quix-R-examples)`` (3 partitions), transactional (EOS).

Prints ``RESULT {...}``: events, examples, first/last record times and CPU seconds
(``time.process_time``, all threads of the process: librdkafka's too) between them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from quixstreams import Application, State
from quixstreams.models.topics import TopicConfig
from quixstreams.models.topics.manager import TopicManager

WINDOW_MS = 900_000  # JoinerConfig.attribution_window_s
LAG_MS = 60_000  # watermark_lag_s
HOLD_MS = 900_000  # early_click_hold_s
HORIZON_MS = 3_600_000  # dedup_horizon_s
BUCKET_MS = 300_000  # FeatureConfig.bucket_s
WINDOWS_MS = (3_600_000, 86_400_000)
PRIOR_A, PRIOR_CTR = 1.0, 0.05
_ENC = json.JSONEncoder(separators=(",", ":"), sort_keys=True)

# Quix names its internal topics "changelog__<group>--...": prefix them with the group (engines-...)
# so that everything this benchmark creates starts with "engines-" and cleanup finds it.
_orig_internal_name = TopicManager._internal_name


def _internal_name(self: Any, topic_type: str, topic_name: Any, suffix: str) -> str:
    return f"{self._consumer_group}.{_orig_internal_name(self, topic_type, topic_name, suffix)}"


TopicManager._internal_name = _internal_name  # type: ignore[method-assign]

STATS: dict[str, Any] = {"events": 0, "examples": 0, "late_clicks": 0, "duplicates": 0, "early": 0}


def _lookup(buckets: dict[str, list[int]], ts: int) -> dict[str, float]:
    b = ts // BUCKET_MS
    out: dict[str, float] = {}
    for w in WINDOWS_MS:
        lo = b - w // BUCKET_MS
        imps = clicks = 0
        for k, (i, c) in buckets.items():
            kb = int(k)
            if lo < kb <= b:
                imps += i
                clicks += c
        name = f"{w // 3_600_000}h"
        out[f"user_impressions_{name}"] = float(imps)
        out[f"user_clicks_{name}"] = float(clicks)
        out[f"user_ctr_{name}"] = (clicks + PRIOR_A) / (imps + PRIOR_A / PRIOR_CTR)
    return out


def _record(buckets: dict[str, list[int]], ts: int, imp: int, click: int) -> None:
    k = str(ts // BUCKET_MS)
    cur = buckets.setdefault(k, [0, 0])
    cur[0] += imp
    cur[1] += click
    newest = max(int(x) for x in buckets)
    for x in [x for x in buckets if int(x) < newest - (WINDOWS_MS[-1] + 3_600_000) // BUCKET_MS]:
        del buckets[x]


def _push(state: State, fifo: str, item: list[Any]) -> None:
    t = state.get(fifo + "t", 0)
    state.set(f"{fifo}q:{t}", item)
    state.set(fifo + "t", t + 1)


def _pop_before(state: State, fifo: str, wm: int) -> list[str]:
    h, t = state.get(fifo + "h", 0), state.get(fifo + "t", 0)
    out = []
    while h < t:
        at, key = state.get(f"{fifo}q:{h}")
        if at >= wm:
            break
        state.delete(f"{fifo}q:{h}")
        out.append(key)
        h += 1
    if out:
        state.set(fifo + "h", h)
    return out


def join(value: dict[str, Any], state: State) -> list[bytes]:
    """One event of one user; returns the examples it finalised (as our joiner's JSON).

    State of a user (sub-keys of its key, so that no write re-serialises the user's whole state):
    ``p:<iid>`` a pending impression ``[impression, features, click_ts]``; a FIFO of window ends
    ``q:<n>`` between the counters ``qh``/``qt`` (a user's impressions arrive in ``ts`` order from
    the time-aligned merge); ``e:<iid>`` an early click, ``d:<iid>`` a finalised id (the sign is the
    label), each forgotten through its own FIFO (``eq:``/``dq:``) after the hold, or window + dedup
    horizon (Quix's event-time TTL is not used: the first TTL write on a populated store partition
    stamps every earlier record, FIFO entries included, with an implicit expiry); ``b`` the
    user's 5 min buckets of the last 25 h; ``m`` the user's highest event time.
    """
    now = time.monotonic()
    if "first" not in STATS:
        STATS["first"], STATS["cpu_first"] = now, time.process_time()
    STATS["events"] += 1
    ts = int(value["ts"])
    iid = value["impression_id"]
    max_ts = max(state.get("m", 0), ts)
    state.set("m", max_ts)
    if "click_id" in value:
        p = state.get("p:" + iid)
        if p is not None:
            if p[2] is not None:
                STATS["duplicates"] += 1
            elif ts > p[0]["ts"] + WINDOW_MS:
                STATS["late_clicks"] += 1
            else:
                p[2] = ts
                state.set("p:" + iid, p)
                buckets = state.get("b", {})
                _record(buckets, ts, 0, 1)
                state.set("b", buckets)
        elif (d := state.get("d:" + iid)) is not None:
            STATS["late_clicks" if d > 0 else "duplicates"] += 1
        elif state.exists("e:" + iid):
            STATS["duplicates"] += 1
        else:
            STATS["early"] += 1
            state.set("e:" + iid, value)
            _push(state, "e", [ts + HOLD_MS, iid])
    else:
        if state.exists("p:" + iid) or state.exists("d:" + iid):
            STATS["duplicates"] += 1
        else:
            buckets = state.get("b", {})
            feats = _lookup(buckets, ts)  # before the update: point in time
            _record(buckets, ts, 1, 0)
            p = [value, feats, None]
            click = state.get("e:" + iid)
            if click is not None:
                state.delete("e:" + iid)
                if click["ts"] <= ts + WINDOW_MS:
                    p[2] = click["ts"]
                    _record(buckets, click["ts"], 0, 1)
            state.set("b", buckets)
            state.set("p:" + iid, p)
            qt = state.get("qt", 0)
            state.set(f"q:{qt}", [ts + WINDOW_MS, iid])
            state.set("qt", qt + 1)
    wm = max_ts - LAG_MS
    out: list[bytes] = []
    qh, qt = state.get("qh", 0), state.get("qt", 0)
    while qh < qt:
        end, pid = state.get(f"q:{qh}")
        if end >= wm:
            break
        state.delete(f"q:{qh}")
        qh += 1
        imp, feats, click_ts = state.get("p:" + pid)
        state.delete("p:" + pid)
        label = int(click_ts is not None)
        state.set("d:" + pid, -1 if label else 1)
        _push(state, "d", [end + HORIZON_MS, pid])
        out.append(
            _ENC.encode(
                {
                    "impression": imp,
                    "label": label,
                    "label_ts": click_ts if label else end,
                    "stream_features": feats,
                }
            ).encode()
        )
    state.set("qh", qh)
    for fifo in ("e", "d"):  # forget held clicks after the hold (orphans), ids after the horizon
        for gone in _pop_before(state, fifo, wm):
            state.delete(f"{fifo}:{gone}")
    STATS["examples"] += len(out)
    STATS["last"], STATS["cpu_last"] = time.monotonic(), time.process_time()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--idle-s", type=float, default=8.0)
    ap.add_argument("--guarantee", default="exactly-once")
    ap.add_argument("--commit-interval", type=float, default=5.0)
    a = ap.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    started = time.monotonic()
    group = f"engines-{a.tag}-quix-{a.name}"
    app = Application(
        broker_address=os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=a.guarantee,
        commit_interval=a.commit_interval,
        state_dir=a.state_dir or f"/tmp/engines-bench/{group}-state-{os.getpid()}",
        loglevel="INFO",
    )
    ts = lambda value, headers, timestamp, ttype: int(value["ts"])  # noqa: E731  event time
    imps = app.topic(f"engines-{a.tag}-impressions", value_deserializer="json", timestamp_extractor=ts)
    clicks = app.topic(f"engines-{a.tag}-clicks", value_deserializer="json", timestamp_extractor=ts)
    out = app.topic(
        f"engines-{a.tag}-quix-{a.name}-examples",
        value_serializer="bytes",
        key_serializer="bytes",
        config=TopicConfig(num_partitions=3, replication_factor=1),
    )
    sdf = app.dataframe(imps).concat(app.dataframe(clicks))
    sdf = sdf.apply(join, stateful=True, expand=True)
    sdf.to_topic(out)
    app.run(timeout=a.idle_s)
    res = {**STATS, "started": started, "end": time.monotonic(), "cpu_end": time.process_time()}
    if "first" in STATS:
        res["events_per_s"] = STATS["events"] / (STATS["last"] - STATS["first"])
        res["cpu_s"] = STATS["cpu_last"] - STATS["cpu_first"]
        res["events_per_cpu_s"] = STATS["events"] / res["cpu_s"]
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
