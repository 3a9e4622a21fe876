"""Each daemon run the way its systemd unit runs it, against the real Kafka, Redis and MLflow.

`ctr deploy install` lays out a scratch prefix; the test reads the rendered unit's ``ExecStart=``,
``EnvironmentFile=``, ``WatchdogSec=`` and ``TimeoutStopSec=``, starts the command with the
environment file parsed as systemd parses it (plus ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC``, which
systemd would add), and plays systemd: it waits for ``READY=1``, counts ``WATCHDOG=1`` pings, sends
SIGTERM mid-work and expects ``STOPPING=1`` and exit 0 within ``TimeoutStopSec``. Offsets must be
committed exactly where the daemon's checkpoint says, and a restart must lose nothing.

Two deviations from a real unit, both to test the checkout rather than the installed package:
``PYTHONPATH`` points at this repository, and the watchdog interval is 2 s (pings every second).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline.core.config import Config, KafkaConfig
from pipeline.daemons.joiner_state import committed_states
from pipeline.kafka.example_records import kafka_offsets
from pipeline.kafka.io import ensure_topics, publish_stream
from pipeline.kafka.read import examples_to_end
from pipeline.ops.deploy import Installer, InstallOptions, parse_env_file
from pipeline.sources.simulator import Simulator
from tests.integration.stream_truth import expected_labels

REPO = Path(__file__).resolve().parents[2]
IMPRESSIONS, SEED, PARTITIONS = 40_000, 11, 3
EVENTS_PER_S = 10.0  # slow event time: 4,000 s of stream, so most attribution windows close
WINDOW_S, LAG_S = 900.0, 60.0
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NotifySocket:
    """Plays systemd's side of sd_notify: a datagram socket that records every message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def lines(self, prefix: str) -> list[str]:
        return [m for _, m in self.messages if m.startswith(prefix)]

    def wait_for(self, prefix: str, timeout_s: float, count: int = 1) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lines(prefix)) < count:
            assert time.monotonic() < deadline, f"no {count}x {prefix!r} in {timeout_s}s: {self.messages}"
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@dataclass
class Unit:
    """A rendered unit file: the few settings the test needs to run its command as systemd would."""

    text: str
    instance: str = ""

    def setting(self, key: str) -> str:
        joined = self.text.replace("\\\n", " ")
        found = re.findall(rf"^{key}=(.*)$", joined, flags=re.M)
        assert found, f"no {key}= in the unit"
        return found[-1].strip().replace("%i", self.instance)

    def seconds(self, key: str) -> float:
        return float(self.setting(key).removesuffix("s"))

    def environment(self) -> dict[str, str]:
        """Environment= assignments, then the EnvironmentFile= (which overrides them)."""
        env: dict[str, str] = {}
        for line in re.findall(r"^Environment=(.*)$", self.text, flags=re.M):
            line = line.replace("%C", "/var/cache").replace("%H", socket.gethostname())
            env.update(a.split("=", 1) for a in shlex.split(line))
        env.update(parse_env_file(Path(self.setting("EnvironmentFile")).read_text()))
        return env

    def command(self, env: dict[str, str]) -> list[str]:
        line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], self.setting("ExecStart"))
        return shlex.split(line)


