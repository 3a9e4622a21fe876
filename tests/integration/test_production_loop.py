"""The production profile end to end: real Kafka, Redis and MLflow server; daemons as processes.

One simulated stream (~300,000 events) is published once per module; each test runs the daemons
(``ctr joiner``, ``ctr trainer``, ``ctr serve``) as subprocesses over it, with their own consumer
groups, output topics, state folders, Feast project and registered model. The fault-free deployment
runs once per module (:func:`deployment`): its examples are what every faulty or scaled-out run
must reproduce.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from features.store import OnlineFeatureReader, connect_store
from pipeline.core.config import Config, KafkaConfig
from pipeline.kafka.io import ensure_topics, publish_stream
from pipeline.kafka.read import ExampleCounter, examples_to_end
from pipeline.sources.simulator import Simulator
from serving_bridge.replica_processes import served_version as replica_version
from serving_bridge.replica_processes import stop_processes
from tests.integration.stream_truth import expected_labels
from tests.integration.trainer_stop import stop_after_block
from trainers.registry import MlflowModelStore
from trainers.version_page import tag_time

IMPRESSIONS = 280_000  # plus ~17k clicks and ~1k duplicates: over 300,000 events
SEED = 21
PARTITIONS = 3
WINDOW_S, LAG_S = 900.0, 60.0
BLOCK = 60_000
# A daemon restarted after a kill joins its consumer group as the systemd units run it: a static
# member (their CTR_KAFKA_GROUP_INSTANCE_ID=%H) takes its partitions back at once, where a new
# dynamic member waits until the broker expires the dead one (session.timeout.ms, 45 s).
AS_SYSTEMD_RUNS_IT = {"CTR_KAFKA_GROUP_INSTANCE_ID": "it-host-a"}


@dataclass
class Stream:
    impressions_topic: str
    clicks_topic: str
    events: int
    expected: dict[str, int]  # impression id -> label, for every window closed by the stream's end


@pytest.fixture(scope="module")
def stream(services: dict[str, str], kafka_admin: object) -> Iterator[Stream]:
    tag = uuid.uuid4().hex[:10]
    k = KafkaConfig(
        bootstrap_servers=services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
        impressions_topic=f"imps-{tag}",
        clicks_topic=f"clicks-{tag}",
    )
    ensure_topics(k, [k.impressions_topic, k.clicks_topic], PARTITIONS)
    sim = Simulator(Config().simulator, SEED)
    counts = publish_stream(k, sim.stream(IMPRESSIONS))
    expected = expected_labels(sim, IMPRESSIONS, PARTITIONS, WINDOW_S, LAG_S)
    yield Stream(k.impressions_topic, k.clicks_topic, sum(counts.values()), expected)
    kafka_admin.delete_topics([k.impressions_topic, k.clicks_topic])  # type: ignore[attr-defined]


@dataclass
class Run:
    """One deployment: its own groups, output topics, state, Feast project and model name."""

    services: dict[str, str]
    stream: Stream
    tmp: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def examples_topic(self) -> str:
        return f"examples-{self.tag}"

    @property
    def model_name(self) -> str:
        return f"it-model-{self.tag}"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "CTR_KAFKA_BOOTSTRAP_SERVERS": self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
            "CTR_KAFKA_IMPRESSIONS_TOPIC": self.stream.impressions_topic,
            "CTR_KAFKA_CLICKS_TOPIC": self.stream.clicks_topic,
            "CTR_KAFKA_EXAMPLES_TOPIC": self.examples_topic,
            "CTR_KAFKA_DEAD_LETTER_TOPIC": f"dead-{self.tag}",
            "CTR_KAFKA_PARTITIONS": str(PARTITIONS),
            "CTR_KAFKA_GROUP_ID_PREFIX": f"it-{self.tag}",
            "CTR_DAEMON_STATE_DIR": str(self.tmp / "state"),
            "CTR_DAEMON_REDIS_URL": self.services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",
            "CTR_DAEMON_CHECKPOINT_EVERY_S": "3",
            "CTR_FEATURES_PROJECT": f"it_{self.tag}",
            "CTR_REGISTRY_TRACKING_URI": self.services["CTR_REGISTRY_TRACKING_URI"],
            "CTR_REGISTRY_MODEL_NAME": self.model_name,
            "CTR_REGISTRY_EXPERIMENT": f"it-exp-{self.tag}",
            "CTR_TRAINER_TRAIN_EVERY": str(BLOCK),
            "CTR_TRAINER_HASH_BUCKETS": str(1 << 18),
            "CTR_TRAINER_THREADS": "1",
            "CTR_SERVING_POLL_INTERVAL_S": "0.5",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
            **extra,
        }

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        command = next(a for a in args if not a.startswith("-"))
        log = (self.tmp / f"{command}-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.ops.cli", *args],
            env=self.env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]  # finish() shows it on failure
        self.procs.append(proc)
        return proc

    def examples(self, timeout_s: float = 300.0) -> tuple[dict[str, bytes], int]:
        """Every example on the output topic by id (and how many messages repeated an id).

        Reads up to the end offsets taken first, so a slow broker cannot cut the read short."""
        out: dict[str, bytes] = {}
        repeats = 0
        for value in examples_to_end(
            self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"], self.examples_topic, timeout_s
        ):
            ex_id = json.loads(value)["impression"]["impression_id"]
            if ex_id in out:
                repeats += 1
                assert out[ex_id] == value, f"a replay changed example {ex_id}"
            out[ex_id] = value
        return out, repeats

    def stop_all(self) -> None:
        stop_processes(self.procs)


@pytest.fixture
def run(services: dict[str, str], stream: Stream, tmp_path: Path) -> Iterator[Run]:
    r = Run(services, stream, tmp_path)
    yield r
    r.stop_all()


@dataclass
class Deployment:
    run: Run
    examples: dict[str, bytes]  # by impression id
    replicas: list[subprocess.Popen[bytes]]


@pytest.fixture(scope="module")
def deployment(
    services: dict[str, str], stream: Stream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """The production profile, fault-free: ``ctr joiner``, ``ctr trainer`` and two ``ctr serve``
    replicas over the stream, the trainer stopped once it trained the stream's last full block."""
    r = Run(services, stream, tmp_path_factory.mktemp("deployment"))
    # its input is all on Kafka: it stops once its group has read it all and holds no event
    joiner = r.start("joiner", "--exit-when-idle", "3")
    trainer = r.start("trainer")
    replicas = [
        r.start("serve", "--port", str(20_000 + random.randrange(5_000))),
        r.start("serve", "--port", str(25_000 + random.randrange(5_000))),
    ]
    finish(joiner)
    examples, repeats = r.examples()
    assert repeats == 0
    stop_after_block(trainer, model_store(r), len(examples) // BLOCK)
    yield Deployment(r, examples, replicas)
    r.stop_all()


@pytest.fixture(scope="module")
def reference(deployment: Deployment) -> tuple[Run, dict[str, bytes]]:
    """The fault-free deployment's joiner run and its examples (its replicas are not needed)."""
    stop_processes(deployment.replicas)
    return deployment.run, deployment.examples


def model_store(r: Run) -> MlflowModelStore:

    cfg = Config()
    cfg.registry.model_name = r.model_name
    return MlflowModelStore(cfg.registry, r.services["CTR_REGISTRY_TRACKING_URI"])


def wait_for_examples(r: Run, at_least: int, timeout_s: float = 300) -> None:
    """Block until the run's output topic holds ``at_least`` examples."""
    count = ExampleCounter(r.services["CTR_KAFKA_BOOTSTRAP_SERVERS"], r.examples_topic)
    deadline = time.monotonic() + timeout_s
    try:
        while count() < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"fewer than {at_least} examples after {timeout_s}s")
    finally:
        count.close()


