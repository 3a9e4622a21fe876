"""Freshness of the real daemons over Kafka: a block's last event -> every replica serving its version.

Starts ``ctr joiner``, ``ctr trainer`` (default DeepFM, N = ``--train-every``, 100,000 by default)
and ``--replicas`` ``ctr serve`` processes on fresh uuid-named topics, groups, state, Feast project
and MLflow model, publishes a simulated stream at a fixed ``--rate`` from this process (recording
when each event was sent) and polls every replica's ``GET /version`` every 50 ms.

**What "the last event of a block" is.** An example is final only when the joiner's watermark
(newest event time - ``watermark_lag_s``) passes its impression's attribution window (15 min of
event time): before that no system can know its label. So the block's last event is the event
whose arrival closes the window of the block's last example: in that example's input partition,
the first event produced with ``ts > impression ts + window + lag``. Freshness is measured from
its production. For reference, each block also gets ``from_last_impression_s`` (from producing the
last example's impression), which includes the window itself: in real time 15 minutes; here
``window / (event seconds per wall second)``, as the simulated stream runs event time faster than
the wall clock (50 impressions per event second, ``--rate`` events per wall second).

Where the seconds go, per block (wall clock of this machine, all processes on it):
``emit_s`` closing event produced -> the block's last example written by the joiner (Kafka record
timestamp); ``train_s`` -> the trainer starts registering (MLflow run start: consumed, scored,
trained, gated); ``register_s`` -> the version exists; ``swap_s`` -> every replica serves it.

    python benchmarks/freshness.py [--rate 4000] [--impressions 560000] [--replicas 2]

Prints a table and writes ``benchmarks/results/freshness.json``. Needs the services.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from pipeline.core.checkpoints import file_lock
from pipeline.core.config import Config, KafkaConfig
from pipeline.kafka.example_records import lines
from pipeline.kafka.io import KafkaSink, RateLimiter, ensure_topics
from pipeline.sources.simulator import Simulator
from serving_bridge.server import kafka_partition

RESULTS = Path(__file__).parent / "results"
PARTITIONS = 3
WINDOW_S, LAG_S = 900.0, 60.0  # the joiner's defaults (the daemons run with them)


class VersionPoller(threading.Thread):
    """Polls each replica's /version; keeps the wall time each version was first seen per replica."""

    def __init__(self, ports: list[int], period_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.ports, self.period_s = ports, period_s
        self.first_seen: dict[int, dict[int, float]] = {p: {} for p in ports}
        self.load: list[float] = []  # 1-minute load average, sampled every ~5 s (a shared machine)
        self.stop = threading.Event()
        self._load_at = 0.0

    def version(self, port: int) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=2) as resp:
                v = json.loads(resp.read())["version"]
            return int(v) if v is not None else None
        except (OSError, ValueError, KeyError):
            return None

    def run(self) -> None:
        while not self.stop.is_set():
            for port in self.ports:
                v = self.version(port)
                if v is not None:
                    self.first_seen[port].setdefault(v, time.time())
            if not self.load or time.time() - self._load_at > 5:
                self.load.append(os.getloadavg()[0])
                self._load_at = time.time()
            time.sleep(self.period_s)

    def all_serving(self, version: int) -> float | None:
        """When the last replica first served ``version`` or a newer one (None: not all yet)."""
        times = []
        for seen in self.first_seen.values():
            ts = [t for v, t in seen.items() if v >= version]
            if not ts:
                return None
            times.append(min(ts))
        return max(times)