@dataclass
class Deployment:
    services: dict[str, str]
    tmp: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    installer: Installer | None = None
    expected: dict[str, int] = field(default_factory=dict)
    metrics_port: int = field(default_factory=lambda: 25_000 + uuid.uuid4().int % 5_000)

    @property
    def kafka(self) -> KafkaConfig:
        t = self.tag
        return KafkaConfig(
            bootstrap_servers=self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
            impressions_topic=f"sd-imps-{t}",
            clicks_topic=f"sd-clicks-{t}",
            examples_topic=f"sd-examples-{t}",
            dead_letter_topic=f"sd-dead-{t}",
            group_id_prefix=f"sd-{t}",
        )

    def install(self) -> Installer:
        opts = InstallOptions(prefix=self.tmp / "root", user="ctr", kafka_libs=self.tmp / "none")
        self.installer = Installer(opts, out=lambda _: None)
        self.installer.run()
        k = self.kafka
        # what an operator puts in ctr.env for this deployment (the config's variable names)
        lines = {
            "CTR_KAFKA_BOOTSTRAP_SERVERS": k.bootstrap_servers,
            "CTR_KAFKA_IMPRESSIONS_TOPIC": k.impressions_topic,
            "CTR_KAFKA_CLICKS_TOPIC": k.clicks_topic,
            "CTR_KAFKA_EXAMPLES_TOPIC": k.examples_topic,
            "CTR_KAFKA_DEAD_LETTER_TOPIC": k.dead_letter_topic,
            "CTR_KAFKA_PARTITIONS": str(PARTITIONS),
            "CTR_KAFKA_GROUP_ID_PREFIX": k.group_id_prefix,
            "CTR_DAEMON_REDIS_URL": self.services["CTR_DAEMON_REDIS_URL"].rsplit("/", 1)[0] + "/15",
            "CTR_DAEMON_CHECKPOINT_EVERY_S": "2",
            "CTR_FEATURES_PROJECT": f"sd_{self.tag}",
            "CTR_REGISTRY_TRACKING_URI": self.services["CTR_REGISTRY_TRACKING_URI"],
            "CTR_REGISTRY_MODEL_NAME": f"sd-model-{self.tag}",
            "CTR_REGISTRY_EXPERIMENT": f"sd-exp-{self.tag}",
            "CTR_TRAINER_TRAIN_EVERY": "4000",
            "CTR_TRAINER_HASH_BUCKETS": str(1 << 16),
            "CTR_TRAINER_THREADS": "1",
            "CTR_DAEMON_JOINER_METRICS_PORT": str(self.metrics_port),
            "CTR_DAEMON_TRAINER_METRICS_PORT": str(self.metrics_port + 1),
        }
        with (self.installer.etc / "ctr.env").open("a") as f:
            f.write("\n# integration test\n" + "".join(f"{k}={v}\n" for k, v in lines.items()))
        return self.installer

    @property
    def state(self) -> Path:
        """The daemons' state folder of the installed ctr.toml."""
        assert self.installer is not None
        return self.installer.state / "daemons"

    def unit(self, name: str, instance: str = "") -> Unit:
        assert self.installer is not None
        return Unit((self.installer.unit_dir / name).read_text(), instance)

    def start(self, unit: Unit, notify: NotifySocket, *extra: str) -> subprocess.Popen[bytes]:
        env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", **unit.environment()}
        env |= {"HOME": str(self.tmp), "XDG_CACHE_HOME": str(self.tmp / "cache")}  # %C/ctr, writable
        env |= {"MPLCONFIGDIR": str(self.tmp / "cache" / "mpl")}
        env |= {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000", "PYTHONPATH": str(REPO)}
        log = (self.tmp / f"{notify.path.stem}.log").open("ab")
        return subprocess.Popen(
            [*unit.command(env), *extra], env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/"
        )

    def committed(self, group: str, topics: list[str]) -> dict[str, int]:
        """The group's committed offsets (a consumer that asks, without joining the group)."""
        consumer = KafkaConsumer(
            bootstrap_servers=self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"],
            group_id=group,
            enable_auto_commit=False,
        )
        try:
            tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
            found = {f"{tp.topic}:{tp.partition}": consumer.committed(tp) for tp in tps}
        finally:
            consumer.close()
        return {k: v for k, v in found.items() if v is not None}

    def examples(self) -> tuple[dict[str, int], int]:
        labels: dict[str, int] = {}
        repeats = 0
        for value in examples_to_end(self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"], self.kafka.examples_topic):
            ex = json.loads(value)
            repeats += ex["impression"]["impression_id"] in labels
            labels[ex["impression"]["impression_id"]] = ex["label"]
        return labels, repeats

    def example_count(self) -> int:
        return len(examples_to_end(self.services["CTR_KAFKA_BOOTSTRAP_SERVERS"], self.kafka.examples_topic))


@pytest.fixture(scope="module")
def deployment(
    services: dict[str, str], kafka_admin: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    d = Deployment(services, tmp_path_factory.mktemp("systemd"))
    d.install()
    k = d.kafka
    ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.examples_topic], PARTITIONS)
    sim_cfg = Config().simulator
    sim_cfg.events_per_s = EVENTS_PER_S
    sim = Simulator(sim_cfg, SEED)
    publish_stream(k, sim.stream(IMPRESSIONS))
    d.expected = expected_labels(sim, IMPRESSIONS, PARTITIONS, WINDOW_S, LAG_S)
    yield d
    topics = [k.impressions_topic, k.clicks_topic, k.examples_topic, k.dead_letter_topic]
    try:
        kafka_admin.delete_topics(topics)  # type: ignore[attr-defined]
    except Exception as e:
        print(f"warning: could not delete topics {topics}: {e!r}")


@pytest.fixture
def notify(request: pytest.FixtureRequest, deployment: Deployment) -> Iterator[NotifySocket]:
    name = re.sub(r"\W+", "-", request.node.name)[:40]
    n = NotifySocket(deployment.tmp / f"{name}-{uuid.uuid4().hex[:6]}.sock")
    yield n
    n.close()


def scrape(port: int) -> dict[str, float]:
    """``GET /metrics`` as {series with labels: value} (comments dropped)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        # Prometheus' text format: 0.0.4, or 1.0.0 as prometheus-client >= 0.22 labels the same text
        content_type = resp.headers["Content-Type"]
        assert content_type.startswith(("text/plain; version=0.0.4", "text/plain; version=1.0.0")), (
            content_type
        )
        lines = resp.read().decode().splitlines()
    return {
        ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln and not ln.startswith("#")
    }


def series(metrics: dict[str, float], name: str) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k == name or k.startswith(name + "{")}


def stop_like_systemd(proc: subprocess.Popen[bytes], notify: NotifySocket, unit: Unit) -> None:
    """SIGTERM; then STOPPING=1 and exit 0 within TimeoutStopSec (SIGKILL after it, as systemd does)."""
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=unit.seconds("TimeoutStopSec"))
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        raise AssertionError(
            f"{proc.args} still running {unit.seconds('TimeoutStopSec')}s after SIGTERM"
        ) from exc
    assert rc == 0, f"{proc.args} exited with {rc}"
    assert notify.lines("STOPPING=1"), notify.messages


def test_joiner_unit_readiness_watchdog_and_clean_stop(deployment: Deployment, notify: NotifySocket) -> None:
    unit = deployment.unit("ctr-joiner.service")
    assert unit.setting("Type") == "notify" and unit.seconds("WatchdogSec") > 0
    proc = deployment.start(unit, notify)
    try:
        notify.wait_for("READY=1", timeout_s=unit.seconds("TimeoutStartSec"))
        notify.wait_for("WATCHDOG=1", timeout_s=30, count=2)
        deadline = time.monotonic() + 120
        while deployment.example_count() < 2_000:  # SIGTERM while it works through the stream
            assert time.monotonic() < deadline and proc.poll() is None, "the joiner produced too little"
            time.sleep(0.2)
        # Checkpoints (every 2 s) measure the lag and time themselves; on a loaded machine the first
        # one can take a while, so wait for it rather than for a fixed time.
        deadline = time.monotonic() + 60
        m = scrape(deployment.metrics_port)
        while not series(m, "ctr_joiner_checkpoint_seconds_count") and time.monotonic() < deadline:
            time.sleep(0.5)
            m = scrape(deployment.metrics_port)
        assert m["ctr_joiner_events_total"] > 2_000 and m["ctr_joiner_examples_total"] > 0
        while m["ctr_joiner_join_rate"] == 0 and time.monotonic() < deadline:  # a checkpoint after a join
            time.sleep(0.5)
            m = scrape(deployment.metrics_port)
        assert 0 < m["ctr_joiner_join_rate"] <= 1  # the simulator's clicks mostly land in the window
        assert m["ctr_joiner_events_per_second"] > 0 and m["ctr_joiner_examples_per_second"] >= 0
        lag = series(m, "ctr_consumer_lag")
        assert len(lag) == 2 * PARTITIONS and all(v >= 0 for v in lag.values())
        assert series(m, "ctr_joiner_checkpoint_seconds_count")
        phases = series(m, "ctr_joiner_checkpoint_phase_seconds_total")  # where checkpoint time goes
        assert {k.split('"')[1] for k in phases} == {"flush", "features", "state"}
        assert min(phases.values()) >= 0 and sum(phases.values()) > 0  # a checkpoint ended (join rate)
        clicks = series(m, "ctr_joiner_clicks_total")  # every outcome exists, the counts add up
        assert {k.split('"')[1] for k in clicks} == {"attributed", "late", "early", "orphan", "duplicate"}
        stop_like_systemd(proc, notify, unit)
    finally:
        if proc.poll() is None:
            proc.kill()
    # offsets committed exactly where the committed state says: a restart resumes there
    group = f"sd-{deployment.tag}-joiner"
    k = deployment.kafka
    topic_of = {"impression": k.impressions_topic, "click": k.clicks_topic}
    cfg = Config()
    cfg.kafka = k
    checkpointed = {
        f"{topic_of[kind]}:{p}": off
        for p, state in committed_states(cfg).items()
        for kind, off in state["next_offsets"].items()
    }
    assert checkpointed and deployment.committed(group, list(topic_of.values())) == checkpointed
    # a restart finishes the stream: every expected example exactly once (the stop left no replay)
    again = deployment.start(unit, notify, "--exit-when-idle", "8")
    assert again.wait(timeout=300) == 0
    labels, repeats = deployment.examples()
    assert repeats == 0 and labels == deployment.expected


def test_trainer_unit_readiness_watchdog_and_clean_stop_mid_stream(
    deployment: Deployment, notify: NotifySocket
) -> None:
    if deployment.example_count() < 12_000:  # the joiner test did not run first (-k): join now
        joiner = deployment.start(deployment.unit("ctr-joiner.service"), notify, "--exit-when-idle", "8")
        assert joiner.wait(timeout=300) == 0
        notify.messages.clear()
    unit = deployment.unit("ctr-trainer.service")
    proc = deployment.start(unit, notify)
    try:
        notify.wait_for("READY=1", timeout_s=unit.seconds("TimeoutStartSec"))
        notify.wait_for("STATUS=trainer: block", timeout_s=300)  # mid-stream: a block is done
        assert len(notify.lines("WATCHDOG=1")) >= 1
        time.sleep(0.5)
        m = scrape(deployment.metrics_port + 1)
        assert m["ctr_trainer_examples_total"] >= 4_000
        assert m['ctr_trainer_blocks_total{decision="accepted"}'] >= 1
        assert 0 < m["ctr_trainer_block_train_seconds_sum"] < 300
        assert 0.4 < m["ctr_trainer_progressive_auc"] <= 1
        assert len(series(m, "ctr_consumer_lag")) == PARTITIONS
        stop_like_systemd(proc, notify, unit)
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = json.loads((deployment.state / "trainer" / "meta.json").read_text())
    assert meta["blocks"] >= 1 and "pending" not in meta
    # committed offsets = the checkpoint's records: the unfinished block is re-read after a restart, not lost
    assert deployment.committed(
        f"sd-{deployment.tag}-trainer", [deployment.kafka.examples_topic]
    ) == kafka_offsets(meta["positions"])


def test_serve_unit_readiness_watchdog_and_clean_stop(deployment: Deployment, notify: NotifySocket) -> None:
    port = 20_000 + int(uuid.uuid4().int % 5_000)
    unit = deployment.unit("ctr-serve@.service", instance=str(port))
    proc = deployment.start(unit, notify)
    try:
        notify.wait_for("READY=1", timeout_s=unit.seconds("TimeoutStartSec"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200  # READY=1 means the port is bound
        notify.wait_for("WATCHDOG=1", timeout_s=15, count=3)
        body = json.dumps({"user_id": "user-1", "items": ["item-1"]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/score", body, method="POST")
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as exc:  # 503 while no model is loaded yet
            assert exc.code == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=5) as resp:
            version = json.loads(resp.read())["version"]
        m = scrape(port)
        assert m[f'ctr_serving_ready{{replica="serve-{port}"}}'] == (version is not None)
        if version is not None:  # the metric names the version /version names
            assert f'ctr_serving_version{{replica="serve-{port}",version="{version}"}}' in m
        assert m["ctr_serving_request_seconds_count"] == 1
        stop_like_systemd(proc, notify, unit)
    finally:
        if proc.poll() is None:
            proc.kill()
