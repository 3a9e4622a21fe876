"""``ctr serve`` with ``serving.workers`` > 1 replaces a worker that hangs, not only one that dies.

A worker whose event loop stops (here: SIGSTOP, as a forward or a read that never returns would
stop it) answers nothing while it still lives; the parent sees its heartbeat go silent for
``serving.worker_hang_s``, kills it and starts another, and the port keeps answering. Before
that, connections opened together are spread over both workers (``serving_bridge.worker_slot``).
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving_bridge.replica_processes import free_port, stop_processes

pytestmark = pytest.mark.integration


def _workers(log: Path) -> set[int]:
    """Pids of the workers whose uvicorn server has started (each says so in the log)."""
    return {int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", log.read_text())}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_hung_worker_is_killed_and_replaced(services: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        **services,
        "CTR_SERVING_WORKERS": "2",
        "CTR_SERVING_WORKER_HANG_S": "3",
        "CTR_REGISTRY_MODEL_NAME": f"hung-worker-{port}",
        "CTR_DAEMON_STATE_DIR": str(tmp_path),
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.ops.cli", "-v", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while len(_workers(log)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        first = _workers(log)
        assert len(first) == 2, log.read_text()[-3000:]
        time.sleep(1)  # both loops tick (every 0.1 s): their heartbeats are set
        _connections_are_spread_over_the_workers(port, sorted(first))
        hung = min(first)
        os.kill(hung, signal.SIGSTOP)
        deadline = time.monotonic() + 60
        while (_alive(hung) or len(_workers(log) - first) < 1) and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text()
        assert not _alive(hung) and f"(pid {hung}) has not ticked" in text, text[-3000:]
        assert len(_workers(log) - first) == 1, text[-3000:]  # its replacement serves
        for _ in range(20):  # the port answers on the live workers
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
                assert resp.status == 200
    finally:
        stop_processes([proc])
    assert proc.returncode == 0, log.read_text()[-3000:]


def _connections_are_spread_over_the_workers(port: int, workers: list[int]) -> None:
    """Eight keep-alive connections waiting together in the accept queue end up four per worker
    (one more or less): left to uvloop, the worker that woke first took all of them."""
    clients = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(8)]
    try:
        for pid in workers:  # for a moment neither accepts: the kernel queues the connections
            os.kill(pid, signal.SIGSTOP)
        try:
            for c in clients:
                c.connect()
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        for c in clients:  # each connection accepted and served
            c.request("GET", "/healthz")
            assert c.getresponse().read()
        counts: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while sum(counts.values()) < 8 and time.monotonic() < deadline:
            time.sleep(0.2)  # each worker publishes its state every second
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            counts = {
                s.labels["worker"]: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "ctr_serving_connections"
            }
        # the scrape's own connection counts too (on the worker that answered it)
        assert set(counts) == {"0", "1"} and sum(counts.values()) >= 8, counts
        assert min(counts.values()) >= 3, counts
    finally:
        for c in clients:
            c.close()
