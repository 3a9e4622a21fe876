"""Ingest throughput: the joiner + feature path, in-process and through Kafka, beside a raw consumer.

One simulated stream is published to fresh uuid-named topics; then, in the same run:

1. **raw consumer**: a plain kafka-python ``KafkaConsumer`` (its own group) reads every record of
   both topics and does nothing with them: the reference. It reads with ``fetch_max_wait_ms`` at
   ``STEADY_FETCH_WAIT_MS`` (20 ms), every other setting kafka-python's default. With the default
   500 ms, reads of the same topics ran at 48k to 149k events/s on one VM: kafka-python keeps one
   fetch in flight per broker and leaves out of it the partitions whose records are still
   buffered, so once the small clicks topic is read to its end, the fetch holds only those
   partitions and waits out its 500 ms at the broker while the impressions' buffers run dry. At
   20 ms the same reads ran at 190k-230k events/s, read after read: a reference that measures
   kafka-python, not the stalls. The joiner, CPU-bound, reads as fast either way (measured: 36k-39k
   events/s at 20, 100 and 500 ms). Both are read three times (here, after step 3 and after step 4), and each
   reference is the median of its three; the default reader's figures are kept beside
   (``default_raw_consumer_*``);
2. **in-process**: the same bytes go through validation, the per-partition tasks (joiner +
   streaming features), example encoding and the feature drain, without Kafka or Feast;
3. **raw producer**: a plain kafka-python ``KafkaProducer`` (acks=all, the sink's linger and batch
   size) sends the examples of step 2 to a fresh topic and flushes: the least producing them costs.
   With the raw consumer it gives ``kafka_python_bound_events_per_s``: the most any joiner that
   reads every event and writes one record per example with kafka-python in one process could
   reach, before joining anything (``1 / (1/consumer + examples/events / producer)``); the joiner
   writes several examples per record (``kafka.examples_per_record``), which is how it passes it;
4. **joiner over Kafka**: :class:`pipeline.daemons.joiner.JoinerDaemon` (what ``ctr joiner`` runs) in
   this process, with its consumer group, examples and dead-letter producers, Feast pushes to Redis
   (db 15) and checkpoints, until it has read everything and gone idle.

The joiner paths (2 and 4) run with the daemon's garbage-collector settings
(``daemon.gc_gen0_threshold``, :mod:`pipeline.core.gc_tuning`), the raw clients with Python's, as a
plain client would; the stream's own lists are freed before step 4, since a daemon holds none.

Rates are events per second from the first record received to the last one processed (the
consumer-group join and the daemon's start-up, one-offs, are not counted; the joiner's periodic and
final checkpoints are). ``--profile`` runs the joiner under cProfile and prints its top costs.

    python benchmarks/ingest.py [--impressions 500000] [--profile]

Prints a table and writes ``benchmarks/results/ingest.json``. Needs the services
(``./deploy/services.sh up``); topics and groups are deleted afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from pipeline.core.config import Config, KafkaConfig
from pipeline.core.events import DeadLetter
from pipeline.core.gc_tuning import tuned_gc
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from pipeline.daemons.joiner import JoinerDaemon
from pipeline.join.partition_task import PartitionTask
from pipeline.kafka.io import ensure_topics, publish_stream
from pipeline.sources.simulator import Simulator
from serving_bridge.server import kafka_partition

RESULTS = Path(__file__).parent / "results"
PARTITIONS = 3
STEADY_FETCH_WAIT_MS = 20  # the reference consumer's fetch_max_wait_ms (module docstring)


def bench_config(bootstrap: str, redis_url: str, state_dir: Path, tag: str) -> Config:
    """Defaults, plus unique topics/groups/Feast project and a validator that accepts 2026-01 events."""
    cfg = Config()
    cfg.kafka = KafkaConfig(
        bootstrap_servers=bootstrap,
        impressions_topic=f"bench-imps-{tag}",
        clicks_topic=f"bench-clicks-{tag}",
        examples_topic=f"bench-examples-{tag}",
        dead_letter_topic=f"bench-dead-{tag}",
        partitions=PARTITIONS,
        group_id_prefix=f"bench-{tag}",
    )
    cfg.daemon.state_dir = str(state_dir)
    cfg.daemon.redis_url = redis_url.rsplit("/", 1)[0] + "/15"  # the test database, never db 0
    cfg.features.project = f"bench_{tag}"
    return cfg


def raw_consumer(cfg: KafkaConfig, total: int, tag: str, **settings: Any) -> dict[str, float]:
    """A plain kafka-python consumer reading both topics to the end: records/s, nothing else.

    ``settings``: consumer settings besides kafka-python's defaults (the reference's
    ``fetch_max_wait_ms``, see the module docstring)."""
    consumer = KafkaConsumer(
        cfg.impressions_topic,
        cfg.clicks_topic,
        bootstrap_servers=cfg.bootstrap_servers,
        group_id=f"bench-raw-{tag}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **settings,
    )
    n, nbytes, first = 0, 0, None
    deadline = time.monotonic() + 600
    while n < total and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=500).values():
            if first is None:
                first = time.monotonic()
            n += len(recs)
            nbytes += sum(len(r.value) for r in recs)
    elapsed = time.monotonic() - (first or time.monotonic())
    consumer.close()
    if n < total:
        raise RuntimeError(f"raw consumer read {n} of {total} records")
    return {"events": n, "seconds": elapsed, "events_per_s": n / elapsed, "mb_per_s": nbytes / elapsed / 1e6}


def raw_producer(cfg: KafkaConfig, payloads: list[tuple[bytes, bytes]], topic: str) -> dict[str, float]:
    """A plain kafka-python producer sending ``payloads`` (key, value) to ``topic``, then flushing."""
    producer = KafkaProducer(
        bootstrap_servers=cfg.bootstrap_servers,
        acks="all",
        linger_ms=cfg.linger_ms,
        batch_size=cfg.producer_batch_bytes,
    )
    producer.send(topic, key=payloads[0][0], value=payloads[0][1]).get(timeout=30)  # metadata, warm
    started = time.monotonic()
    for key, value in payloads:
        producer.send(topic, key=key, value=value)
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    n = len(payloads)
    return {"records": n, "seconds": elapsed, "records_per_s": n / elapsed}


def in_process(
    cfg: Config, records: list[tuple[str, bytes, int]], payloads: list[tuple[bytes, bytes]]
) -> dict[str, float]:
    """Validation + partition tasks + example JSON + feature drain over ``records``, no Kafka.

    Appends each example's (key, JSON) to ``payloads``, for the raw producer."""
    # the daemon judges skew and age by each record's timestamp; here every event entered "now"
    # (clock 0 skips the two comparisons, a few ns of the validator's microseconds)
    validator = Validator(cfg.validation, ManualClock(0))
    tasks = {p: PartitionTask(cfg, p, idle_s=0.0) for p in range(PARTITIONS)}
    offsets = dict.fromkeys((k, p) for k in ("impression", "click") for p in range(PARTITIONS))
    examples = out_bytes = 0
    # the daemon's collector settings; the raw producer, measured next, runs with Python's again
    with tuned_gc(cfg.daemon.gc_gen0_threshold):
        started = time.monotonic()
        for lo in range(0, len(records), 5_000):  # one "poll" of max_poll_records
            for kind, value, p in records[lo : lo + 5_000]:
                off = offsets[kind, p] = (offsets[kind, p] or 0) + 1
                event = validator.validate(RawEvent(kind, value, "bench", p, off))
                tasks[p].offer(kind, off, None if isinstance(event, DeadLetter) else event)
            for task in tasks.values():
                task.run(at_end=lambda kind: True)
                for ex in task.drain():
                    payloads.append((ex.impression.user_id.encode(), ex.to_json()))
                    out_bytes += len(payloads[-1][1])
                    examples += 1
        for task in tasks.values():
            task.user_rows()
        elapsed = time.monotonic() - started
    return {
        "events": len(records),
        "examples": examples,
        "seconds": elapsed,
        "events_per_s": len(records) / elapsed,
    }


