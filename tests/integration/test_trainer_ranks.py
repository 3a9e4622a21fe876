"""`ctr trainer` on two ranks (``trainer.ranks``) over real Kafka and MLflow: how it stops and fails.

What two ranks learn is checked against one process elsewhere (tests/test_sharding.py, the
one-engine parity test, the rollback test); here, the launcher (pipeline/ops/ranks.py): SIGTERM
reaches rank 0, which stops the other rank and all exit 0 (a `systemctl stop` is not a failure);
a rank that dies stops the other and the command fails, so systemd restarts the pair.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest


def _start(
    services: dict[str, str], topic: Callable[..., str], scope: object, tmp: Path
) -> tuple[subprocess.Popen[str], int]:
    port = 19_000 + uuid.uuid4().int % 2_000
    env = {
        **os.environ,
        "CTR_KAFKA_EXAMPLES_TOPIC": topic(partitions=1),
        "CTR_KAFKA_DEAD_LETTER_TOPIC": topic(partitions=1),
        "CTR_KAFKA_PARTITIONS": "1",
        "CTR_KAFKA_GROUP_ID_PREFIX": f"ranks-{uuid.uuid4().hex[:10]}",
        "CTR_DAEMON_STATE_DIR": str(tmp / "state"),
        "CTR_DAEMON_TRAINER_METRICS_PORT": str(port),
        "CTR_REGISTRY_MODEL_NAME": scope.model_name,  # type: ignore[attr-defined]
        "CTR_REGISTRY_EXPERIMENT": scope.experiment_name,  # type: ignore[attr-defined]
        "CTR_TRAINER_HASH_BUCKETS": str(1 << 14),
        "CTR_TRAINER_DEVICE": "cpu",
        "CTR_TRAINER_THREADS": "1",
        "CTR_TRAINER_RANKS": "2",
    }
    log = (tmp / "trainer.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ops.cli", "trainer"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    return proc, port


def _ranks(proc: subprocess.Popen[str]) -> list[int]:
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def _wait_ready(proc: subprocess.Popen[str], port: int, tmp: Path) -> list[int]:
    """Rank 0 serves its metrics once both ranks resumed (its last step before consuming)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "trainer.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                ranks = _ranks(proc)
                assert len(ranks) == 2
                return ranks
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the ranks never became ready: " + (tmp / "trainer.log").read_text()[-3000:])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped


def test_sigterm_stops_both_ranks_cleanly(services, kafka_topic, mlflow_scope, tmp_path: Path) -> None:
    proc, port = _start(services, kafka_topic, mlflow_scope, tmp_path)
    ranks = _wait_ready(proc, port, tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    assert json.loads(out.splitlines()[-1]) == {
        "examples": 0,
        "duplicates": 0,
        "dead_letters": 0,
        "blocks": 0,
    }
    assert len(out.splitlines()) == 1  # rank 0 prints the counts, the other rank nothing
    assert all(_gone(pid) for pid in ranks)


@pytest.mark.faults
def test_a_rank_killed_stops_the_other_and_the_command_fails(
    services, kafka_topic, mlflow_scope, tmp_path: Path, fault_report
) -> None:
    proc, port = _start(services, kafka_topic, mlflow_scope, tmp_path)
    rank0, rank1 = _wait_ready(proc, port, tmp_path)
    os.kill(rank1, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL  # the killed rank's status: systemd restarts the unit
    assert _gone(rank0)
    fault_report(
        "SIGKILL one of two trainer ranks", 1, 1, 0, 0, "the other rank stopped, exit status non-zero"
    )
