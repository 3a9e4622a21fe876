"""Crash recovery of the joiner: SIGKILL mid-stream -> the restarted process writes examples again.

Two modes in the same run, each on its own fresh topics, group and state: a **static** group member
(``kafka.group_instance_id`` set, as the systemd units run the daemons) and a **dynamic** one (no
id). For each, a ``ctr joiner`` works through a simulated stream published at ``--rate`` events per
second from this process; ``--trials`` times it is SIGKILLed, once it has written examples for a
while, and started again at once (systemd's ``Restart=`` without the ``RestartSec`` pause).

Measured per kill: ``resume_s``, from the SIGKILL to the examples topic growing again (the restart
replays from its last checkpoint, so it writes as soon as it owns its partitions again and has
re-read the few seconds since that checkpoint). Each mode is the other's reference: same machine,
same run, same stream; the static restart is process start-up (imports, Feast store, consumer)
plus that replay, the dynamic one adds the wait for the broker to expire the killed member.

    python benchmarks/restart.py [--rate 2000] [--trials 3]

Prints a table and writes ``benchmarks/results/restart.json``. Needs the services.
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
import uuid
from pathlib import Path
from typing import Any

from freshness import PARTITIONS, RESULTS, Producer, env_for, fresh_topics, service_urls
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from pipeline.core.config import Config
from pipeline.sources.simulator import Simulator


class ExampleCount:
    """The examples topic's total end offset: its records, each of one or more examples (one
    consumer, polled by the caller: only whether it grows matters)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def __call__(self) -> int:
        return sum(self.consumer.end_offsets(self.tps).values())

    def grows_from(self, base: int, timeout_s: float, period_s: float = 0.05) -> float | None:
        """Seconds until the count exceeds ``base`` (None: not within ``timeout_s``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self() > base:
                return time.monotonic() - t0
            time.sleep(period_s)
        return None


def run_mode(mode: str, args: argparse.Namespace, urls: dict[str, str]) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:10]
    k = fresh_topics(urls["kafka"], tag)
    count = ExampleCount(urls["kafka"], k.examples_topic)
    stop = threading.Event()

    def stream() -> Any:
        for event in Simulator(Config().simulator, args.seed).stream(10_000_000):
            if stop.is_set():
                return
            yield event

    producer = threading.Thread(target=Producer(k, args.rate).publish, args=(stream(),), daemon=True)
    resumes: list[float | None] = []
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp_s:
        tmp = Path(tmp_s)
        env = env_for(tag, tmp, k, urls, 100_000)
        env["CTR_DAEMON_CHECKPOINT_EVERY_S"] = "2"
        if mode == "static":
            env["CTR_KAFKA_GROUP_INSTANCE_ID"] = f"bench-{tag}"
        logs: list[Any] = []

        def start() -> subprocess.Popen[bytes]:
            logs.append((tmp / f"joiner-{len(logs)}.log").open("wb"))
            cmd = [sys.executable, "-m", "pipeline.ops.cli", "joiner"]
            return subprocess.Popen(cmd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT)

        proc = start()
        try:
            producer.start()
            # the first examples come once the stream closes the first attribution windows
            first = count.grows_from(0, timeout_s=600)
            if first is None:
                raise RuntimeError(f"{mode}: no example in 600 s; joiner log: {logs[0].name}")
            for trial in range(args.trials):
                time.sleep(args.work_s)  # working, with a few checkpoints behind it
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed_at, base = time.monotonic(), count()
                proc = start()
                grew = count.grows_from(base, timeout_s=300)
                resumes.append(None if grew is None else time.monotonic() - killed_at)
                print(f"  {mode} trial {trial + 1}: resumed after {resumes[-1]} s", flush=True)
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            producer.join(timeout=60)
            count.consumer.close()
            admin = KafkaAdminClient(bootstrap_servers=urls["kafka"])
            admin.delete_topics([k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic])
            admin.delete_groups([f"fresh-{tag}-joiner"])
            admin.close()
    done = [r for r in resumes if r is not None]
    return {
        "resume_s": resumes,
        "resume_p50_s": statistics.median(done) if done else None,
        "resume_max_s": max(done) if done else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2_000, help="events per second produced")
    ap.add_argument("--trials", type=int, default=3, help="SIGKILLs per mode")
    ap.add_argument("--work-s", type=float, default=8.0, help="seconds of work before each kill")
    ap.add_argument("--modes", default="static,dynamic")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--out", type=Path, default=RESULTS / "restart.json")
    args = ap.parse_args(argv)
    urls = service_urls()
    modes = {m: run_mode(m, args, urls) for m in args.modes.split(",")}
    result = {
        "modes": modes,
        "rate_events_per_s": args.rate,
        "definition": "SIGKILL of the joiner -> the restarted joiner's first example on the topic",
        "reference": "the other mode, same run and stream",
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
    }
    print(f"{'mode':>8}{'resume p50 s':>14}{'resume max s':>14}")
    for m, r in modes.items():
        cells = [r["resume_p50_s"], r["resume_max_s"]]
        print(f"{m:>8}" + "".join(f"{c:>14.1f}" if c is not None else f"{'-':>14}" for c in cells))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["resume_p50_s"] is not None for r in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
