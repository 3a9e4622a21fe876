"""``ctr serve`` with ``serving.workers`` > 1 replaces a worker that hangs, not only one that dies.

A worker whose event loop stops (here: SIGSTOP, as a forward or a read that never returns would
stop it) answers nothing while it still lives; the parent sees its heartbeat go silent for
``serving.worker_hang_s``, kills it and starts another, and the port keeps answering.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

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
