"""Scale-out: trainer examples/s with 1 and more ranks, joiner events/s with 1 to 3 processes.

**Trainer** (row-sharded tables, trainers/sharding.py).
For each rank count, ``torchrun --standalone --nproc-per-node R`` runs this script's ``--rank``
mode: every rank builds the same learner (DeepFM on Criteo-shaped rows, ``benchmarks/train.py``'s
synthetic blocks), learns ``--blocks`` blocks of ``--examples`` rows after one warm-up block, and
reports the timed blocks' examples/s, the rows of each hashed table it holds, and its peak
resident memory. The ranks share the machine's cores: ``R`` ranks get ``cores / R`` torch threads
each, one process gets them all, so the figures compare the same CPU time spent two ways. The
reference is the one-process learner (the default, what runs without torchrun).

**Joiner state** (``benchmarks/joiner_state.py``, needs Kafka): checkpoint cost and restore time
of one partition task against its number of users (10k, 100k, 1M), the whole-state file before
against the changelog topic after.

**Joiner** (needs the services, ``./deploy/services.sh up``): one simulated stream is published
to topics of :data:`JOINER_PARTITIONS` partitions; then for 1, 2 and 3 processes, ``ctr joiner``
processes (each its own state folder, one consumer group, what the systemd unit runs) read it all
and exit when idle. The rate is the stream's events over the span of the examples they wrote (the
Kafka timestamps of the first and last example record). The stream is published once every
process holds its partitions (the group is stable), so no rebalance replays anything: what scaling
out costs at start-up is not in the figure, and the joiners read while the stream is produced, so
a rate near ``publish_events_per_s`` (measured in the same run) is the publisher's, not theirs.
Per process: the events it read and its examples. The reference is a raw kafka-python consumer
reading the same topics afterwards.

Run: ``python benchmarks/scaleout.py`` (ranks 1 and 2, 2^20 and 2^24 rows; joiner 1-3 processes);
``--parts trainer``, ``joiner`` or ``state`` (the parts not run keep their figures in the file);
``--quick`` for a smoke run. Writes
``benchmarks/results/scaleout.json``::

    {"meta": {...}, "trainer": {"<rows>": {"<ranks>": {"examples_per_s", "rows_per_rank",
                                                       "peak_rss_mb_per_rank", ...}}},
     "joiner": {"raw_consumer_events_per_s", "<processes>": {"events_per_s", "ratio_to_raw_consumer",
                                                             "per_process": [...]}}}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import make_cfg, make_learner, synthetic_block  # a script beside this one

RESULTS = Path(__file__).resolve().parent / "results"
JOINER_PARTITIONS = 6  # divides evenly among 1, 2 and 3 processes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2", help="comma list of rank counts")
    p.add_argument("--rows", default=f"{1 << 20},{1 << 24}", help="comma list of hashed table rows")
    p.add_argument("--examples", type=int, default=65_536, help="examples per block")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks (after one warm-up block)")
    p.add_argument("--batch", type=int, default=4096, help="examples per optimizer step (all ranks)")
    p.add_argument(
        "--parts",
        default="trainer,joiner,state",
        help="comma list: trainer, joiner, state (the last two need the services)",
    )
    p.add_argument(
        "--state-users", default="10000,100000,1000000", help="state: comma list of users in one task"
    )
    p.add_argument("--processes", default="1,2,3", help="joiner: comma list of process counts")
    p.add_argument("--impressions", type=int, default=150_000, help="joiner: simulated impressions")
    p.add_argument("--quick", action="store_true", help="smoke: 2^16 rows, blocks of 8k, 1 timed block")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/scaleout[-quick].json)")
    p.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # the per-rank mode, under torchrun
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.examples, args.blocks, args.impressions = str(1 << 16), 8192, 1, 20_000
        args.state_users = "2000"
    return args


def rank_main(args: argparse.Namespace) -> None:
    """One rank: learn the blocks, write what it measured to ``--rank-out``-<rank>.json."""
    from trainers.sharding import join_launched_group

    sharding = join_launched_group("cpu")
    world = 1 if sharding is None else sharding.world
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    rows = int(args.rows)
    learner = make_learner(make_cfg("deepfm", rows, args.batch, "cpu"))
    blocks = [synthetic_block(args.examples, rows, seed=b) for b in range(args.blocks + 1)]
    learner.learn(blocks[0])  # warm-up: first-touch of the tables and optimizer state
    start = time.perf_counter()
    for block in blocks[1:]:
        learner.learn(block)
    seconds = time.perf_counter() - start
    held = {n: m.num_embeddings for n, m in learner.model.named_modules() if n.endswith(".table")}
    rank = 0 if sharding is None else sharding.rank
    out = {
        "examples_per_s": args.examples * args.blocks / seconds,
        "seconds": seconds,
        "rows_per_rank": held,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }
    Path(f"{args.rank_out}-{rank}.json").write_text(json.dumps(out))


def measure(ranks: int, rows: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    base = scratch / f"r{ranks}-{rows}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd += [__file__, "--rank-out", str(base), "--rows", str(rows), "--examples", str(args.examples)]
    cmd += ["--blocks", str(args.blocks), "--batch", str(args.batch)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    per_rank = [json.loads(Path(f"{base}-{r}.json").read_text()) for r in range(ranks)]
    first = per_rank[0]
    return {
        "examples_per_s": round(min(float(p["examples_per_s"]) for p in per_rank), 1),
        "rows_per_rank": first["rows_per_rank"],
        "peak_rss_mb_per_rank": [round(float(p["peak_rss_mb"])) for p in per_rank],
        "threads_per_rank": first["threads"],
    }


def joiner_scaleout(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """``ctr joiner`` with 1, 2, 3 processes in one group over one stream (see above)."""
    import uuid

    from ingest import STEADY_FETCH_WAIT_MS, bench_config, raw_consumer  # a script beside this one
    from kafka import KafkaAdminClient

    from pipeline.core.config import Config
    from pipeline.kafka.io import ensure_topics, publish_stream
    from pipeline.sources.simulator import Simulator

    bootstrap = os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("CTR_DAEMON_REDIS_URL", "redis://127.0.0.1:16379/0")
    tag = uuid.uuid4().hex[:10]
    cfg = bench_config(bootstrap, redis_url, scratch / "state", tag)
    events = list(Simulator(Config().simulator, 21).stream(args.impressions))
    out: dict[str, Any] = {"events": len(events)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    topics: list[str] = []
    try:
        for n in (int(x) for x in args.processes.split(",")):
            print(f"joiner: {n} process(es) ...", file=sys.stderr, flush=True)
            k = dataclasses.replace(
                cfg.kafka,
                **{
                    f: f"{getattr(cfg.kafka, f)}-{n}"
                    for f in ("impressions_topic", "clicks_topic", "examples_topic")
                },
                dead_letter_topic=f"{cfg.kafka.dead_letter_topic}-{n}",
                group_id_prefix=f"{cfg.kafka.group_id_prefix}-{n}",
                partitions=JOINER_PARTITIONS,
            )
            topics += [k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic]
            ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.examples_topic], JOINER_PARTITIONS)
            env = os.environ | {
                "CTR_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "CTR_KAFKA_IMPRESSIONS_TOPIC": k.impressions_topic,
                "CTR_KAFKA_CLICKS_TOPIC": k.clicks_topic,
                "CTR_KAFKA_EXAMPLES_TOPIC": k.examples_topic,
                "CTR_KAFKA_DEAD_LETTER_TOPIC": k.dead_letter_topic,
                "CTR_KAFKA_PARTITIONS": str(JOINER_PARTITIONS),
                "CTR_KAFKA_GROUP_ID_PREFIX": k.group_id_prefix,
                "CTR_DAEMON_REDIS_URL": cfg.daemon.redis_url,
                "CTR_FEATURES_PROJECT": f"{cfg.features.project}_{n}",
            }
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "pipeline.ops.cli", "joiner", "--exit-when-idle", "20"],
                    env=env | {"CTR_DAEMON_STATE_DIR": str(scratch / f"j{n}-{i}")},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                for i in range(n)
            ]
            # the stream comes once every process holds its partitions: no rebalance while it runs
            _wait_members(admin, f"{k.group_id_prefix}-joiner", n)
            t0 = time.monotonic()
            publish_stream(k, events)
            published = len(events) / (time.monotonic() - t0)
            counts = [json.loads(p.communicate(timeout=900)[0].splitlines()[-1]) for p in procs]
            first, last, partitions, written = _examples_span(bootstrap, k.examples_topic)
            r = out[str(n)] = {
                "events_per_s": round(len(events) / ((last - first) / 1000), 1),
                "examples": written,
                "per_process": [{"events": c["events"], "examples": c["examples"]} for c in counts],
                "examples_per_partition": partitions,
                "publish_events_per_s": round(published, 1),  # the joiners cannot outrun the publisher
            }
            if "raw_consumer_events_per_s" not in out:
                # the reference of ingest.py: a plain consumer, its fetches waiting 20 ms, not 500
                raw = raw_consumer(k, len(events), tag, fetch_max_wait_ms=STEADY_FETCH_WAIT_MS)
                out["raw_consumer_events_per_s"] = raw["events_per_s"]
            r["ratio_to_raw_consumer"] = round(r["events_per_s"] / out["raw_consumer_events_per_s"], 3)
            print(f"  {r['events_per_s']:>10,.0f} events/s  per process {r['per_process']}", flush=True)
        for n in args.processes.split(","):
            if "1" in out:
                out[n]["ratio_to_one_process"] = round(out[n]["events_per_s"] / out["1"]["events_per_s"], 3)
    finally:
        admin.delete_topics([t for t in topics if t in set(admin.list_topics())])
        admin.close()
    return out


def _wait_members(admin: Any, group: str, n: int, timeout_s: float = 180.0) -> None:
    """Until ``group`` is stable with ``n`` members that each hold partitions."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            desc = admin.describe_groups([group]).get(group, {})
        except Exception:  # the coordinator not known yet: ask again
            desc = {}
        if desc.get("group_state") == "Stable" and len(desc.get("members") or ()) == n:
            return
        time.sleep(0.5)
    raise RuntimeError(f"consumer group {group} never had {n} stable members")