def joiner_over_kafka(cfg: Config, total: int, profile: bool) -> dict[str, Any]:
    """Run the joiner daemon in this process until it has read ``total`` events and gone idle."""
    daemon = JoinerDaemon(cfg)
    marks: dict[str, float] = {}
    process = daemon._process

    def timed(batch: list[RawEvent]) -> None:  # the first record in, the last one processed
        marks.setdefault("first", time.monotonic())
        process(batch)
        if daemon.counters["events"] >= total and "last" not in marks:
            marks["last"] = time.monotonic()

    daemon._process = timed  # type: ignore[method-assign]
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    counters = daemon.run(max_idle_s=3.0)
    if profiler:
        profiler.disable()
    elapsed = marks["last"] - marks["first"]
    out: dict[str, Any] = {**counters, "seconds": elapsed, "events_per_s": counters["events"] / elapsed}
    out["checkpoint_seconds_total"] = daemon.checkpoint_seconds
    # flush (producers acknowledged), features (Feast push), state (changelog transaction + offsets)
    out["checkpoint_phase_seconds"] = dict(daemon.observed.phase_seconds)
    if profiler:
        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumulative").print_stats(r"pipeline|features|kafka_client", 25)
        out["profile_top"] = buf.getvalue()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impressions", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--profile", action="store_true", help="cProfile the joiner; print its top costs")
    ap.add_argument("--out", type=Path, default=RESULTS / "ingest.json")
    args = ap.parse_args(argv)
    bootstrap = os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("CTR_DAEMON_REDIS_URL", "redis://127.0.0.1:16379/0")
    tag = uuid.uuid4().hex[:10]

    sim = Simulator(Config().simulator, args.seed)
    events = list(sim.stream(args.impressions))
    records = [
        (kind, json.dumps(ev, separators=(",", ":")).encode(), kafka_partition(ev["user_id"], PARTITIONS))
        for kind, ev in events
    ]
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        cfg = bench_config(bootstrap, redis_url, Path(tmp), tag)
        k = cfg.kafka
        raw_topic = f"bench-rawprod-{tag}"
        ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.examples_topic, raw_topic], PARTITIONS)
        try:
            t0 = time.monotonic()
            publish_stream(k, events)
            publish_s = time.monotonic() - t0
            total = len(events)
            raws, defaults = [], []

            def read_twice(i: int) -> None:  # the reference, then kafka-python's defaults
                raws.append(raw_consumer(k, total, f"{tag}-{i}", fetch_max_wait_ms=STEADY_FETCH_WAIT_MS))
                defaults.append(raw_consumer(k, total, f"{tag}-d{i}"))

            read_twice(0)
            payloads: list[tuple[bytes, bytes]] = []
            inproc = in_process(cfg, records, payloads)
            producer = raw_producer(k, payloads, raw_topic)
            # a daemon's process holds none of these: its garbage collector must not walk them here
            for data in (events, records, payloads):
                data.clear()
            read_twice(1)
            joiner = joiner_over_kafka(cfg, total, args.profile)
            read_twice(2)
        finally:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            topics = [k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic, raw_topic]
            admin.delete_topics([t for t in topics if t in set(admin.list_topics())])
            raw_groups = [f"bench-raw-{tag}-{d}{i}" for i in range(3) for d in ("", "d")]
            for g in [*raw_groups, f"{k.group_id_prefix}-joiner"]:
                try:
                    admin.delete_groups([g])
                except Exception as exc:  # cleanup must not hide the figures
                    print(f"warning: could not delete group {g}: {exc!r}", file=sys.stderr)
            admin.close()

    profile_top = joiner.pop("profile_top", None)
    raw = sorted(raws, key=lambda r: r["events_per_s"])[len(raws) // 2]  # the median run: the reference
    default = sorted(defaults, key=lambda r: r["events_per_s"])[len(defaults) // 2]
    per_event_s = 1 / raw["events_per_s"] + (inproc["examples"] / total) / producer["records_per_s"]
    bound = 1 / per_event_s
    result = {
        "events": total,
        "impressions": args.impressions,
        "publish_events_per_s": total / publish_s,
        "events_per_s": joiner["events_per_s"],
        "raw_consumer_events_per_s": raw["events_per_s"],
        "ratio_to_raw_consumer": joiner["events_per_s"] / raw["events_per_s"],
        "raw_consumer_runs_events_per_s": [r["events_per_s"] for r in raws],
        "raw_consumer_fetch_max_wait_ms": STEADY_FETCH_WAIT_MS,
        "ratio_to_fastest_raw_consumer": joiner["events_per_s"] / max(r["events_per_s"] for r in raws),
        "default_raw_consumer_events_per_s": default["events_per_s"],
        "default_raw_consumer_runs_events_per_s": [r["events_per_s"] for r in defaults],
        "ratio_to_default_raw_consumer": joiner["events_per_s"] / default["events_per_s"],
        "in_process_events_per_s": inproc["events_per_s"],
        "in_process_ratio_to_raw_consumer": inproc["events_per_s"] / raw["events_per_s"],
        "raw_producer_records_per_s": producer["records_per_s"],
        "kafka_python_bound_events_per_s": bound,
        "kafka_python_bound_ratio_to_raw_consumer": bound / raw["events_per_s"],
        "joiner": joiner,
        "raw_producer": producer,
        "raw_consumer": raw,
        "in_process": inproc,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0],
        },
    }
    for name, reads in (
        (f"raw consumer runs (fetch_max_wait_ms {STEADY_FETCH_WAIT_MS})", raws),
        ("default raw consumer runs (fetch_max_wait_ms 500)", defaults),
    ):
        runs = ", ".join(f"{r['events_per_s']:,.0f}" for r in reads)
        print(f"{name}, before, between and after the joiner paths: {runs} events/s")
    print(f"{'path':<28}{'events':>10}{'seconds':>10}{'events/s':>12}{'x raw':>8}")
    for name, r in (
        ("raw kafka-python consumer", raw),
        ("  the same, 500 ms fetch wait", default),
        ("joiner in-process", inproc),
        ("joiner over Kafka", joiner),
    ):
        print(
            f"{name:<28}{r['events']:>10}{r['seconds']:>10.2f}{r['events_per_s']:>12,.0f}"
            f"{r['events_per_s'] / raw['events_per_s']:>8.2f}"
        )
    print(
        f"{'raw kafka-python producer':<28}{producer['records']:>10}{producer['seconds']:>10.2f}"
        f"{producer['records_per_s']:>12,.0f}{'':>8}  (examples: records/s)"
    )
    print(
        f"{'bound: consume + produce':<28}{'':>10}{'':>10}{bound:>12,.0f}{bound / raw['events_per_s']:>8.2f}"
        "  (no joining at all)"
    )
    phases = ", ".join(f"{p} {s:.2f} s" for p, s in joiner["checkpoint_phase_seconds"].items())
    print(
        f"joiner checkpoints: {joiner['checkpoints']}, {joiner['checkpoint_seconds_total']:.2f} s "
        f"of its {joiner['seconds']:.2f} s ({phases})"
    )
    load = result["machine"]["load_avg_1m"]
    print(f"(published at {result['publish_events_per_s']:,.0f} events/s; load average {load:.2f})")
    if profile_top:
        print(profile_top)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