class Producer:
    """Publishes the stream at ``rate`` and remembers, per input partition, event times and send times."""

    def __init__(self, cfg: KafkaConfig, rate: float) -> None:
        self.cfg, self.rate = cfg, rate
        self.ts: list[list[int]] = [[] for _ in range(PARTITIONS)]  # event time, in send order
        self.sent: list[list[float]] = [[] for _ in range(PARTITIONS)]  # wall time of the send
        self.impressions: dict[str, tuple[int, int, float]] = {}  # id -> (partition, ts, sent)

    def publish(self, events: Any) -> None:
        topics = {"impression": self.cfg.impressions_topic, "click": self.cfg.clicks_topic}
        limiter = RateLimiter(self.rate)
        with KafkaSink(self.cfg, self.cfg.impressions_topic) as sink:
            for kind, ev in events:
                limiter.acquire()
                sink.send(  # stamped with the event time, as `ctr produce` stamps a replay
                    ev["user_id"].encode(),
                    json.dumps(ev, separators=(",", ":")).encode(),
                    topics[kind],
                    timestamp_ms=ev["ts"],
                )
                now, p = time.time(), kafka_partition(ev["user_id"], PARTITIONS)
                self.ts[p].append(ev["ts"])
                self.sent[p].append(now)
                if kind == "impression":
                    self.impressions.setdefault(ev["impression_id"], (p, ev["ts"], now))
                if sink.sent >= 20_000:
                    sink.flush()
            sink.flush()

    def closing_event_sent(self, partition: int, threshold_ts: int) -> float | None:
        """When the first event of ``partition`` with ts > ``threshold_ts`` was sent (None: never)."""
        running_max = list(accumulate(self.ts[partition], max))
        i = bisect_right(running_max, threshold_ts)
        return self.sent[partition][i] if i < len(running_max) else None


def service_urls() -> dict[str, str]:
    """Kafka, Redis and MLflow as ``deploy/services.sh env`` exports them (its defaults otherwise)."""
    return {
        "kafka": os.environ.get("CTR_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        "redis": os.environ.get("CTR_DAEMON_REDIS_URL", "redis://127.0.0.1:16379/0"),
        "mlflow": os.environ.get("CTR_REGISTRY_TRACKING_URI", "http://127.0.0.1:15000"),
    }


def fresh_topics(bootstrap: str, tag: str) -> KafkaConfig:
    """A KafkaConfig on ``tag``'s own topics, the input and examples topics created."""
    k = KafkaConfig(
        bootstrap_servers=bootstrap,
        impressions_topic=f"fresh-imps-{tag}",
        clicks_topic=f"fresh-clicks-{tag}",
        examples_topic=f"fresh-examples-{tag}",
        dead_letter_topic=f"fresh-dead-{tag}",
    )
    ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.examples_topic], PARTITIONS)
    return k


def env_for(
    tag: str, tmp: Path, kafka: KafkaConfig, urls: dict[str, str], train_every: int
) -> dict[str, str]:
    return {
        **os.environ,
        "CTR_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "CTR_KAFKA_IMPRESSIONS_TOPIC": kafka.impressions_topic,
        "CTR_KAFKA_CLICKS_TOPIC": kafka.clicks_topic,
        "CTR_KAFKA_EXAMPLES_TOPIC": kafka.examples_topic,
        "CTR_KAFKA_DEAD_LETTER_TOPIC": kafka.dead_letter_topic,
        "CTR_KAFKA_PARTITIONS": str(PARTITIONS),
        "CTR_KAFKA_GROUP_ID_PREFIX": f"fresh-{tag}",
        "CTR_DAEMON_STATE_DIR": str(tmp / "state"),
        "CTR_DAEMON_REDIS_URL": urls["redis"].rsplit("/", 1)[0] + "/15",  # the test database
        "CTR_FEATURES_PROJECT": f"fresh_{tag}",
        "CTR_REGISTRY_TRACKING_URI": urls["mlflow"],
        "CTR_REGISTRY_MODEL_NAME": f"fresh-model-{tag}",
        "CTR_REGISTRY_EXPERIMENT": f"fresh-exp-{tag}",
        "CTR_TRAINER_TRAIN_EVERY": str(train_every),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }


