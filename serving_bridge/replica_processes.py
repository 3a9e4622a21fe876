"""`ctr serve` replicas as processes, and a watch on their ``GET /version``: the harness that
rollback tests and ``benchmarks/rollback.py`` share (what a fleet of real replicas sees).

:class:`SwitchWatch` polls every replica from its own thread from *before* an action (a UI save, a
``ctr rollback``) and records when each first answers with the target version, so the seconds from
the action to the last replica switching are measured on the replicas themselves.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ReplicaProcesses", "SwitchWatch", "free_port", "served_version", "stop_processes"]


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_version(url: str, timeout_s: float = 2.0) -> str | None:
    """What ``GET <url>/version`` says (None while the replica is not up or has no model)."""
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=timeout_s) as resp:
            version = json.loads(resp.read())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return None if version is None else str(version)


def stop_processes(procs: Sequence[subprocess.Popen[Any]], timeout_s: float = 30) -> None:
    """SIGTERM every process still running, wait for each (``timeout_s``), SIGKILL the stragglers."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclass
class ReplicaProcesses:
    """``n`` ``ctr serve --port P`` processes with ``env`` (model name, tracking URI, Redis URL ...)."""

    env: Mapping[str, str]
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, n: int, env: Mapping[str, str], log_dir: Path) -> ReplicaProcesses:
        fleet = cls(env, log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(n):
            port = free_port()
            with (log_dir / f"serve-{port}.log").open("wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "pipeline.ops.cli", "serve", "--port", str(port)],
                    env={**os.environ, **env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            fleet.procs.append(proc)
            fleet.urls.append(f"http://127.0.0.1:{port}")
        return fleet

    def versions(self) -> dict[str, str | None]:
        return {url: served_version(url) for url in self.urls}

    def wait_until_all(self, version: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every replica serves ``version``; whether they do."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a replica exited: {dead}; logs in {self.log_dir}")
            if all(v == version for v in self.versions().values()):
                return True
            time.sleep(0.2)
        return False

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))

    def stop(self) -> None:
        stop_processes(self.procs)


class SwitchWatch:
    """Calls each probe (name -> a function that returns a version, e.g. a replica's ``/version`` or
    the MLflow alias) from its own thread until it returns ``version``; :meth:`wait` gives, per
    probe, the :func:`time.perf_counter` at which it first did (None if not in time)."""

    def __init__(
        self, probes: Mapping[str, Callable[[], str | None]], version: str, poll_s: float = 0.02
    ) -> None:
        self.version, self.poll_s = str(version), poll_s
        self.seen: dict[str, float | None] = dict.fromkeys(probes)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(name, probe), daemon=True)
            for name, probe in probes.items()
        ]
        for t in self._threads:
            t.start()

    @classmethod
    def replicas(cls, urls: Sequence[str], version: str, **extra: Callable[[], str | None]) -> SwitchWatch:
        """Watch every replica's ``GET /version`` (named by URL), plus ``extra`` probes."""
        probes: dict[str, Callable[[], str | None]] = {u: functools.partial(served_version, u) for u in urls}
        return cls(probes | extra, version)

    def _watch(self, name: str, probe: Callable[[], str | None]) -> None:
        while not self._stop.is_set():
            try:
                found = probe()
            except Exception:  # a probe that fails now (a registry blip) is asked again
                found = None
            if found is not None and str(found) == self.version:
                self.seen[name] = time.perf_counter()
                return
            self._stop.wait(self.poll_s)

    def wait(self, timeout_s: float) -> dict[str, float | None]:
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        return dict(self.seen)

    def seconds_after(self, start: float, timeout_s: float) -> dict[str, float | None]:
        """:meth:`wait`, as seconds after ``start`` (a :func:`time.perf_counter` value)."""
        return {u: None if t is None else round(t - start, 4) for u, t in self.wait(timeout_s).items()}
