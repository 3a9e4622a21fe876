"""``promtool check metrics`` (Prometheus's own linter) on every daemon's and replica's ``/metrics``.

The joiner's and the trainer's registries are filled from small doubles of their daemons' state
and served by :func:`pipeline.core.metrics.serve_metrics`, as the daemons serve them; the replica
is a real ``ReplicaServer`` after a few requests, and a real ``ctr serve`` with two workers
(prometheus-client's multiprocess mode). promtool comes from ``deploy/promtool.sh`` (``make test``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.core.config import ServingConfig
from pipeline.core.metrics import Registry, serve_metrics
from pipeline.daemons.joiner_metrics import JoinerMetrics
from pipeline.daemons.trainer_metrics import declare, record_block
from serving_bridge.replica_processes import free_port, stop_processes
from tests.test_serving_api import GOOD, ConstantModel, DictStore, serve

pytestmark = pytest.mark.integration


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run ./deploy/promtool.sh (make test does)"
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    problems = (done.stdout + done.stderr).decode()
    assert done.returncode == 0 and not problems.strip(), f"promtool check metrics:\n{problems}\n---\n{text}"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def served(registry: Registry) -> str:
    server = serve_metrics(registry, "127.0.0.1", 0)
    try:
        return scrape(f"http://127.0.0.1:{server.server_address[1]}/metrics")
    finally:
        server.shutdown()


def test_the_joiners_metrics_pass_promtool() -> None:
    daemon = SimpleNamespace(
        counters={"events": 10, "examples": 7, "checkpoints": 2},
        outages={"kafka": 1},
        dead_reasons={"bad_json": 3},
        tasks={},
    )
    metrics = JoinerMetrics(daemon)
    metrics.lag = {"imps:0": 4, "clicks:1": 0}
    text = served(metrics.registry)
    assert "ctr_joiner_checkpoint_seconds_count 0.0" in text  # declared at start, before any checkpoint
    assert 'ctr_joiner_checkpoint_phase_seconds_total{phase="state"} 0.0' in text
    promtool_check(text)


def test_the_trainers_metrics_pass_promtool() -> None:
    registry = declare(Registry())
    assert "ctr_trainer_block_train_seconds_count 0.0" in served(registry)  # exists before any block
    report: Any = SimpleNamespace(
        decision=SimpleNamespace(accepted=False, kind="holdout"),
        train_seconds=3.2,
        examples_per_s=5_000.0,
        event_time_max=1_767_225_600_000,
        online={"auc": 0.71, "logloss": 0.4},
    )
    record_block(registry, report)
    promtool_check(served(registry))


def test_a_replicas_metrics_pass_promtool() -> None:
    store = DictStore({"3": ConstantModel(0.25)}, {"champion": "3"})
    with serve(store, ServingConfig(max_in_flight=4)) as (client, _):
        assert "ctr_serving_request_seconds_count 0.0" in client.request("GET", "/metrics")[2]
        for body in (GOOD, {"user_id": 1}, b"{"):
            client.score(body)
        promtool_check(client.request("GET", "/metrics")[2])


def test_a_multi_worker_ctr_serve_adds_up_its_workers_and_passes_promtool(
    services: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        **services,
        "CTR_SERVING_WORKERS": "2",
        "CTR_REGISTRY_MODEL_NAME": f"promtool-{port}",
        "CTR_DAEMON_STATE_DIR": str(tmp_path),
    }
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ops.cli", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                scrape(f"{url}/healthz")
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.2)
        for _ in range(20):  # no model: 503s, answered by both workers
            request = urllib.request.Request(f"{url}/score", data=b'{"user_id": "u", "items": ["a"]}')
            try:
                urllib.request.urlopen(request, timeout=10)
            except urllib.error.HTTPError as exc:
                assert exc.code == 503
        text = scrape(f"{url}/metrics")
        assert 'ctr_serving_requests_total{code="503"} 20.0' in text  # every worker's, added up
        promtool_check(text)
        # the state each worker reads at scrape time, both workers' in any scrape, by worker label
        while time.monotonic() < deadline and not all(
            f'ctr_serving_ready{{replica="serve-{port}",worker="{w}"}} 0.0' in text for w in "01"
        ):
            time.sleep(0.2)
            text = scrape(f"{url}/metrics")
        for w in "01":
            assert f'ctr_serving_ready{{replica="serve-{port}",worker="{w}"}} 0.0' in text, text
        assert text.count("# TYPE ctr_serving_ready gauge") == 1
        promtool_check(text)
    finally:
        stop_processes([proc])
        log.close()
    assert proc.returncode == 0