def last_examples(bootstrap: str, topic: str, position: dict[str, Any]) -> list[tuple[bytes, int]]:
    """The block's last example of each examples partition, with its record's timestamp (ms).

    ``position``: the block's lineage position (:func:`pipeline.kafka.example_records.lineage`):
    the last example is line ``lines_to - 1`` of record ``offsets_to``, or the last line of the
    record before it when that record was read whole."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    start, end = position["kafka_offsets_from"], position["kafka_offsets_to"]
    lines_from, lines_to = position.get("kafka_lines_from", {}), position.get("kafka_lines_to", {})
    out = []
    try:
        for key, to in end.items():
            line = lines_to.get(key, 0)
            if (to, line) <= (start.get(key, 0), lines_from.get(key, 0)):
                continue
            tp = TopicPartition(topic, int(key.rsplit(":", 1)[1]))
            consumer.assign([tp])
            consumer.seek(tp, to if line else to - 1)
            for _ in range(20):
                recs = consumer.poll(timeout_ms=500).get(tp, [])
                if recs:
                    values = lines(recs[0].value)
                    out.append((values[line - 1] if line else values[-1], recs[0].timestamp))
                    break
    finally:
        consumer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2_500, help="events per second produced")
    ap.add_argument("--impressions", type=int, default=560_000, help="5 blocks of 100k + the window's tail")
    ap.add_argument("--train-every", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="versions to wait for (0 = the full blocks whose windows the stream closes, by estimate)",
    )
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, default=RESULTS / "freshness.json")
    ap.add_argument("--logs", type=Path, help="keep the daemons' logs in this folder")
    args = ap.parse_args(argv)
    urls = service_urls()
    tag = uuid.uuid4().hex[:10]
    k = fresh_topics(urls["kafka"], tag)
    ports = [21_000 + (os.getpid() * 7 + i) % 4_000 for i in range(args.replicas)]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp_s:
        tmp = Path(tmp_s)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
        env = env_for(tag, tmp, k, urls, args.train_every)

        def start(*cli: str) -> None:
            log = ((args.logs or tmp) / f"{cli[0]}-{len(procs)}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "pipeline.ops.cli", *cli], env=env, stdout=log, stderr=log
                )
            )

        poller = VersionPoller(ports)
        producer = Producer(k, args.rate)
        try:
            start("joiner")  # first: the replicas read the Feast store it sets up
            _wait_for_feature_store(tmp / "state" / "joiner" / "feast")
            for port in ports:
                start("serve", "--port", str(port))
            start("trainer")
            deadline = time.monotonic() + 600  # imports of torch, MLflow and Feast on a busy machine
            while not all(poller.version(p) is not None or _up(p) for p in ports):
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not start")
                time.sleep(0.5)
            poller.start()
            started = time.time()
            producer.publish(Simulator(Config().simulator, args.seed).stream(args.impressions))
            produced_s = time.time() - started
            expected_blocks = args.blocks or (
                (len(producer.impressions) - 50 * int(WINDOW_S + LAG_S)) // args.train_every
            )
            from trainers.registry import MlflowModelStore

            cfg = Config()
            cfg.registry.model_name = f"fresh-model-{tag}"
            store = MlflowModelStore(cfg.registry, urls["mlflow"])
            deadline, changed, seen = time.monotonic() + 2_400, time.monotonic(), 0
            while time.monotonic() < deadline:  # every full block registered and served ...
                versions = store.versions()
                if len(versions) != seen:
                    changed, seen = time.monotonic(), len(versions)
                served = bool(versions) and poller.all_serving(int(versions[-1])) is not None
                if served and len(versions) >= expected_blocks:
                    break
                if served and time.monotonic() - changed > 600:  # ... or the gate refused some blocks
                    break
                time.sleep(1)
            time.sleep(1)
            cpu_s = {" ".join(str(a) for a in pr.args[3:]): _cpu_seconds(pr.pid) for pr in procs}  # type: ignore[index]
            blocks = []
            previous_created = 0.0
            for v in store.versions():
                lineage = store.lineage(v)
                pos = json.loads(lineage["position"])
                closing, last_imp, emitted = [], [], []
                for value, stamp in last_examples(urls["kafka"], k.examples_topic, pos):
                    iid = json.loads(value)["impression"]["impression_id"]
                    p, ts, sent = producer.impressions[iid]
                    closing.append(producer.closing_event_sent(p, ts + int((WINDOW_S + LAG_S) * 1000)))
                    last_imp.append(sent)
                    emitted.append(stamp / 1000)
                mv = store.client.get_model_version(store.name, v)
                run_start = store.client.get_run(mv.run_id).info.start_time / 1000
                served = poller.all_serving(int(v))
                if served is None or not closing or None in closing:
                    continue
                t0 = max(c for c in closing if c is not None)
                created = mv.creation_timestamp / 1000
                free_at = max(max(emitted), previous_created)  # the trainer finished the block before
                blocks.append(
                    {
                        "version": int(v),
                        "block": int(lineage.get("block", 0)),
                        "freshness_s": served - t0,
                        "from_last_impression_s": served - max(last_imp),
                        "emit_s": max(emitted) - t0,
                        "queue_s": free_at - max(emitted),
                        "train_s": run_start - free_at,
                        "register_s": created - run_start,
                        "swap_s": served - created,
                    }
                )
                previous_created = created
        finally:
            poller.stop.set()
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            _cleanup(urls, k, tag)
    values = [b["freshness_s"] for b in blocks]
    result = {
        "p50_s": statistics.median(values) if values else None,
        "max_s": max(values) if values else None,
        "blocks": len(blocks),
        "per_block": blocks,
        "rate_events_per_s": args.rate,
        "produced_events_per_s": sum(map(len, producer.ts)) / produced_s,
        "train_every": args.train_every,
        "replicas": args.replicas,
        "event_seconds_per_wall_second": args.rate / 53.0,  # 50 impressions + ~3 clicks per event second
        "definition": "closing event of the block's last example sent -> every replica serves the version",
        "daemon_cpu_seconds": cpu_s,
        "machine": {"cpus": os.cpu_count(), "mean_load_avg_1m": statistics.fmean(poller.load or [0.0])},
    }
    head = ("block", "version", "fresh s", "emit", "queue", "train", "register", "swap", "from imp")
    print("".join(f"{h:>9}" for h in head))
    for b in blocks:
        cols = (
            "freshness_s",
            "emit_s",
            "queue_s",
            "train_s",
            "register_s",
            "swap_s",
            "from_last_impression_s",
        )
        print(f"{b['block']:>9}{b['version']:>9}" + "".join(f"{b[c]:>9.1f}" for c in cols))
    print(f"daemon CPU seconds: {cpu_s}; mean load average {result['machine']['mean_load_avg_1m']:.1f}")
    print(f"p50 {result['p50_s']} s, max {result['max_s']} s over {len(blocks)} blocks")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if len(blocks) >= 5 else 1


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _wait_for_feature_store(folder: Path, timeout_s: float = 600) -> None:
    """Until the joiner has set up its Feast store (registry written, set-up lock released)."""
    deadline = time.monotonic() + timeout_s
    while not (folder / "data" / "registry.db").is_file():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the joiner did not set up {folder}")
        time.sleep(0.5)
    with file_lock(folder / ".setup.lock"):  # held by open_store until the definitions are applied
        pass


def _up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except OSError:
        return False


def _cleanup(urls: dict[str, str], k: KafkaConfig, tag: str) -> None:
    """Delete the run's topics, groups and MLflow model/experiment (failures only warn)."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=urls["kafka"])
        topics = [k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic]
        admin.delete_topics([t for t in topics if t in set(admin.list_topics())])
        admin.delete_groups([f"fresh-{tag}-joiner", f"fresh-{tag}-trainer"])
        admin.close()
    except Exception as exc:
        print(f"warning: Kafka cleanup: {exc!r}", file=sys.stderr)
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=urls["mlflow"], registry_uri=urls["mlflow"])
        client.delete_registered_model(f"fresh-model-{tag}")
        exp = client.get_experiment_by_name(f"fresh-exp-{tag}")
        if exp is not None:
            client.delete_experiment(exp.experiment_id)
    except Exception as exc:
        print(f"warning: MLflow cleanup: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
