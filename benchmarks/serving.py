"""Serving latency: 1 user x 100 candidates, features from Redis, at a fixed offered load (open loop).

Besides the phases below: the **floor** (one request's work in this process, one thread: JSON in,
the direct Redis read, the forward, JSON out; ``floor_ms`` is its p50) and a **grid** of offered
loads (``--grid-rates``, 100/300/1000/1500/2000 req/s: beyond what 2 cores serve, so that
``max_qps`` is the replica's and not the offered load's) x client connections
(``--grid-connections``, 1/8/32), steady and while the alias flips, ``--grid-seconds`` each:
``max_qps`` (the most achieved with no error), ``p99_ms_by_connections`` (connections -> offered
load -> p99, steady), against the target
``max_qps_target`` = 0.6 x cores / floor.

One run measures, against the real services (Redis, the MLflow server):

- ``features``: the feature read alone, in process, 1 user + 100 items: the direct Redis reader
  (:mod:`features.redis_reader`) vs Feast's SDK (:class:`features.store.OnlineFeatureReader`);
- ``redis``: a ``ctr serve`` process with ``serving.feature_path = redis``, steady state;
- ``redis+swaps``: the same process while the ``champion`` alias flips between two versions every
  ``--swap-every`` seconds (each flip: the replica's helper downloads and traces the version, cold:
  it is first removed from the host's prepared folder; its workers load and warm it);
- ``feast``: a ``ctr serve`` process with ``serving.feature_path = feast`` (the reference), steady.

Open loop: request *k* is due at ``t0 + k / rate`` whatever happened before; its latency is counted
from that due time to the last byte of the answer, so a stall shows up in the tail instead of
slowing the load down (no coordinated omission). ``--threads`` client threads with keep-alive
connections send the requests. The model is DeepFM (``--model`` for another; with ``din`` the users
have behaviour sequences, which the replica reads too; ``esmm`` is trained on impressions with
conversions and answers pCVR beside pCTR, ``conversion_probabilities``), ``--buckets`` hashed rows.

Prints a table and writes ``benchmarks/results/serving.json`` (``p50_ms``, ``p99_ms``,
``p999_ms``, ``qps``, ``errors``, ``p99_during_swap_ms``, ``feast_sdk_p99_ms`` and per-phase detail).
Run: ``python benchmarks/serving.py [--rate 100] [--seconds 30]`` with the services up
(``make services-up``); it uses Redis db 15 and uuid names, and removes what it wrote.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from load_tools import load_client, open_loop, percentiles, start_py_spy, top_costs

RESULTS = Path(__file__).resolve().parent / "results"
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
warnings.filterwarnings("ignore", category=DeprecationWarning)  # kafka-python's import-time noise
START_MS = 1_767_225_600_000
SEQUENCE_LENGTH = 50  # --model din: the users' behaviour sequences (features.sequence_length)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=100.0, help="offered requests per second (open loop)")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each phase")
    p.add_argument("--candidates", type=int, default=100, help="items per request")
    p.add_argument("--users", type=int, default=2_000, help="users with features in the store")
    p.add_argument("--items", type=int, default=5_000, help="items with features in the store")
    p.add_argument("--threads", type=int, default=8, help="client threads (keep-alive connections)")
    p.add_argument("--buckets", type=int, default=1 << 16, help="hashed embedding rows of the model")
    p.add_argument(
        "--model",
        default="deepfm",
        help="trainers.models.MODELS name; din: users get behaviour sequences too; "
        "esmm: trained with conversions, answers pCVR too",
    )
    p.add_argument("--swap-every", type=float, default=2.0, help="seconds between alias flips (swap phase)")
    p.add_argument("--feature-reads", type=int, default=1_000, help="in-process feature reads per path")
    p.add_argument("--redis-url", default=os.environ.get("CTR_DAEMON_REDIS_URL", "redis://127.0.0.1:16379/0"))
    p.add_argument(
        "--mlflow-uri", default=os.environ.get("CTR_REGISTRY_TRACKING_URI", "http://127.0.0.1:15000")
    )
    p.add_argument("--grid-seconds", type=float, default=4.0, help="seconds per phase of the load grid")
    p.add_argument("--grid-rates", default="100,300,1000,1500,2000", help="offered loads of the grid (req/s)")
    p.add_argument("--grid-connections", default="1,8,32", help="client connections of the grid")
    p.add_argument("--workers", type=int, default=0, help="serving.workers of the replica (0: its default)")
    p.add_argument("--floor-requests", type=int, default=500, help="in-process requests timed for the floor")
    p.add_argument(
        "--py-spy",
        default="",
        help="path of a py-spy binary: one more redis phase, profiled (stacks kept in <out>.profile.txt)",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "serving.json")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------- set-up
def feature_config(args: argparse.Namespace) -> Any:
    """The features of the run: with behaviour sequences (50 clicks) for ``--model din``."""
    from pipeline.core.config import FeatureConfig

    return FeatureConfig(sequence_length=SEQUENCE_LENGTH if args.model == "din" else 0)


def build_store(args: argparse.Namespace, state: Path, project: str) -> tuple[Any, list[str], list[str]]:
    """A production Feast store on db 15 holding features of ``--users`` users and ``--items`` items
    (din: the last hour's traffic, so that the clicks are inside the sequences' ttl at request time)."""
    from features.aggregations import StreamingFeatures
    from features.store import FeatureWriter, open_store
    from pipeline.core.config import Config
    from pipeline.core.pseudonyms import Pseudonymizer

    cfg = Config()
    fcfg = feature_config(args)
    store = open_store(state / "joiner" / "feast", "production", args.redis_url, project, cfg=fcfg)
    pseudo = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
    users = [f"user-{i}" for i in range(args.users)]
    items = [f"item-{i}" for i in range(args.items)]
    sf = StreamingFeatures(fcfg)
    rng = random.Random(3)
    ts = START_MS if args.model != "din" else int(time.time() * 1000) - 3_600_000
    for _ in range(50_000):  # Zipf-ish traffic: features for every user and most items
        ts += 10
        user = (
            users[min(int(rng.paretovariate(1.0)) - 1, len(users) - 1)]
            if rng.random() < 0.3
            else rng.choice(users)
        )
        item = rng.choice(items)
        sf.record_impression(pseudo(user), item, ts)
        if rng.random() < 0.05:
            sf.record_click(pseudo(user), item, ts + 1)
    FeatureWriter(store, fcfg, offline=False).push(*sf.drain_dirty())
    return store, users, items


def publish_versions(args: argparse.Namespace, model_name: str, experiment: str) -> list[str]:
    """Two versions of ``--model`` (``--buckets`` rows) in the MLflow server."""
    from pipeline.core.config import RegistryConfig, TrainerConfig
    from trainers.encoding import Encoder
    from trainers.learner import TorchLearner
    from trainers.registry import MlflowModelStore
    from trainers.testing import synthetic_examples

    store = MlflowModelStore(RegistryConfig(model_name=model_name, experiment=experiment), args.mlflow_uri)
    versions = []
    for seed in (1, 2):
        cfg = TrainerConfig(model=args.model, hash_buckets=args.buckets, device="cpu", seed=seed)
        examples = synthetic_examples(2_000, seed=seed)
        if args.model == "esmm":
            examples = with_conversions(examples, seed)
        learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(examples))
        learner.learn(examples)
        versions.append(store.publish(learner, {"block": seed}, {"logloss": 0.5}))
    store.set_alias("champion", versions[0])
    return versions


def with_conversions(examples: list[Any], seed: int) -> list[Any]:
    """``examples`` as the joiner emits them with conversions joined (``--model esmm``): a
    never-clicked impression once (conversion 0), a clicked one twice (conversion unknown, then its
    correction with the final conversion, ~10% of clicks converting)."""
    from pipeline.core.events import LabelledExample

    rng = random.Random(seed)
    out: list[Any] = []
    for ex in examples:
        if not ex.label:
            out.append(LabelledExample(ex.impression, 0, ex.label_ts, ex.stream_features, 0))
            continue
        converted = int(rng.random() < 0.1)
        correction = LabelledExample(
            ex.impression, 1, ex.label_ts + 60_000, ex.stream_features, converted, True
        )
        out += [ex, correction]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_replica(env: dict[str, str], feature_path: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ops.cli", "serve", "--port", str(port)],
        env={**env, "CTR_SERVING_FEATURE_PATH": feature_path},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ctr serve exited with {proc.returncode}; see {log}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                settle(proc.pid)
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"ctr serve on {port} not ready after 300 s; see {log}")


# ------------------------------------------------------------------------------------- load
def flip_alias(
    args: argparse.Namespace, model_name: str, versions: list[str], stop: threading.Event, flips: list[float]
) -> None:
    """Move ``champion`` between the two versions every ``--swap-every`` s and announce it.

    Each time, the version moved to is first removed from the replica host's folder of prepared
    versions (serving_bridge.model_cache), so every swap downloads and traces it again, as a new
    version would be: flipping between two versions must not measure a warm cache.
    """
    import redis
    from mlflow import MlflowClient

    from pipeline.core.checkpoints import file_lock
    from serving_bridge.server import NOTIFY_CHANNEL

    client = MlflowClient(tracking_uri=args.mlflow_uri, registry_uri=args.mlflow_uri)
    bus = redis.Redis.from_url(args.redis_url)
    k = 1
    while not stop.wait(args.swap_every):
        with file_lock(args.prepared / ".lock"):
            for folder in args.prepared.glob(f"{versions[k % 2]}-*"):
                shutil.rmtree(folder)
        client.set_registered_model_alias(model_name, "champion", versions[k % 2])
        bus.publish(NOTIFY_CHANNEL, b"1")
        flips.append(time.time())
        k += 1
    client.set_registered_model_alias(model_name, "champion", versions[0])


def swaps_of(port: int) -> float:
    return counter_of(port, "ctr_serving_swaps_total", 'arm="champion"')


def fallbacks_of(port: int) -> float:
    """Requests the replica scored with default features (its store read failed or was late)."""
    return counter_of(port, "ctr_serving_feature_fallbacks_total")


def settle(pid: int, quiet_share: float = 0.05, timeout_s: float = 120.0) -> None:
    """Wait until ``pid`` and its children use under ``quiet_share`` of a core over a second: its
    other workers and the model helpers have started and warmed up, and no measured phase pays
    for it."""
    deadline = time.monotonic() + timeout_s
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_seconds(pid)
        if now - before < quiet_share:
            return
        before = now
    print(f"  (the replica was still busy after {timeout_s:.0f} s; measuring anyway)", flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (the serving workers), from
    /proc: time the machine's hypervisor stole is not in it, unlike wall-clock latency."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def shares(before: dict[int, float], after: dict[int, float]) -> list[float]:
    """Each worker's share of what the workers spent between two :func:`worker_cpu` readings."""
    spent = [after[w] - before.get(w, 0.0) for w in sorted(after)]
    total = sum(spent)
    return [round(x / total, 3) for x in spent] if total > 0 else []


