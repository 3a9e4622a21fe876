"""`ctr serve`: one replica host as an HTTP/JSON service on uvicorn (uvloop + httptools).

The API is :class:`serving_bridge.app.ScoringApp` (Starlette; its models and OpenAPI document in
:mod:`serving_bridge.openapi`); the transport contract (JSON errors from the parser, HTTP/1.0
keep-alive, half-closed bodies, the accept queue answered on stop) in
:mod:`serving_bridge.http_protocol`.

:class:`ReplicaServer` is one process serving one listening socket. With ``serving.workers`` > 1,
:func:`serve_workers` binds the port once and starts that many worker processes (spawned, not
forked: torch and threads do not survive a fork) that all accept on it, so throughput grows with
cores; each worker loads its own models and watches the aliases itself, and hot-swaps as one
process does. The parent is systemd's main process: it says READY once the port is bound (a fresh
deployment has no champion yet; ``GET /readyz`` answers 503 until one is loaded), feeds the
watchdog while every worker lives and ticks, replaces a worker that dies or hangs (its event loop
silent for ``serving.worker_hang_s``: a heartbeat in shared memory), and on SIGTERM passes the signal
on and waits: each worker stops accepting, answers its queue and its in-flight requests, and exits.

The replica watches its aliases by polling MLflow and by a Redis pub/sub message the trainer
publishes after moving the alias (:data:`NOTIFY_CHANNEL`), whichever comes first.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import uvicorn
from kafka.partitioner.default import murmur2

from pipeline.core import logs, systemd
from pipeline.core.config import ServingConfig
from pipeline.core.metrics import MULTIPROC_MARKER
from serving_bridge.app import ScoringApp
from serving_bridge.feature_fallback import FallbackFeatures
from serving_bridge.http_protocol import DrainingServer, JsonErrorsProtocol
from serving_bridge.worker_slot import WorkerSlot

__all__ = [
    "NOTIFY_CHANNEL",
    "ReplicaServer",
    "announce_swap",
    "bind",
    "kafka_partition",
    "listen_for_swaps",
    "serve_workers",
]

log = logging.getLogger(__name__)
NOTIFY_CHANNEL = "ctr:champion-moved"
BACKLOG = 1024  # listen backlog: a small one drops SYNs under a burst (1 s client retries)


class _Notifiable(Protocol):
    def notify(self) -> None: ...


def kafka_partition(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (to find a user's joiner shard)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def announce_swap(redis_url: str, who: str) -> None:
    """Tell every replica that an alias moved (:func:`listen_for_swaps`); a failure is logged: they
    still poll, so a missed push only costs a poll interval."""
    import redis

    try:
        redis.Redis.from_url(redis_url).publish(NOTIFY_CHANNEL, b"1")
    except Exception:
        log.warning("%s: could not announce the alias move on Redis", who, exc_info=True)


def listen_for_swaps(redis_url: str, replica: _Notifiable, stop: threading.Event) -> threading.Thread:
    """Wake ``replica`` whenever the trainer (or an operator) announces an alias move on Redis."""
    import redis

    def run() -> None:
        while not stop.is_set():
            try:
                pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(NOTIFY_CHANNEL)
                while not stop.is_set():
                    if pubsub.get_message(timeout=0.5) is not None:
                        replica.notify()
            except Exception:  # Redis away: polling still works; retry the subscription
                log.warning("swap notifications unavailable; relying on polling", exc_info=True)
                stop.wait(2.0)

    thread = threading.Thread(target=run, name="swap-notify", daemon=True)
    thread.start()
    return thread


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: any free one), bound here so that workers can share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


class ReplicaServer:
    """One process serving ``router`` on ``listener`` (or a new socket on ``host:port``).

    ``notify``: this process is systemd's main process (READY, watchdog, status); a worker of
    :func:`serve_workers` is not.
    """

    def __init__(
        self,
        host: str,
        port: int,
        router: Any,
        cfg: ServingConfig | None = None,
        *,
        features: FallbackFeatures | None = None,
        listener: socket.socket | None = None,
        notify: bool = True,
        slot: WorkerSlot | None = None,
    ) -> None:
        self.app = ScoringApp(router, cfg, features=features, worker=slot.index if slot else 0)
        self.slot = slot  # a worker of serve_workers: its heartbeat and connection count
        self.listener = listener if listener is not None else bind(host, port)
        self.address = self.listener.getsockname()[:2]
        self.notify = notify
        self._status_version: str | None = None
        self._told_ready = False
        self.features = features
        self._warm_connections = (cfg or ServingConfig()).max_in_flight  # one per request admitted
        self._warm: asyncio.Task[bool] | None = None  # opening the feature reads' connections
        self._warmed = features is None
        self._warm_again_at = 0.0
        config = uvicorn.Config(
            self.app,
            http=JsonErrorsProtocol,
            loop="uvloop",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=10,  # an idle keep-alive connection is closed after this
            timeout_graceful_shutdown=25,  # under the unit's TimeoutStopSec=30
            backlog=BACKLOG,
        )
        self.server = DrainingServer(
            config,
            self.listener,
            tick=self._tick,
            on_exit_signal=self._stopping if notify else None,
            balance=slot,
        )
        self.app.open_connections = lambda: len(self.server.server_state.connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.address[1])

    @staticmethod
    def _stopping() -> None:
        systemd.stopping("serve: stopping after in-flight requests")

    def _tick(self) -> None:
        """Every 0.1 s on the event loop: READY once, the watchdog (or the parent's heartbeat), a
        swap reported."""
        if self.slot is not None:
            self.slot.beat()
            self.slot.set_connections(len(self.server.server_state.connections))
        if self.app.worker_states is not None:  # one of several workers: its state for the others
            self.app.worker_states.publish_due()
        if not self._warmed:
            self._warm_features()
        version = self.app.replica.version
        if self.notify:
            if not self._told_ready:
                self._told_ready = True
                host, port = self.address
                systemd.ready(f"serve: listening on {host}:{port}; version {version}")
            systemd.watchdog()
        if version != self._status_version:
            self._status_version = version
            logs.set_context(version=version)
            if self.notify:
                systemd.status(f"serve: serving version {version}")

    def _warm_features(self) -> None:
        """Open the feature reads' connections on this loop, off the request path: once the store
        is open, retried every second while Redis is away (reads meanwhile fall back as usual)."""
        task = self._warm
        if task is not None:
            if not task.done():
                return
            self._warm = None
            failed = task.cancelled() or task.exception() is not None
            if not failed and task.result():
                self._warmed = True
                return
            self._warm_again_at = time.monotonic() + 1.0
        if time.monotonic() >= self._warm_again_at and self.features is not None:
            self._warm = asyncio.get_running_loop().create_task(self.features.awarm(self._warm_connections))

    def serve_until_signal(self) -> None:
        """Serve until SIGTERM/SIGINT; queued and in-flight requests finish before it returns."""
        self.server.run(sockets=[self.listener])

    # -- in a thread (tests, benchmarks) -----------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> ReplicaServer:
        """Serve from a background thread; returns once the server accepts."""
        self._thread = threading.Thread(target=self.serve_until_signal, name="uvicorn", daemon=True)
        self._thread.start()
        waited = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if self.server.started:
                return self
            waited.wait(0.01)
        raise RuntimeError(f"the replica did not start serving on {self.address} within {timeout_s} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """What SIGTERM does: stop accepting, answer the queue and the in-flight requests, exit."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)


def _worker_main(
    worker: Callable[[socket.socket, WorkerSlot], None],
    listener: socket.socket,
    log_setup: logs.LogSetup,
    beats: Any,
    connections: Any,
    index: int,
) -> None:
    logs.restore(log_setup)  # a spawned process starts with logging unconfigured
    worker(listener, WorkerSlot(index, beats, connections))


def serve_workers(
    workers: int,
    listener: socket.socket,
    worker: Callable[[socket.socket, WorkerSlot], None],
    *,
    what: str = "serve",
    hang_s: float = 30.0,
) -> None:
    """Run ``worker(listener, slot)`` in ``workers`` spawned processes until SIGTERM (see the
    module doc). A worker calls ``slot.beat()`` from its event loop (:class:`ReplicaServer` does,
    every 0.1 s); one that has beaten once and then not for ``hang_s`` is hung (a forward or a
    read that never returns, a deadlock): it is killed and replaced, as one that died. The slot
    also carries its connection count, by which the workers balance their accepts
    (:mod:`serving_bridge.worker_slot`).

    ``worker`` must be picklable (a module-level function or a :func:`functools.partial` of one).
    """
    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()
    # prometheus-client's multiprocess mode: the workers' counters and histograms add up in files
    # here, and any worker's /metrics reads them all (a fresh folder per start: no stale counts)
    metrics_dir = tempfile.mkdtemp(prefix=f"ctr-{what}-metrics-")
    # prometheus-client reads both spellings; Feast keeps whatever is set when it is imported
    for var in ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR", MULTIPROC_MARKER):
        os.environ[var] = metrics_dir
    # each worker's last heartbeat (time.monotonic()); 0 until its event loop runs: start-up (its
    # imports, MLflow away) is not a hang
    beats = spawn.Array("d", workers, lock=False)
    connections = spawn.Array("i", workers, lock=False)  # each worker's open connections

    def start(i: int) -> Any:
        beats[i], connections[i] = 0.0, 0
        proc = spawn.Process(
            target=_worker_main,
            args=(worker, listener, logs.snapshot(), beats, connections, i),
            name=f"{what}-worker",
            daemon=False,
        )
        proc.start()
        return proc

    def on_signal(_signum: int, _frame: Any) -> None:
        if not stop.is_set():
            systemd.stopping(f"{what}: stopping {workers} workers after their in-flight requests")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    procs = [start(i) for i in range(workers)]
    host, port = listener.getsockname()[:2]
    systemd.ready(f"{what}: listening on {host}:{port} with {workers} worker processes")
    while not stop.wait(0.2):
        for i, proc in enumerate(procs):
            if stop.is_set():
                break
            silent = time.monotonic() - beats[i]
            if not proc.is_alive():
                log.error(
                    "%s: worker %d (pid %s) exited with %s; starting another",
                    what,
                    i,
                    proc.pid,
                    proc.exitcode,
                )
            elif beats[i] > 0 and silent > hang_s:
                log.error(
                    "%s: worker %d (pid %s) has not ticked for %.0f s (hung); killing it, starting another",
                    what,
                    i,
                    proc.pid,
                    silent,
                )
                proc.kill()
                proc.join()
            else:
                continue
            procs[i] = start(i)
        systemd.watchdog()  # every worker is alive and ticking (or was just replaced)
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            proc.terminate()  # SIGTERM: the worker drains (ReplicaServer.serve_until_signal)
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    listener.close()
    shutil.rmtree(metrics_dir, ignore_errors=True)
