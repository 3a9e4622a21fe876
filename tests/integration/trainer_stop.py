"""Stopping a ``ctr trainer`` under test once it has trained the stream's last full block.

``--exit-when-idle S`` ends a trainer only after S seconds without input, and S must outlast the
longest silence a test causes (a broker outage, a joiner restarting, a rebalance): tens of seconds
of waiting per run. The tests below know how many full blocks their stream holds, so they wait for
the version of the last one and stop the trainer as systemd does (SIGTERM: it finishes the current
batch, which includes that block's checkpoint and commit) and require a clean exit.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from trainers.registry import MlflowModelStore


def stop_after_block(
    proc: subprocess.Popen[bytes], store: MlflowModelStore, block: int, timeout_s: float = 900
) -> None:
    """Wait until the newest version of ``store`` was trained on block ``block``, then SIGTERM
    ``proc`` and require exit status 0 (its log's tail in the message otherwise)."""
    deadline = time.monotonic() + timeout_s
    while not _trained(store, block):
        if proc.poll() is not None:
            raise AssertionError(f"the trainer exited ({proc.returncode}) before block {block}{_tail(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no version of block {block} after {timeout_s:.0f} s{_tail(proc)}")
        time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    if proc.wait(timeout=300) != 0:
        raise AssertionError(f"the trainer's clean stop exited {proc.returncode}{_tail(proc)}")


def _trained(store: MlflowModelStore, block: int) -> bool:
    versions = store.versions()
    return bool(versions) and int(store.lineage(versions[-1])["block"]) >= block


def _tail(proc: subprocess.Popen[bytes]) -> str:
    log = Path(getattr(proc, "log_path", ""))
    return "; its log ends:\n" + log.read_text(errors="replace")[-3000:] if log.is_file() else ""