def worker_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each serving worker of the replica ``pid`` (its spawned children, their
    helpers included): how evenly the kernel spread the client connections over the workers."""
    out: dict[int, float] = {}
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    out[int(child)] = cpu_seconds(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def counter_of(port: int, name: str, label: str = "") -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.split("{")[0].split(" ")[0] == name and label in line
    )


def floor(
    args: argparse.Namespace, store: Any, model_name: str, version: str, bodies: list[bytes]
) -> dict[str, float]:
    """The per-request floor in this process, one thread: JSON in, the direct Redis read, the
    forward on one torch thread, JSON out; no HTTP, no queueing (what the server adds is the rest).
    With behaviour sequences (din), also the sequence lengths the requests' users had: a forward
    attends over the behaviours a user has, not over ``features.sequence_length``."""
    import torch

    from features.redis_reader import RedisFeatureReader
    from pipeline.core.config import Config, RegistryConfig
    from pipeline.core.pseudonyms import Pseudonymizer
    from trainers.encoding import SEQUENCE_KEY
    from trainers.registry import MlflowModelStore

    torch.set_num_threads(1)
    cfg = Config()
    learner = MlflowModelStore(RegistryConfig(model_name=model_name), args.mlflow_uri).load(version)
    learner.use_inference(cfg.serving.inference)  # the forward the replica runs
    reader = RedisFeatureReader.for_store(store, feature_config(args))
    pseudo = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
    times, cpu, lengths = [], [], []
    for i in range(args.floor_requests):
        t, c = time.perf_counter(), time.thread_time()
        req = json.loads(bodies[i % len(bodies)])
        user = pseudo(req["user_id"])
        feats = reader.get(user, list(req["items"]))
        lengths.append(len(feats[0].get(SEQUENCE_KEY, ())))
        answer: dict[str, Any] = {"version": version, "arm": "champion", "replica": "r"}
        if learner.multi_task:  # as the replica scores it: one forward for both tasks
            both = learner.predict_request_tasks(user, req["items"], req["context"], feats)
            answer |= {"probabilities": both[:, 0].tolist(), "conversion_probabilities": both[:, 1].tolist()}
        else:
            probs = learner.predict_request(user, req["items"], req["context"], feats)
            answer["probabilities"] = [float(p) for p in probs]
        json.dumps(answer)
        times.append((time.perf_counter() - t) * 1000.0)
        cpu.append((time.thread_time() - c) * 1000.0)
    out = percentiles(times) | {"cpu_ms": round(float(np.median(cpu)), 3)}
    if feature_config(args).sequence_length:
        out["sequence_length"] = {q: int(np.percentile(lengths, p)) for q, p in (("p50", 50), ("p99", 99))}
        out["sequence_length"]["max"] = max(lengths)
    return out


def longest_sequences(
    args: argparse.Namespace, store: Any, users: list[str], bodies: list[bytes]
) -> list[bytes]:
    """``bodies`` with their users replaced by the users whose behaviour sequences are longest (full
    at ``features.sequence_length`` in this traffic): a sequence model's costliest requests."""
    from features.redis_reader import RedisFeatureReader
    from pipeline.core.config import Config
    from pipeline.core.pseudonyms import Pseudonymizer
    from trainers.encoding import SEQUENCE_KEY

    reader = RedisFeatureReader.for_store(store, feature_config(args))
    pseudo = Pseudonymizer(Config().validation.pseudonym_key.get_secret_value(), "u_")
    length = {u: len(reader.get(pseudo(u), ["item-0"])[0].get(SEQUENCE_KEY, ())) for u in users}
    longest = max(length.values())
    heavy = [u for u in users if length[u] == longest]
    return [
        json.dumps(json.loads(b) | {"user_id": heavy[i % len(heavy)]}).encode() for i, b in enumerate(bodies)
    ]