def _examples_span(bootstrap: str, topic: str) -> tuple[int, int, dict[str, int], int]:
    """First and last record timestamps (ms) of examples topic ``topic``, its examples per partition
    (lines of its records), their count."""
    from pipeline.kafka.example_records import lines
    from pipeline.kafka.read import read_to_end

    records = read_to_end(bootstrap, topic)
    per: dict[str, int] = {}
    for r in records:
        per[str(r.partition)] = per.get(str(r.partition), 0) + len(lines(r.value or b""))
    stamps = [r.timestamp for r in records]
    return min(stamps), max(stamps), dict(sorted(per.items())), sum(per.values())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_out is not None:
        rank_main(args)
        return 0
    import tempfile

    parts = set(args.parts.split(","))
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ctr-scaleout-") as tmp:
        for rows in (int(r) for r in args.rows.split(",")) if "trainer" in parts else ():
            results[str(rows)] = {}
            for ranks in (int(r) for r in args.ranks.split(",")):
                print(f"trainer: {rows:,} rows, {ranks} rank(s) ...", file=sys.stderr, flush=True)
                r = results[str(rows)][str(ranks)] = measure(ranks, rows, args, Path(tmp))
                print(
                    f"  {r['examples_per_s']:>10,.0f} examples/s  rows per rank {r['rows_per_rank']}  "
                    f"peak RSS MB {r['peak_rss_mb_per_rank']}",
                    flush=True,
                )
            one = results[str(rows)].get("1")
            for r in results[str(rows)].values():
                if one is not None:
                    r["ratio_to_one_process"] = round(r["examples_per_s"] / one["examples_per_s"], 3)
        joiner = joiner_scaleout(args, Path(tmp)) if "joiner" in parts else None
    state = None
    if "state" in parts:
        from joiner_state import measure_state  # a script beside this one

        bootstrap = os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
        state = measure_state(bootstrap, [int(u) for u in args.state_users.split(",")])
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/scaleout.py", *(argv if argv is not None else sys.argv[1:])]),
        "examples_per_block": args.examples,
        "timed_blocks": args.blocks,
        "batch_all_ranks": args.batch,
        "model": "deepfm",
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cpu": platform.machine(),
        "load_avg_1m": os.getloadavg()[0],
        "reference": "one process, all cores (what runs without torchrun)",
    }
    out = args.out or RESULTS / ("scaleout-quick.json" if args.quick else "scaleout.json")
    # parts not measured this time keep their last figures (their own meta says when)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    doc["meta"] = {**doc.get("meta", {}), **meta}
    if state is not None:
        doc["state"] = {**state, "date": meta["date"], "load_avg_1m": os.getloadavg()[0]}
    if results:
        doc["trainer"] = results
    if joiner is not None:
        doc["joiner"] = joiner
        doc["meta"]["joiner_impressions"] = args.impressions
        doc["meta"]["joiner_partitions"] = JOINER_PARTITIONS
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
