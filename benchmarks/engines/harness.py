"""Stream, reference joiner and checker for the engine comparison (docs/state-engines.md).

Runs in the project's venv (``$(./deploy/venv.sh)/bin/python``, ``PYTHONPATH=.``). Everything it
creates is named ``engines-<tag>-...`` (topics, consumer groups) and ``cleanup`` deletes it.

    python benchmarks/engines/harness.py produce --tag T [--impressions 100000]
    python benchmarks/engines/harness.py ours --tag T --name R [--kill-after-examples N]
                                             [--second-after-examples N] [--max-idle-s S]
    python benchmarks/engines/harness.py drive --name R --out-topic TOPIC --logs DIR [...] -- WORKER ARGS
    python benchmarks/engines/harness.py compare --ref TOPIC --test TOPIC [--test TOPIC ...]
    python benchmarks/engines/harness.py cleanup --tag T

``produce`` publishes one simulated stream (``Simulator(seed)``, as ``benchmarks/ingest.py`` does)
to ``engines-T-impressions`` / ``engines-T-clicks`` (3 partitions, keyed by user id, each record
stamped with its event's entry time).

``ours`` runs today's joiner (:class:`pipeline.daemons.joiner.JoinerDaemon`, what ``ctr joiner``
runs) in child processes of one consumer group writing ``engines-T-ours-R-examples``:
``--kill-after-examples N`` SIGKILLs the first process once N examples are on the topic and starts a
new one on the same state folder; ``--second-after-examples N`` starts a second member of the group
(a partition moves to it, with its checkpoint file: same state folder) once N examples are out.
Each worker reports its events, examples and the CPU seconds (``time.process_time``) between its
first record and its last processed one.

``compare`` reads topics to their end (``read_committed``) and counts, against the reference:
distinct example ids, duplicate records, missing and extra ids, ids whose bytes differ, label
differences, and whether each partition's sequence (first copy of each id) is identical.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

PARTITIONS = 3
BOOTSTRAP = os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
REDIS = os.environ.get("CTR_DAEMON_REDIS_URL", "redis://127.0.0.1:16379/0")
WORK = Path(os.environ.get("ENGINES_WORK", "/tmp/engines-bench"))


def topics(tag: str) -> dict[str, str]:
    return {"impressions": f"engines-{tag}-impressions", "clicks": f"engines-{tag}-clicks"}


# -- produce ---------------------------------------------------------------------------------------
def produce(tag: str, impressions: int, seed: int) -> dict[str, Any]:
    from pipeline.core.config import Config, KafkaConfig
    from pipeline.kafka.io import ensure_topics, publish_stream
    from pipeline.sources.simulator import Simulator

    t = topics(tag)
    k = KafkaConfig(
        bootstrap_servers=BOOTSTRAP,
        impressions_topic=t["impressions"],
        clicks_topic=t["clicks"],
        partitions=PARTITIONS,
    )
    ensure_topics(k, [t["impressions"], t["clicks"]], PARTITIONS)
    events = list(Simulator(Config().simulator, seed).stream(impressions))
    t0 = time.monotonic()
    counts = publish_stream(k, events)
    out = {
        "tag": tag,
        "events": len(events),
        "counts": counts,
        "publish_s": time.monotonic() - t0,
        "seed": seed,
        "impressions": impressions,
    }
    # do the record timestamps equal the events' own ts? (engines that order by record time)
    mism = n = 0
    for topic in t.values():
        for rec in read_topic(topic):
            n += 1
            mism += json.loads(rec[3])["ts"] != rec[4]
    out["record_ts_differs_from_event_ts"] = mism
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{tag}-stream.json").write_text(json.dumps(out, indent=2))
    return out


# -- our joiner ------------------------------------------------------------------------------------
def ours_env(tag: str, name: str, state: Path) -> dict[str, str]:
    t = topics(tag)
    return {
        **os.environ,
        "CTR_KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP,
        "CTR_KAFKA_IMPRESSIONS_TOPIC": t["impressions"],
        "CTR_KAFKA_CLICKS_TOPIC": t["clicks"],
        "CTR_KAFKA_EXAMPLES_TOPIC": f"engines-{tag}-ours-{name}-examples",
        "CTR_KAFKA_DEAD_LETTER_TOPIC": f"engines-{tag}-ours-{name}-dead",
        "CTR_KAFKA_PARTITIONS": str(PARTITIONS),
        "CTR_KAFKA_GROUP_ID_PREFIX": f"engines-{tag}-ours-{name}",
        "CTR_DAEMON_STATE_DIR": str(state),
        "CTR_DAEMON_REDIS_URL": REDIS.rsplit("/", 1)[0] + "/15",
        "CTR_FEATURES_PROJECT": f"engines_{tag}_{name}",
    }


def ours_worker(max_idle_s: float) -> None:
    """One joiner process (configured from the environment): run until idle, print its figures."""
    from pipeline.core.config_loader import load_config
    from pipeline.daemons.joiner import JoinerDaemon

    cfg = load_config()  # the CTR_* environment set by ours_env
    daemon = JoinerDaemon(cfg)
    marks: dict[str, float] = {}
    process = daemon._process

    def timed(batch: list[Any]) -> None:
        if "first" not in marks:
            marks["first"], marks["cpu_first"] = time.monotonic(), time.process_time()
        process(batch)
        marks["last"], marks["cpu_last"] = time.monotonic(), time.process_time()

    daemon._process = timed  # type: ignore[method-assign]
    started = time.monotonic()
    counters = daemon.run(max_idle_s=max_idle_s)
    end = {"end": time.monotonic(), "cpu_end": time.process_time()}
    print("RESULT " + json.dumps({**counters, **marks, **end, "started": started}), flush=True)


def run_ours(tag: str, name: str, kill_after: int, second_after: int, max_idle_s: float) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix=f"engines-{tag}-ours-{name}-"))
    env = ours_env(tag, name, state)
    cmd = [sys.executable, __file__, "ours-worker", "--max-idle-s", str(max_idle_s)]
    return drive(
        cmd, env, env["CTR_KAFKA_EXAMPLES_TOPIC"], WORK / f"{tag}-ours-{name}", kill_after, second_after, name
    )


def drive(
    cmd: list[str],
    env: dict[str, str],
    out_topic: str,
    logs: Path,
    kill_after: int,
    second_after: int,
    name: str,
) -> dict[str, Any]:
    """Run ``cmd`` (a worker printing ``RESULT {json}``); SIGKILL + restart it, or add a second one."""
    logs.mkdir(parents=True, exist_ok=True)

    def start(i: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [c.replace("{i}", str(i)) for c in cmd],  # {i}: the worker's number (0, 1)
            env=env,
            stdout=open(logs / f"w{i}.out", "w"),
            stderr=open(logs / f"w{i}.err", "w"),
            text=True,
        )

    t0 = time.monotonic()
    procs = [start(0)]
    info: dict[str, Any] = {"name": name, "topic": out_topic}
    if kill_after or second_after:
        threshold = kill_after or second_after
        while count_records(out_topic) < threshold:
            if procs[0].poll() is not None:
                raise RuntimeError("worker ended before the threshold")
            time.sleep(0.2)
        if kill_after:
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait()
            info["killed_at_examples"] = count_records(out_topic)
            killed_at = time.monotonic()
            procs.append(start(1))
            # recovery: from the kill to the examples topic growing again
            base = count_records(out_topic)
            while count_records(out_topic) <= base and procs[1].poll() is None:
                time.sleep(0.1)
            info["resume_s"] = time.monotonic() - killed_at
        else:
            info["second_started_at_examples"] = count_records(out_topic)
            procs.append(start(1))
    for p in procs:
        if p.poll() is None or p.returncode is not None:
            p.wait()
    info["wall_s"] = time.monotonic() - t0
    workers = []
    for i, p in enumerate(procs):
        text = (logs / f"w{i}.out").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        workers.append(json.loads(lines[-1][7:]) if lines else {"returncode": p.returncode})
    info["workers"] = workers
    w = workers[0]
    if not (kill_after or second_after) and "first" in w:
        info["events_per_s"] = w["events"] / (w["last"] - w["first"])
        info["cpu_s"] = w["cpu_last"] - w["cpu_first"]
        info["events_per_cpu_s"] = w["events"] / info["cpu_s"]
    return info


# -- reading and comparing -------------------------------------------------------------------------
def read_topic(topic: str) -> list[tuple[int, int, bytes | None, bytes, int]]:
    """Every committed record of ``topic``: (partition, offset, key, value, timestamp)."""
    c = KafkaConsumer(
        bootstrap_servers=BOOTSTRAP,
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=3000,
    )
    parts = c.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    ends = c.end_offsets(tps)
    out = []
    for tp in tps:
        c.pause(*tps)
        c.resume(tp)
        while c.position(tp) < ends[tp]:
            for recs in c.poll(timeout_ms=1000).values():
                out += [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in recs]
    c.close()
    return out


def count_records(topic: str) -> int:
    c = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    try:
        parts = c.partitions_for_topic(topic)
        if not parts:
            return 0
        tps = [TopicPartition(topic, p) for p in parts]
        return sum(c.end_offsets(tps).values())
    finally:
        c.close()


def _id_label(value: bytes) -> tuple[str, int]:
    d = json.loads(value)
    return d["impression"]["impression_id"], int(d["label"])


def summarize(records: list[tuple[int, int, bytes | None, bytes, int]]) -> dict[str, Any]:
    first: dict[str, bytes] = {}
    seqs: dict[int, list[str]] = {}
    dups = 0
    variants = 0
    for part, _off, _key, value, _ts in records:
        iid, _ = _id_label(value)
        if iid in first:
            dups += 1
            variants += first[iid] != value
            continue
        first[iid] = value
        seqs.setdefault(part, []).append(iid)
    return {
        "first": first,
        "seqs": seqs,
        "records": len(records),
        "duplicate_records": dups,
        "duplicates_with_other_bytes": variants,
    }


def compare(ref_topic: str, test_topics: list[str]) -> dict[str, Any]:
    ref = summarize(read_topic(ref_topic))
    out: dict[str, Any] = {
        "reference": ref_topic,
        "reference_records": ref["records"],
        "reference_examples": len(ref["first"]),
        "reference_positives": sum(_id_label(v)[1] for v in ref["first"].values()),
    }
    for topic in test_topics:
        s = summarize(read_topic(topic))
        rf, tf = ref["first"], s["first"]
        common = rf.keys() & tf.keys()
        out[topic] = {
            "records": s["records"],
            "examples": len(tf),
            "positives": sum(_id_label(v)[1] for v in tf.values()),
            "duplicate_records": s["duplicate_records"],
            "duplicates_with_other_bytes": s["duplicates_with_other_bytes"],
            "missing_vs_reference": len(rf.keys() - tf.keys()),
            "extra_vs_reference": len(tf.keys() - rf.keys()),
            "label_differs": sum(_id_label(rf[i])[1] != _id_label(tf[i])[1] for i in common),
            "bytes_differ": sum(rf[i] != tf[i] for i in common),
            "same_sequence_per_partition": s["seqs"] == ref["seqs"],
        }
    return out


def cleanup(tag: str) -> dict[str, Any]:
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    mine = [t for t in admin.list_topics() if t.startswith(f"engines-{tag}")]
    if mine:
        admin.delete_topics(mine)
    listed = admin.list_groups() if hasattr(admin, "list_groups") else admin.list_consumer_groups()
    names = [g["group_id"] if isinstance(g, dict) else g[0] for g in listed]  # kafka-python 3.x / 2.x
    groups = [g for g in names if g.startswith(f"engines-{tag}")]
    for g in groups:
        try:
            admin.delete_groups([g])
        except Exception as exc:
            print(f"warning: group {g}: {exc!r}", file=sys.stderr)
    admin.close()
    return {"topics": mine, "groups": groups}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--tag", required=True)
    p.add_argument("--impressions", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=21)
    p = sub.add_parser("ours")
    p.add_argument("--tag", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--kill-after-examples", type=int, default=0)
    p.add_argument("--second-after-examples", type=int, default=0)
    p.add_argument("--max-idle-s", type=float, default=5.0)
    p = sub.add_parser("drive", help="run any engine worker command with a kill or a second member")
    p.add_argument("--out-topic", required=True)
    p.add_argument("--logs", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--kill-after-examples", type=int, default=0)
    p.add_argument("--second-after-examples", type=int, default=0)
    p.add_argument("worker", nargs=argparse.REMAINDER)
    p = sub.add_parser("ours-worker")
    p.add_argument("--max-idle-s", type=float, default=5.0)
    p = sub.add_parser("compare")
    p.add_argument("--ref", required=True)
    p.add_argument("--test", action="append", default=[])
    p = sub.add_parser("cleanup")
    p.add_argument("--tag", required=True)
    a = ap.parse_args()
    if a.cmd == "produce":
        res: Any = produce(a.tag, a.impressions, a.seed)
    elif a.cmd == "ours":
        res = run_ours(a.tag, a.name, a.kill_after_examples, a.second_after_examples, a.max_idle_s)
    elif a.cmd == "drive":
        worker = a.worker[1:] if a.worker[:1] == ["--"] else a.worker
        res = drive(
            worker,
            dict(os.environ),
            a.out_topic,
            Path(a.logs),
            a.kill_after_examples,
            a.second_after_examples,
            a.name,
        )
    elif a.cmd == "ours-worker":
        ours_worker(a.max_idle_s)
        return 0
    elif a.cmd == "compare":
        res = compare(a.ref, a.test)
    else:
        res = cleanup(a.tag)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