def feature_reads(
    store: Any, users: list[str], items: list[str], n: int, k: int, fcfg: Any
) -> dict[str, dict[str, float]]:
    """Feature reads in process, 1 user + ``k`` items each (keys as a replica reads them: the
    user's pseudonym, the items of its joiner shard), interleaved: the direct reader (sync and on
    an event loop), the same without hiredis (redis-py's pure-Python reply parser), Feast's SDK."""
    import asyncio

    import redis
    from redis._parsers import _RESP2Parser

    from features.redis_reader import RedisFeatureReader, parse_feast_connection_string
    from features.store import OnlineFeatureReader
    from pipeline.core.config import Config
    from pipeline.core.pseudonyms import Pseudonymizer

    cfg = Config()
    pseudo = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
    direct = RedisFeatureReader.for_store(store, fcfg)
    conn = parse_feast_connection_string(store.config.online_store.connection_string)
    pool = redis.ConnectionPool(**conn, parser_class=_RESP2Parser)
    pure = RedisFeatureReader(redis.Redis(connection_pool=pool), store.config.project, fcfg)
    readers = {
        "direct": direct.get,
        "direct_no_hiredis": pure.get,
        "feast_sdk": OnlineFeatureReader(store, fcfg).get,
    }
    loop = asyncio.new_event_loop()
    rng = random.Random(9)
    times: dict[str, list[float]] = {name: [] for name in [*readers, "direct_async"]}
    try:
        for _ in range(n):
            user, cands = pseudo(rng.choice(users)), rng.sample(items, k)
            for name, get in readers.items():
                t = time.perf_counter()
                get(user, cands)
                times[name].append((time.perf_counter() - t) * 1000.0)
            t = time.perf_counter()
            loop.run_until_complete(direct.aget(user, cands))
            times["direct_async"].append((time.perf_counter() - t) * 1000.0)
    finally:
        loop.close()
    return {name: percentiles(ms) for name, ms in times.items()}


