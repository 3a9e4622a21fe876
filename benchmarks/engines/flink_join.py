"""The closest PyFlink (2.3.0) version of our joiner, for docs/state-engines.md.

Runs in its own venv with the Kafka connector jar (benchmarks/engines/README.md):

    python benchmarks/engines/flink_join.py --tag T --name R --jar flink-sql-connector-kafka-5.0.0-2.2.jar
        [--backend rocksdb|hashmap] [--guarantee exactly-once|at-least-once|none]
        [--checkpoint-dir DIR] [--restore-latest] [--parallelism 1] [--exec-mode process|thread]

What it does, in Flink's terms (a local mini-cluster in this process's JVM):

- one ``KafkaSource`` over both topics, bounded at their current end, event time = the Kafka
  record timestamp (= the event's ``ts``: ``harness.py produce`` checks it), watermarks
  ``for_bounded_out_of_orderness(60 s)`` per split, the operator's watermark the minimum over
  splits (both topics, every partition);
- ``key_by(user_id)`` and a ``KeyedProcessFunction``: per user, ``MapState`` of pending impressions
  (with their point-in-time user counters), of held early clicks and of finalised ids, a
  ``ValueState`` of the user's 5 min buckets; an event-time timer at each impression's window end
  emits it (label 1 if a click was attributed, else 0) once the watermark passes it: negatives
  come from the watermark over all keys, as in our joiner; timers also forget held clicks and
  finalised ids;
- per-item counters are left out (the item's state lives under other keys);
- checkpoints every 5 s into ``--checkpoint-dir`` (retained), RocksDB or heap state, and a
  ``KafkaSink`` (``EXACTLY_ONCE``: Kafka transactions committed on checkpoint completion).

``--restore-latest`` restarts from the newest completed checkpoint in ``--checkpoint-dir`` (what
a restarted job does after a kill -9 of the whole process). Prints ``RESULT {...}``: wall seconds of
``execute()`` and the CPU seconds of this process and every descendant (the JVM, the Python
workers) over it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

WINDOW_MS, LAG_S, HOLD_MS, HORIZON_MS = 900_000, 60, 900_000, 3_600_000
BUCKET_MS, WINDOWS_MS = 300_000, (3_600_000, 86_400_000)
PRIOR_A, PRIOR_CTR = 1.0, 0.05


def tree_cpu_s(root: int) -> float:
    """utime + stime of ``root`` and all its live descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    stat: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        stat[int(d)] = fields
        children.setdefault(int(fields[1]), []).append(int(d))
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stat:
            f = stat[pid]
            total += (int(f[11]) + int(f[12])) / tick
        todo += children.get(pid, [])
    return total


