"""Start ``trainer.ranks`` copies of a ``ctr`` command as the ranks of one ``torch.distributed`` group.

What ``torchrun --standalone --nproc-per-node N`` does on one host: one process per rank with
torch's ``env://`` variables (``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``);
when one fails, the others are stopped and the exit status is the failure's. Written here rather
than exec'ing torchrun because of stopping: torchrun's agent exits 1 on SIGTERM whatever its
workers did (it raises a ``SignalException``), so every ``systemctl stop`` and Ctrl-C would read as
a failure, and it signals every rank, where the ranks' protocol wants rank 0 alone to decide when
to stop (it finishes its block with the others, then tells them: ``pipeline/daemons/trainer_ranks.py``).
Here SIGTERM and SIGINT go to rank 0 only, and a clean stop exits 0. torchrun still works to start
ranks by hand or across hosts (``torchrun ... -m pipeline.ops.cli trainer``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["run_ranks"]

_POLL_S = 0.2
_GRACE_S = 30.0  # after a rank failed: how long the others get to exit on SIGTERM before SIGKILL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(ranks: int, argv: list[str]) -> int:
    """Run ``python -m pipeline.ops.cli *argv`` as ``ranks`` ranks; 0 when every rank exited 0,
    else the first failure's status (128 + N for a rank killed by signal N)."""
    base = os.environ | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
    }
    cmd = [sys.executable, "-m", "pipeline.ops.cli", *argv]
    procs = [
        subprocess.Popen(cmd, env=base | {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0"})
        for r in range(ranks)
    ]

    def to_rank0(sig: int, _frame: Any) -> None:
        procs[0].send_signal(sig)  # it finishes its block with the others, then stops them

    signal.signal(signal.SIGTERM, to_rank0)
    signal.signal(signal.SIGINT, to_rank0)
    while True:
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            _stop(procs)
            return 128 - failed if failed < 0 else failed  # killed by a signal: as a shell says it
        if all(c == 0 for c in codes):
            return 0
        time.sleep(_POLL_S)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """A rank failed: the others cannot go on without it (their checkpoint is rank 0's)."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