def load_grid(
    args: argparse.Namespace, port: int, bodies: list[bytes], model_name: str, versions: list[str]
) -> dict[str, dict[str, Any]]:
    """Every offered load x connection count of the grid, steady and while the alias flips."""
    grid: dict[str, dict[str, Any]] = {}
    rates = [float(r) for r in args.grid_rates.split(",")]
    connections = [int(c) for c in args.grid_connections.split(",")]
    for swapping in (False, True):
        for rate in rates:
            for conns in connections:
                stop, flips = threading.Event(), list[float]()
                flipper = None
                if swapping:
                    flipper = threading.Thread(
                        target=flip_alias, args=(args, model_name, versions, stop, flips)
                    )
                    flipper.start()
                fallbacks_before = fallbacks_of(port)
                lat, errors, qps, _ = open_loop(port, bodies, rate, args.grid_seconds, conns)
                stop.set()
                if flipper is not None:
                    flipper.join()
                name = f"{rate:g}/s x{conns}" + (" swaps" if swapping else "")
                grid[name] = {
                    **percentiles(lat),
                    "offered_qps": rate,
                    "connections": conns,
                    "swapping": swapping,
                    "qps": round(qps, 1),
                    "errors": errors,
                    "feature_fallbacks": fallbacks_of(port) - fallbacks_before,
                }
                print(
                    f"  grid {name}: p99 {grid[name]['p99_ms']:.2f} ms, {qps:.0f} req/s, {errors} errors",
                    flush=True,
                )
    return grid