def wait_for_commit(proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Block until ``proc`` (a ``ctr -v joiner``) has committed a checkpoint of tasks of its own: its
    log says so once the transaction of their state and input offsets has committed. (An output
    partition's end offset says less: examples are flushed before that transaction, which can then
    be refused, and the other joiner may have written to the partition before a rebalance.) On a
    timeout, fail with the stacks it prints on SIGUSR1 (``ctr``'s faulthandler) at the end of its log."""
    deadline = time.monotonic() + timeout_s
    log = Path(proc.log_path)  # type: ignore[attr-defined]
    while "checkpoint committed for partitions" not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            tail = log.read_text(errors="replace")[-6000:]
            raise AssertionError(
                f"{proc.args} committed no checkpoint of its tasks in {timeout_s:.0f} s; "
                f"its log (stacks last) ends:\n{tail}"
            )
        time.sleep(0.5)


def wait_for_every_example(r: Run, ids: set[str], timeout_s: float = 300) -> None:
    """Block until the run's output topic holds an example of every impression id in ``ids``
    (repeats allowed), read once from the beginning, incrementally."""
    reader = ExampleCounter(r.services["CTR_KAFKA_BOOTSTRAP_SERVERS"], r.examples_topic)
    missing, deadline = set(ids), time.monotonic() + timeout_s
    try:
        while missing:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(missing)} of {len(ids)} examples missing after {timeout_s:.0f} s")
            missing.difference_update(
                json.loads(line)["impression"]["impression_id"] for line in reader.new_examples()
            )
    finally:
        reader.close()


def user_features(r: Run, users: list[str], feast: str = "state") -> list[dict[str, float]]:
    """The users' rows the joiner pushed (item rows are ``ctr trainer``'s, features.item_stage)."""
    reader = OnlineFeatureReader(connect_store(r.tmp / feast / "joiner" / "feast"))
    return [{k: v for k, v in reader.get(u, ["no-item"])[0].items() if k.startswith("user_")} for u in users]


def served_version(port: int, until: str | None = None, timeout_s: float = 60) -> str | None:
    """The version a replica answers on ``GET /version`` (waiting up to ``timeout_s`` for ``until``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        served = replica_version(f"http://127.0.0.1:{port}")
        if (served is not None if until is None else served == until) or time.monotonic() > deadline:
            return served
        time.sleep(0.5)


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    if proc.wait(timeout=timeout_s) != 0:
        log = Path(getattr(proc, "log_path", ""))
        tail = log.read_text(errors="replace")[-4000:] if log.is_file() else "(no log)"
        raise AssertionError(f"{proc.args} exited with {proc.returncode}; its log ends:\n{tail}")


def assert_same_examples(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """``got == want``, failing with counts and examples (pytest's diff of 300k entries takes hours)."""
    lost, invented = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    assert not (lost or invented or changed), (
        f"{len(lost)} lost (e.g. {lost[:3]}), {len(invented)} invented (e.g. {invented[:3]}), "
        f"{len(changed)} changed (e.g. {[(want[k], got[k]) for k in changed[:1]]}) of {len(want)}"
    )


def start(position: dict[str, Any]) -> tuple[Any, Any]:
    """Where a block's lineage says it started: record offsets and lines of them read already."""
    return position["kafka_offsets_from"], position["kafka_lines_from"]


def end(position: dict[str, Any]) -> tuple[Any, Any]:
    return position["kafka_offsets_to"], position["kafka_lines_to"]


def labels(examples: dict[str, bytes]) -> dict[str, int]:
    return {i: json.loads(v)["label"] for i, v in examples.items()}


def test_daemons_turn_the_stream_into_exactly_the_expected_examples_and_versions(
    deployment: Deployment,
) -> None:
    run, examples, (replica, replica2) = deployment.run, deployment.examples, deployment.replicas
    assert labels(examples) == run.stream.expected  # no loss, no duplicate, right labels
    store = model_store(run)
    versions = store.versions()
    assert len(versions) >= 3
    previous_to = None
    for v in versions:
        lineage = store.lineage(v)
        position = json.loads(lineage["position"])
        closed_at = tag_time(lineage["block_closed_at"])  # ISO 8601: wall time, freshness starts there
        assert closed_at is not None and closed_at > time.time() - 3_600
        assert set(position) == {
            "kafka_offsets_from",
            "kafka_offsets_to",
            "kafka_lines_from",
            "kafka_lines_to",
        }
        assert all(k.startswith(run.examples_topic) for k in position["kafka_offsets_to"])
        if previous_to is not None:
            assert start(position) == previous_to  # consecutive offset ranges
        previous_to = end(position)
    champion = store.resolve("champion")
    assert champion == versions[-1]

    port = int(replica.args[-1])  # type: ignore[index]
    for p in (replica, replica2):  # both replicas follow the champion
        assert served_version(int(p.args[-1]), until=champion) == champion  # type: ignore[index]
    body = json.dumps({"user_id": "user-3", "context": {"device": "mobile"}, "items": ["item-1", "item-2"]})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/score", body.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        scored = json.loads(resp.read())
    assert scored["version"] == champion and len(scored["probabilities"]) == 2
    # the item rows serving reads are the trainer's global ones: keyed by the item id alone
    reader = OnlineFeatureReader(connect_store(run.tmp / "state" / "joiner" / "feast"))
    rows = reader.get("anyone", [f"item-{i}" for i in range(5)])
    assert all(r["item_impressions_24h"] > 0 for r in rows), rows

    # `ctr status --json` shows the version each replica says it serves
    urls = [f"http://127.0.0.1:{p.args[-1]}" for p in (replica, replica2)]  # type: ignore[index]
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.ops.cli", "status", "--json", *(f"--replica={u}" for u in urls)],
        env=run.env(),
        capture_output=True,
        check=True,
        timeout=120,
    )
    status = json.loads(out.stdout)
    assert all(svc["up"] for svc in status["services"].values()), status["services"]
    assert status["models"]["champion"] == champion
    assert [b["version"] for b in status["models"]["last_blocks"]] == versions[-5:]
    assert status["consumers"]["joiner"]["total"] == 0  # the joiner exited after committing everything
    for p, shown in zip((replica, replica2), status["replicas"], strict=True):
        assert shown["up"] and shown["version"] == served_version(int(p.args[-1]))  # type: ignore[index]
    first = status["replicas"][0]
    assert first["version"] == champion and first["freshness_s"] is not None and first["freshness_s"] > 0


def test_kill_9_of_the_joiner_loses_and_duplicates_nothing(
    run: Run, reference: tuple[Run, dict[str, bytes]]
) -> None:
    ref_run, ref_examples = reference
    rng = random.Random(5)
    for _ in range(2):  # two crashes at random points of the stream
        proc = run.start("joiner", **AS_SYSTEMD_RUNS_IT)
        wait_for_examples(run, rng.randrange(20_000, 200_000))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finish(run.start("joiner", "--exit-when-idle", "3", **AS_SYSTEMD_RUNS_IT))
    examples, _ = run.examples()  # repeats are allowed only as byte-identical copies
    assert_same_examples(examples, ref_examples)
    users = sorted({json.loads(v)["impression"]["user_id"] for v in list(examples.values())[:50]})
    assert user_features(run, users) == user_features(ref_run, users)


def test_two_joiners_in_one_group_produce_what_one_produces(
    run: Run, reference: tuple[Run, dict[str, bytes]]
) -> None:
    # neither stops before the group has read everything (ctr joiner's caught_up): a short idle
    first = run.start("joiner", "--exit-when-idle", "3")
    second = run.start("joiner", "--exit-when-idle", "3")
    finish(first)
    finish(second)
    examples, _ = run.examples()
    assert_same_examples(examples, reference[1])


@pytest.mark.faults
def test_a_joiner_machine_lost_for_good_loses_and_duplicates_nothing(
    run: Run, reference: tuple[Run, dict[str, bytes]], fault_report: Callable[..., None]
) -> None:
    """Two joiner "machines" (processes with their own state folders) in one group; one is killed
    for good mid-stream; the other takes its partitions, restoring their state from the changelog."""
    ref_run, ref_examples = reference
    doomed = run.start("-v", "joiner", CTR_DAEMON_STATE_DIR=str(run.tmp / "machine-a"))  # -v: tasks opened
    # no --exit-when-idle: it could go idle on its own partitions before the other machine is lost
    survivor = run.start("-v", "joiner", CTR_DAEMON_STATE_DIR=str(run.tmp / "machine-b"))

    def opened(proc: subprocess.Popen[bytes], how: str) -> set[str]:
        log = Path(proc.log_path).read_text()  # type: ignore[attr-defined]
        return set(re.findall(rf"task for partition (\d+) {how}", log))

    wait_for_examples(run, 90_000)
    # The machine is lost once it has committed work of its own (its tasks' state and input
    # offsets, in one transaction): the total alone can be reached by the other joiner.
    wait_for_commit(doomed)
    doomed.send_signal(signal.SIGKILL)  # never restarted: its folder is gone with its machine
    doomed.wait()
    shutil.rmtree(run.tmp / "machine-a")
    wait_for_every_example(run, set(ref_examples))  # the lost machine's partitions too
    survivor.send_signal(signal.SIGTERM)  # a clean stop: flush, checkpoint, commit
    finish(survivor)
    examples, repeats = run.examples()  # repeats are allowed only as byte-identical copies
    lost = len(ref_examples.keys() - examples.keys())
    changed = sum(examples[i] != ref_examples[i] for i in ref_examples.keys() & examples.keys())
    invented = len(examples.keys() - ref_examples.keys())

    # partitions the lost machine worked on, then the survivor opened from their committed state
    took_over = len(opened(doomed, "(?:started|restored)") & opened(survivor, "restored"))
    fault_report(
        "joiner machine lost for good (2 joiners)",
        1,
        int(took_over > 0 and lost == 0),
        lost,
        changed + invented,
        f"{took_over} tasks restored from the changelog, {repeats} byte-identical replays",
    )
    survivor_log = Path(survivor.log_path).read_text()  # type: ignore[attr-defined]
    assert took_over > 0, survivor_log[-3000:]
    assert "ProducerFenced" not in survivor_log  # each process its own transactional id
    assert_same_examples(examples, ref_examples)
    users = sorted({json.loads(v)["impression"]["user_id"] for v in list(examples.values())[:50]})
    assert user_features(run, users, "machine-b") == user_features(ref_run, users)


def test_kill_9_of_the_trainer_leaves_no_gap_in_the_lineage(
    run: Run, reference: tuple[Run, dict[str, bytes]]
) -> None:
    ref_run = reference[0]
    run.tag = ref_run.tag + "x"  # a fresh model, state and group ...
    env_topic = {"CTR_KAFKA_EXAMPLES_TOPIC": ref_run.examples_topic}  # ... over the reference's examples

    store = model_store(run)

    def start_trainer(*args: str) -> subprocess.Popen[bytes]:
        log = (run.tmp / f"trainer-{len(run.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.ops.cli", "trainer", *args],
            env=run.env(**env_topic, **AS_SYSTEMD_RUNS_IT),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        run.procs.append(proc)
        return proc

    proc = start_trainer()
    deadline = time.monotonic() + 300
    while len(store.versions()) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(random.Random(3).uniform(0.5, 5.0))  # somewhere inside the next block
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stop_after_block(start_trainer(), store, len(reference[1]) // BLOCK)
    versions = store.versions()
    assert len(versions) >= 2
    keys: set[str] = set()
    parent, previous_block, previous_to = "none", 0, None
    for v in versions:  # one version per accepted block, each the child of the one before
        lineage = store.lineage(v)
        assert lineage["lineage_key"] not in keys
        keys.add(lineage["lineage_key"])
        assert lineage["parent_version"] == parent
        block = int(lineage["block"])
        assert block > previous_block
        position = json.loads(lineage["position"])
        if block == previous_block + 1 and previous_to is not None:
            assert start(position) == previous_to  # no example skipped or repeated
        parent, previous_block, previous_to = v, block, end(position)
    assert previous_block == len(reference[1]) // BLOCK  # every full block was trained once


class FleetClient(threading.Thread):
    """Scores continuously against the fleet: each request goes to one replica, and to the other
    if the first does not answer (killed, restarting, not ready). Counts what the fleet answered."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(daemon=True)
        self.ports, self.stop = ports, threading.Event()
        self.answered = self.failed_over = self.unanswered = 0
        self.versions: set[str] = set()

    def _score(self, port: int) -> str | None:
        body = json.dumps({"user_id": "user-7", "context": {}, "items": ["item-1", "item-2", "item-3"]})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/score", body.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return str(json.loads(resp.read())["version"])
        # refused, reset, 503 while loading, a reply cut short by the kill: ask the next replica
        except (OSError, ValueError, http.client.HTTPException):
            return None

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            turn += 1
            first, second = self.ports[turn % 2], self.ports[(turn + 1) % 2]
            version = self._score(first)
            if version is None:
                version = self._score(second)
                self.failed_over += version is not None
            if version is None:
                self.unanswered += 1
            else:
                self.answered += 1
                self.versions.add(version)
            time.sleep(0.02)


@pytest.mark.faults
@pytest.mark.timeout(1_800)  # four daemons over 300k events with a dozen restarts: minutes on 2 cores
def test_seeded_sigkills_of_joiner_trainer_and_replicas_lose_and_duplicate_nothing(
    run: Run, reference: tuple[Run, dict[str, bytes]], fault_report: Callable[..., None]
) -> None:
    """>= 10 SIGKILLs at seeded random moments while the daemons work through the ~300k-event stream."""
    ref_run, ref_examples = reference
    rng = random.Random(8)
    ports = [30_000 + random.randrange(5_000), 35_000 + random.randrange(5_000)]
    args = {
        "joiner": ("joiner", "--exit-when-idle", "20"),
        "trainer": ("trainer",),  # stopped once it trained the last full block
        **{f"replica-{p}": ("serve", "--port", str(p)) for p in ports},
    }
    env = {name: AS_SYSTEMD_RUNS_IT if name in ("joiner", "trainer") else {} for name in args}
    procs = {name: run.start(*a, **env[name]) for name, a in args.items()}
    store = model_store(run)
    deadline = time.monotonic() + 600
    while store.resolve("champion") is None:  # the fleet has something to serve
        assert time.monotonic() < deadline, "no first version"
        time.sleep(0.5)
    for p in ports:
        assert served_version(p) is not None
    client = FleetClient(ports)
    client.start()

    kills: dict[str, int] = {"joiner": 0, "trainer": 0, "replica": 0}
    recovered: dict[str, int] = dict.fromkeys(kills, 0)
    for _ in range(12):
        time.sleep(rng.uniform(1.0, 6.0))
        name = rng.choice(["joiner", "trainer", *[f"replica-{p}" for p in ports]])
        kind = name.split("-")[0]
        procs[name].send_signal(signal.SIGKILL)
        procs[name].wait()
        kills[kind] += 1
        procs[name] = run.start(*args[name], **env[name])  # what systemd's Restart=on-failure does
        if kind == "replica":  # back before the next kill: one replica down at a time
            recovered[kind] += served_version(int(args[name][-1])) is not None
        else:
            time.sleep(1.0)
            recovered[kind] += procs[name].poll() in (None, 0)
    finish(procs["joiner"])
    stop_after_block(procs["trainer"], store, len(ref_examples) // BLOCK)
    champion = store.resolve("champion")
    replicas_on_champion = [served_version(p, until=champion) == champion for p in ports]
    scored_throughout = client.is_alive()  # an exception in the client would have ended it early
    client.stop.set()
    client.join()

    examples, _ = run.examples()  # repeats are allowed only as byte-identical copies
    lost = len(set(ref_examples) - set(examples))
    versions = store.versions()
    keys = [store.lineage(v)["lineage_key"] for v in versions]
    fault_report("SIGKILL joiner (300k-event replay)", kills["joiner"], recovered["joiner"], lost, 0)
    fault_report("SIGKILL trainer", kills["trainer"], recovered["trainer"], 0, len(keys) - len(set(keys)))
    fault_report(
        "SIGKILL replica (fleet under load)",
        kills["replica"],
        recovered["replica"],
        client.unanswered,
        0,
        f"{client.answered} answered, {client.failed_over} by the other replica",
    )
    assert sum(kills.values()) == 12 and recovered == kills
    assert_same_examples(examples, ref_examples)  # no example lost, changed or invented
    users = sorted({json.loads(v)["impression"]["user_id"] for v in list(examples.values())[:50]})
    assert user_features(run, users) == user_features(ref_run, users)
    # the lineage: each full block trained once, a chain of versions over consecutive offsets
    parent, previous_block, previous_to = "none", 0, None
    for v in versions:
        lineage = store.lineage(v)
        assert lineage["parent_version"] == parent
        block, position = int(lineage["block"]), json.loads(lineage["position"])
        assert block > previous_block and int(lineage["examples"]) == BLOCK
        if block == previous_block + 1 and previous_to is not None:
            assert start(position) == previous_to
        parent, previous_block, previous_to = v, block, end(position)
    assert len(keys) == len(set(keys)) and previous_block == len(ref_examples) // BLOCK
    # the fleet answered every request, and every replica came back on the champion
    assert scored_throughout and client.unanswered == 0 and client.answered > 0
    assert all(replicas_on_champion)