def build_join() -> Any:
    from pyflink.common import Types
    from pyflink.datastream import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    enc = json.JSONEncoder(separators=(",", ":"), sort_keys=True)

    def lookup(buckets: dict[str, list[int]], ts: int) -> dict[str, float]:
        b = ts // BUCKET_MS
        out: dict[str, float] = {}
        for w in WINDOWS_MS:
            lo = b - w // BUCKET_MS
            imps = clicks = 0
            for k, (i, c) in buckets.items():
                if lo < int(k) <= b:
                    imps += i
                    clicks += c
            name = f"{w // 3_600_000}h"
            out[f"user_impressions_{name}"] = float(imps)
            out[f"user_clicks_{name}"] = float(clicks)
            out[f"user_ctr_{name}"] = (clicks + PRIOR_A) / (imps + PRIOR_A / PRIOR_CTR)
        return out

    def record(buckets: dict[str, list[int]], ts: int, imp: int, click: int) -> None:
        cur = buckets.setdefault(str(ts // BUCKET_MS), [0, 0])
        cur[0] += imp
        cur[1] += click
        newest = max(int(x) for x in buckets)
        for x in [x for x in buckets if int(x) < newest - (WINDOWS_MS[-1] + 3_600_000) // BUCKET_MS]:
            del buckets[x]

    class Join(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.pending = ctx.get_map_state(MapStateDescriptor("pending", Types.STRING(), Types.STRING()))
            self.early = ctx.get_map_state(MapStateDescriptor("early", Types.STRING(), Types.STRING()))
            self.done = ctx.get_map_state(MapStateDescriptor("done", Types.STRING(), Types.LONG()))
            self.buckets = ctx.get_state(ValueStateDescriptor("buckets", Types.STRING()))

        def process_element(self, value: str, ctx: Any):  # type: ignore[override]
            ev = json.loads(value)
            ts, iid = int(ev["ts"]), ev["impression_id"]
            timers = ctx.timer_service()
            if "click_id" in ev:
                raw = self.pending.get(iid)
                if raw is not None:
                    p = json.loads(raw)
                    if p[2] is None and ts <= p[0]["ts"] + WINDOW_MS:
                        p[2] = ts
                        self.pending.put(iid, json.dumps(p))
                        b = json.loads(self.buckets.value() or "{}")
                        record(b, ts, 0, 1)
                        self.buckets.update(json.dumps(b))
                elif self.done.contains(iid) or self.early.contains(iid):
                    pass  # duplicate or late click
                else:
                    self.early.put(iid, value)
                    timers.register_event_time_timer(ts + HOLD_MS)
            else:
                if self.pending.contains(iid) or self.done.contains(iid):
                    return  # duplicate impression
                b = json.loads(self.buckets.value() or "{}")
                feats = lookup(b, ts)  # before the update: point in time
                record(b, ts, 1, 0)
                p = [ev, feats, None]
                raw_click = self.early.get(iid)
                if raw_click is not None:
                    self.early.remove(iid)
                    c = json.loads(raw_click)
                    if c["ts"] <= ts + WINDOW_MS:
                        p[2] = c["ts"]
                        record(b, c["ts"], 0, 1)
                self.buckets.update(json.dumps(b))
                self.pending.put(iid, json.dumps(p))
                timers.register_event_time_timer(
                    ts + WINDOW_MS + 1
                )  # fires once the watermark passes the end

        def on_timer(self, timestamp: int, ctx: Any):  # type: ignore[override]
            due = []
            for iid, raw in self.pending.items():
                p = json.loads(raw)
                end = p[0]["ts"] + WINDOW_MS
                if end < timestamp:
                    due.append((end, iid, p))
            for end, iid, p in sorted(due, key=lambda d: (d[0], d[1])):
                self.pending.remove(iid)
                label = int(p[2] is not None)
                forget = end + HORIZON_MS
                self.done.put(iid, -forget if label else forget)
                ctx.timer_service().register_event_time_timer(forget + 1)
                yield enc.encode(
                    {
                        "impression": p[0],
                        "label": label,
                        "label_ts": p[2] if label else end,
                        "stream_features": p[1],
                    }
                )
            for iid in [i for i, raw in self.early.items() if json.loads(raw)["ts"] + HOLD_MS < timestamp]:
                self.early.remove(iid)  # orphan click (our joiner dead-letters it)
            for iid in [i for i, f in self.done.items() if abs(f) < timestamp]:
                self.done.remove(iid)

    return Join()


def latest_checkpoint(root: Path) -> str | None:
    best = None
    for meta in root.glob("*/chk-*/_metadata"):
        n = int(meta.parent.name.split("-")[1])
        if best is None or (meta.stat().st_mtime, n) > best[0]:
            best = ((meta.stat().st_mtime, n), meta.parent)
    return None if best is None else f"file://{best[1]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--jar", required=True)
    ap.add_argument("--backend", default="rocksdb")
    ap.add_argument("--guarantee", default="exactly-once")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-s", type=float, default=5.0)
    ap.add_argument("--restore-latest", action="store_true")
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--exec-mode", default="process", help="python.execution-mode: process | thread")
    a = ap.parse_args()

    from pyflink.common import Configuration, Duration, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (
        KafkaOffsetsInitializer,
        KafkaRecordSerializationSchema,
        KafkaSink,
        KafkaSource,
    )

    started = time.monotonic()
    bootstrap = os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    ckpt = Path(a.checkpoint_dir or f"/tmp/engines-bench/engines-{a.tag}-flink-{a.name}-ckpt")
    ckpt.mkdir(parents=True, exist_ok=True)
    conf = Configuration()
    conf.set_string("pipeline.jars", f"file://{Path(a.jar).resolve()}")
    conf.set_string("python.executable", sys.executable)
    conf.set_string("python.client.executable", sys.executable)
    conf.set_string("state.backend.type", a.backend)
    conf.set_string("execution.checkpointing.dir", f"file://{ckpt}")
    conf.set_string("execution.checkpointing.interval", f"{int(a.checkpoint_s * 1000)} ms")
    conf.set_string("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION")
    conf.set_string("execution.checkpointing.num-retained", "3")
    conf.set_string("parallelism.default", str(a.parallelism))
    conf.set_string("python.execution-mode", a.exec_mode)
    restored_from = None
    if a.restore_latest:
        restored_from = latest_checkpoint(ckpt)
        if restored_from:
            conf.set_string("execution.state-recovery.path", restored_from)
    env = StreamExecutionEnvironment.get_execution_environment(conf)

    source = (
        KafkaSource.builder()
        .set_bootstrap_servers(bootstrap)
        .set_topics(f"engines-{a.tag}-impressions", f"engines-{a.tag}-clicks")
        .set_group_id(f"engines-{a.tag}-flink-{a.name}")
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_bounded(KafkaOffsetsInitializer.latest())
        .set_value_only_deserializer(SimpleStringSchema())
        .build()
    )
    wm = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(LAG_S))
    guarantee = {
        "exactly-once": DeliveryGuarantee.EXACTLY_ONCE,
        "at-least-once": DeliveryGuarantee.AT_LEAST_ONCE,
        "none": DeliveryGuarantee.NONE,
    }[a.guarantee]
    sink_b = (
        KafkaSink.builder()
        .set_bootstrap_servers(bootstrap)
        .set_record_serializer(
            KafkaRecordSerializationSchema.builder()
            .set_topic(f"engines-{a.tag}-flink-{a.name}-examples")
            .set_value_serialization_schema(SimpleStringSchema())
            .build()
        )
        .set_delivery_guarantee(guarantee)
    )
    if a.guarantee == "exactly-once":
        sink_b = sink_b.set_transactional_id_prefix(f"engines-{a.tag}-flink-{a.name}").set_property(
            "transaction.timeout.ms", "600000"
        )
    ds = env.from_source(source, wm, "kafka-events")
    from pyflink.common import Types

    out = ds.key_by(lambda v: json.loads(v)["user_id"], key_type=Types.STRING()).process(
        build_join(), output_type=Types.STRING()
    )
    out.sink_to(sink_b.build())
    cpu0, t0 = tree_cpu_s(os.getpid()), time.monotonic()
    print(f"EXECUTE restored_from={restored_from}", flush=True)
    env.execute(f"engines-{a.tag}-flink-{a.name}")
    t1, cpu1 = time.monotonic(), tree_cpu_s(os.getpid())
    res = {
        "execute_s": t1 - t0,
        "cpu_s": cpu1 - cpu0,
        "setup_s": t0 - started,
        "restored_from": restored_from,
        "backend": a.backend,
        "exec_mode": a.exec_mode,
        "guarantee": a.guarantee,
        "parallelism": a.parallelism,
    }
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