# ------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tag = uuid.uuid4().hex[:10]
    model_name, experiment, project = f"bench-serving-{tag}", f"bench-serving-{tag}", f"bench_{tag}"
    db15 = args.redis_url.rsplit("/", 1)[0] + "/15"
    args.redis_url = db15
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="ctr-bench-serving-") as tmp:
        state = Path(tmp) / "state"
        args.prepared = Path(tmp) / "models" / model_name  # the replica's prepared versions
        try:
            print(
                f"set-up: Feast store on {db15} (project {project}), two versions of {model_name} ...",
                flush=True,
            )
            store, users, items = build_store(args, state, project)
            versions = publish_versions(args, model_name, experiment)
            feats = feature_reads(
                store, users, items, args.feature_reads, args.candidates, feature_config(args)
            )
            env = {
                **os.environ,
                "CTR_REGISTRY_TRACKING_URI": args.mlflow_uri,
                "CTR_REGISTRY_MODEL_NAME": model_name,
                "CTR_REGISTRY_EXPERIMENT": experiment,
                "CTR_DAEMON_REDIS_URL": db15,
                "CTR_DAEMON_STATE_DIR": str(state),
                "CTR_SERVING_MODEL_DIR": str(Path(tmp) / "models"),
                "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
                "CTR_FEATURES_SEQUENCE_LENGTH": str(feature_config(args).sequence_length),
            }
            rng = random.Random(11)
            bodies = [
                json.dumps(
                    {
                        "user_id": rng.choice(users),
                        "context": {"site": "s1", "device": "d2"},
                        "items": rng.sample(items, args.candidates),
                    }
                ).encode()
                for _ in range(500)
            ]
            floor_ms = floor(args, store, model_name, versions[0], bodies)
            if feature_config(args).sequence_length:  # the same requests from the heaviest users
                heavy = longest_sequences(args, store, users, bodies)
                floor_ms["longest_sequences"] = floor(args, store, model_name, versions[0], heavy)
            if args.workers:
                env["CTR_SERVING_WORKERS"] = str(args.workers)
            grid: dict[str, dict[str, Any]] = {}
            phases: dict[str, dict[str, Any]] = {}
            profile: dict[str, list[tuple[str, float]]] = {}
            for path in ("redis", "feast"):
                proc, port = start_replica(env, path, Path(tmp) / f"serve-{path}.log")
                procs.append(proc)
                open_loop(port, bodies, args.rate, args.warmup, args.threads)  # warm-up, not counted
                runs = [("", False, False)]
                if path == "redis":  # the profiled phase is extra: py-spy itself costs CPU
                    runs += [("+swaps", True, False)] + ([("+py-spy", False, True)] if args.py_spy else [])
                for suffix, swapping, profiling in runs:
                    stop = threading.Event()
                    flips: list[float] = []
                    flipper = None
                    swaps_before, fallbacks_before = swaps_of(port), fallbacks_of(port)
                    cpu_before, workers_before = cpu_seconds(proc.pid), worker_cpu(proc.pid)
                    spy = None
                    if profiling:
                        spy = start_py_spy(args, proc.pid, Path(tmp) / "profile.txt")
                    if swapping:
                        flipper = threading.Thread(
                            target=flip_alias, args=(args, model_name, versions, stop, flips)
                        )
                        flipper.start()
                    lat, errors, qps, served = open_loop(port, bodies, args.rate, args.seconds, args.threads)
                    stop.set()
                    if spy is not None:
                        spy.wait(120)
                        profile = top_costs(Path(tmp) / "profile.txt")
                        if (Path(tmp) / "profile.txt").is_file():  # kept: py-spy's collapsed stacks
                            shutil.copy(Path(tmp) / "profile.txt", args.out.with_suffix(".profile.txt"))
                    if flipper is not None:
                        flipper.join()
                    phases[path + suffix] = {
                        **percentiles(lat),
                        "qps": round(qps, 1),
                        "errors": errors,
                        "requests": len(lat) + errors,
                        "versions_served": served,
                        "swaps": swaps_of(port) - swaps_before,
                        "feature_fallbacks": fallbacks_of(port) - fallbacks_before,
                        # each worker's share of the workers' CPU: connections stick to the
                        # worker that accepted them, and a burst of connects goes mostly to one
                        "worker_cpu_shares": shares(workers_before, worker_cpu(proc.pid)),
                        "replica_cpu_ms_per_request": round(
                            (cpu_seconds(proc.pid) - cpu_before) * 1000.0 / max(len(lat) + errors, 1), 3
                        ),
                    }
                if path == "redis":
                    grid = load_grid(args, port, bodies, model_name, versions)
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            cleanup(args, model_name, experiment, project)

    steady, swap, ref = phases["redis"], phases["redis+swaps"], phases["feast"]
    print(f"\noffered load {args.rate:g} req/s, {args.candidates} candidates, {args.seconds:g} s per phase")
    print(
        f"{'phase':<14}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'max ms':>9}"
        f"{'qps':>8}{'errors':>8}{'swaps':>7}{'defaults':>10}{'cpu ms':>8}  workers"
    )
    for name, ph in phases.items():
        print(
            f"{name:<14}{ph['p50_ms']:>9.2f}{ph['p99_ms']:>9.2f}{ph['p999_ms']:>9.2f}{ph['max_ms']:>9.2f}"
            f"{ph['qps']:>8.1f}{ph['errors']:>8}{ph['swaps']:>7.0f}{ph['feature_fallbacks']:>10.0f}"
            f"{ph['replica_cpu_ms_per_request']:>8.2f}  "
            + "/".join(f"{x:.2f}" for x in ph["worker_cpu_shares"])
        )
    print("(defaults: requests scored with default features: the store read failed or missed the deadline;")
    print(" cpu ms: the replica's CPU time per request, its workers included, /metrics scrapes too;")
    print(" workers: each worker's share of that CPU: a connection stays on the worker that accepted it)")
    print(
        f"\nfeature read alone, 1 user + {args.candidates} items "
        f"({args.feature_reads} reads each, in process):"
    )
    for name, f in feats.items():
        print(f"  {name:<10} p50 {f['p50_ms']:.2f} ms  p99 {f['p99_ms']:.2f} ms")
    ratio = feats["feast_sdk"]["p50_ms"] / feats["direct"]["p50_ms"]
    print(f"  SDK / direct (p50): {ratio:.2f}x")
    for kind, rows in profile.items():
        print(f"\npy-spy, redis phase (extra, profiled): top {kind} (share of samples)")
        for frame, share in rows:
            print(f"  {share:6.1%}  {frame}")
    print(
        f"\nfloor (in process: JSON + Redis read + forward + JSON): p50 {floor_ms['p50_ms']:.2f} ms"
        f" ({floor_ms['cpu_ms']:.2f} ms of CPU)"
    )
    if "sequence_length" in floor_ms:
        longest = floor_ms["longest_sequences"]
        print(
            f"  behaviour sequences of the requests' users: {floor_ms['sequence_length']}; the same requests "
            f"from the users with the longest ({longest['sequence_length']['max']}): "
            f"p50 {longest['p50_ms']:.2f} ms ({longest['cpu_ms']:.2f} ms of CPU)"
        )
    print(f"{'grid':<22}{'p50 ms':>9}{'p99 ms':>9}{'qps':>8}{'errors':>8}")
    for name, ph in grid.items():
        print(f"{name:<22}{ph['p50_ms']:>9.2f}{ph['p99_ms']:>9.2f}{ph['qps']:>8.1f}{ph['errors']:>8}")
    cpus = os.cpu_count() or 1
    max_qps = max((ph["qps"] for ph in grid.values() if ph["errors"] == 0), default=0.0)
    by_connections: dict[str, dict[str, float]] = {}
    for ph in grid.values():
        if not ph["swapping"]:
            by_connections.setdefault(str(ph["connections"]), {})[str(int(ph["offered_qps"]))] = ph["p99_ms"]
    target_qps = 0.6 * cpus / (floor_ms["p50_ms"] / 1000.0)
    print(f"max throughput {max_qps:.0f} req/s; target 0.6 x {cpus} cores / floor = {target_qps:.0f} req/s")
    result = {
        "p50_ms": steady["p50_ms"],
        "p99_ms": steady["p99_ms"],
        "p999_ms": steady["p999_ms"],
        "qps": steady["qps"],
        "errors": steady["errors"] + swap["errors"] + ref["errors"],
        "p99_during_swap_ms": swap["p99_ms"],
        "p999_during_swap_ms": swap["p999_ms"],
        "swaps_during_swap_phase": swap["swaps"],
        "feast_sdk_p50_ms": ref["p50_ms"],
        "feast_sdk_p99_ms": ref["p99_ms"],
        "feast_sdk_p999_ms": ref["p999_ms"],
        "feature_read_direct": feats["direct"],
        "feature_read_feast_sdk": feats["feast_sdk"],
        "feature_read_sdk_over_direct_p50": round(ratio, 2),
        "feature_read_direct_async": feats["direct_async"],
        "feature_read_direct_no_hiredis": feats["direct_no_hiredis"],
        "feature_read_no_hiredis_over_hiredis_p50": round(
            feats["direct_no_hiredis"]["p50_ms"] / feats["direct"]["p50_ms"], 2
        ),
        "floor_ms": floor_ms["p50_ms"],
        "floor": floor_ms,
        "max_qps": max_qps,
        "max_qps_target": round(target_qps, 1),
        "p99_ms_by_connections": by_connections,
        "errors_in_grid": sum(ph["errors"] for ph in grid.values()),
        "grid": grid,
        "phases": phases,
        "profile": {k: [[f, round(v, 4)] for f, v in rows] for k, rows in profile.items()},
        "meta": {
            "offered_qps": args.rate,
            "seconds_per_phase": args.seconds,
            "candidates": args.candidates,
            "client_threads": args.threads,
            "load_client": load_client(),
            "serving_workers": args.workers or "default",
            "model": f"{args.model}, {args.buckets} hashed rows, default dims",
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def cleanup(args: argparse.Namespace, model_name: str, experiment: str, project: str) -> None:
    """Remove the benchmark's registered model, experiment and Redis keys (never anything else)."""
    import redis
    from mlflow import MlflowClient

    try:
        client = MlflowClient(tracking_uri=args.mlflow_uri, registry_uri=args.mlflow_uri)
        if client.search_model_versions(f"name='{model_name}'"):
            client.delete_registered_model(model_name)
        exp = client.get_experiment_by_name(experiment)
        if exp is not None:
            client.delete_experiment(exp.experiment_id)
    except Exception as exc:
        print(f"warning: mlflow cleanup failed: {exc!r}")
    r = redis.Redis.from_url(args.redis_url)
    keys = list(r.scan_iter(match=f"*{project}".encode(), count=1000))
    if keys:
        r.delete(*keys)


if __name__ == "__main__":
    sys.exit(main())
