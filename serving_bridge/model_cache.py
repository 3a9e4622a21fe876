"""Versions prepared for serving off the request path: a helper process per worker, one folder
per version shared by the workers of a ``ctr serve``.

Why: a swap did all its work in the serving worker, on a thread beside the requests: four MLflow
requests, rebuilding the learner with its optimizer, tracing and freezing TorchScript; ~250 ms of
CPU per worker per swap, with the GIL taken from the event loop every few ms (p99 during swaps
101 ms at 200 req/s x 8 connections, ``benchmarks/serving.py``). Now :class:`PreparedModelStore`
(the replica's store in ``ctr serve``) splits a load in two:

- **prepare** (:func:`prepare`): download the version from the registry, trace it
  (``serving.inference``) and write it with ``TorchLearner.save_for_serving`` into
  ``<serving.model_dir>/<model>/<version>-<inference>/``. The worker's helper process does
  it: ~95 ms of its CPU and ~55 ms of the MLflow server's per version, measured here. The workers
  of a ``ctr serve`` share the folder (``serving.model_dir``: by default a fresh one under the temp
  dir, removed at exit; several ``ctr serve`` may share one): the first that needs a version has
  it prepared, the others wait on the folder's lock and find it there (one download and one trace
  per version, not per worker). Registry versions are immutable, so a prepared one stays valid.
- **load**: the worker reads the folder (``TorchLearner.load_for_serving``: ~20 ms; ``torch.jit.load``
  does not hold the GIL) and the replica warms and swaps as before.

The helper is forked by ``ctr serve`` at its start, before the process has threads or connections
(so it inherits the imports, ~4 s of CPU, instead of redoing them), closes what it must not hold
(the worker's end of the pipe, the listener), then warms up by preparing the current champion
once into a folder of its own. It runs at nice 19. That is right in general, but on this 2-vCPU
VM priority did not protect the requests: two nice-19 busy loops took the steady p99 from ~8 to
54 ms (31 ms under SCHED_IDLE), because the two vCPUs share a core's resources. So what counts is
doing less work per swap, which this does. The worker's first load (at start, nothing served yet)
is prepared in the worker itself. A version that fails to prepare raises in the worker with the
helper's reason (the replica counts the load error and stays on its version). A helper that died,
hangs, or has not answered in ``HELPER_PATIENCE_S`` is replaced (spawned: by then the worker has
threads) and the worker prepares that version itself: at nice 19 on a saturated host (requests,
or any other job at normal priority) the helper gets almost no CPU (the service-fault test, beside
two benchmark runs, saw a swap not done after 4.5 minutes), and a swap that waits on it for ever
is worse than one that costs the requests ~250 ms of CPU. The successor is spawned at once and
is asked nothing until it says it is ready (its imports and warm-up done: at nice 19 on a busy host
that alone took longer than the patience, so every later swap waited 10 s and was then prepared in
the worker all the same). The helper exits when its worker does
(its end of the pipe closes). Old folders are removed once
``keep`` newer ones exist: a loaded model lives in the workers' memory, the folder only serves loads.

No library here: the helper is a ``multiprocessing`` process and a pipe; the folder and lock are
what :mod:`pipeline.core.checkpoints` already uses.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipeline.core import logs
from pipeline.core.checkpoints import file_lock
from pipeline.core.config import RegistryConfig

__all__ = ["HELPER_PATIENCE_S", "HelperStarting", "ModelHelper", "PreparedModelStore", "prepare"]

log = logging.getLogger(__name__)

# a helper that has not prepared a version by then (starved of CPU at nice 19, or MLflow hung) is
# replaced and the worker prepares the version itself (~0.1-0.3 s of CPU when the host is free)
HELPER_PATIENCE_S = 10.0
_READY = ("ready",)  # the helper's first message, once its imports and warm-up are done
_WARM_POLL_S = 2.0  # a helper started before the first version asks the registry this often
_HELPER_NICE = 19
_EVICT_AFTER_S = 60.0  # a folder is only removed this long after it was written (no load is that slow)


def prepare(store: Any, version: str, folder: Path, inference: str, device: str | None) -> None:
    """Download ``version`` from ``store`` (an ``MlflowModelStore``), trace it, write it to ``folder``."""
    learner = store.load(version, device=device)
    if inference != "eager":
        learner.use_inference(inference)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    learner.save_for_serving(tmp)
    try:
        os.replace(tmp, folder)  # whole or absent: a reader never sees half a version
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not folder.is_dir():
            raise
        # another preparer got there first (a helper given up on after HELPER_PATIENCE_S finished
        # after all): its folder is whole (renamed the same way) and holds the same version
        shutil.rmtree(tmp, ignore_errors=True)


def _helper_main(
    conn: Connection,
    registry: RegistryConfig,
    tracking_uri: str,
    device: str | None,
    log_setup: logs.LogSetup,
    close: Sequence[int],
) -> None:
    """The helper process: prepare each ``(version, folder, inference)`` its worker sends; answer
    None or the reason it failed. Returns when the worker's end of the pipe closes."""
    for fd in close:  # a forked worker's: its end of the pipe, its listener
        os.close(fd)
    logs.restore(log_setup)
    import torch

    from trainers.registry import MlflowModelStore

    torch.set_num_threads(1)  # it runs beside the requests: one core's idle time at most
    store = _warmed_store(registry, tracking_uri, device, conn)
    try:
        conn.send(_READY)  # asked nothing before this: the worker prepares versions itself until then
        while True:
            version, folder, inference = conn.recv()
            try:
                store = store or MlflowModelStore(registry, tracking_uri)
                prepare(store, version, Path(folder), inference, device)
                answer = None
            except Exception as exc:  # the worker raises it: a load error, counted there
                answer = f"{type(exc).__name__}: {exc}"
            conn.send(answer)
    except (EOFError, OSError):  # the worker closed its end: it exited, or gave up on this helper
        return


def _warmed_store(registry: RegistryConfig, tracking_uri: str, device: str | None, conn: Connection) -> Any:
    """The helper's registry store, its first prepare done: making the store and the first download
    and trace import and set up ~7 s of code here, at start, not at the first swap. It prepares the
    champion into a folder of its own, thrown away. Started before the first version (a fresh
    deployment), it asks the registry for one every ``_WARM_POLL_S``: warmed by nothing, its first
    prepare did that work at nice 19, and on a busy host the worker gave up on it after
    ``HELPER_PATIENCE_S``. None if MLflow is away (the store is made later)."""
    from trainers.registry import MlflowModelStore

    try:
        store = MlflowModelStore(registry, tracking_uri)
        while (version := store.resolve(registry.champion_alias)) is None:
            if conn.poll(_WARM_POLL_S):  # asked nothing before it is ready: the worker has closed its end
                return store
        with tempfile.TemporaryDirectory(prefix="ctr-helper-warm-") as tmp:
            prepare(store, version, Path(tmp) / "warm", "torchscript", device)
    except Exception as exc:  # MLflow away: the first request makes the store
        log.info("serve: the model helper could not warm up (%r); it will at its first version", exc)
        return None
    return store


class HelperStarting(TimeoutError):
    """The helper has not finished its start (imports, warm-up) yet: it is not asked, not waited for."""


class ModelHelper:
    """The helper process of one worker (module doc) and its end of the pipe."""

    def __init__(self, registry: RegistryConfig, tracking_uri: str, device: str | None = None) -> None:
        self.registry, self.tracking_uri, self.device = registry, tracking_uri, device
        self._proc: Any = None
        self._conn: Connection | None = None
        self._ready = False  # its _READY received
        self._lock = threading.Lock()  # one question at a time (the champion and challenger watchers)

    def start(self, method: str = "spawn", *, not_inherited: Sequence[socket.socket] = ()) -> ModelHelper:
        """Start the process: ``fork`` (no imports to redo: what ``ctr serve`` uses, at its start,
        before it has threads or connections a child could inherit half-used; ``not_inherited``:
        sockets the child closes at once, such as the listener) or ``spawn``."""
        ctx: Any = multiprocessing.get_context(method)
        ours, theirs = ctx.Pipe()
        # a forked child holds every descriptor of this process: its copy of our end of the pipe
        # would keep its recv from ever seeing this process exit
        close = [ours.fileno(), *(s.fileno() for s in not_inherited)] if method == "fork" else []
        proc = ctx.Process(
            target=_helper_main,
            args=(theirs, self.registry, self.tracking_uri, self.device, logs.snapshot(), close),
            name="serve-model-helper",
            daemon=True,
        )
        proc.start()
        theirs.close()
        assert proc.pid is not None  # started
        try:  # at once, while it is still starting: all of its work runs at low priority
            os.setpriority(os.PRIO_PROCESS, proc.pid, _HELPER_NICE)
        except OSError:
            log.warning("serve: could not lower the model helper's priority", exc_info=True)
        self._proc, self._conn, self._ready = proc, ours, False
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the helper has finished its start (imports, warm-up), waiting up to ``timeout_s``."""
        with self._lock:
            return self._is_ready(timeout_s)

    def _is_ready(self, timeout_s: float = 0.0) -> bool:
        conn = self._conn
        if not self._ready and conn is not None and conn.poll(timeout_s):
            self._ready = conn.recv() == _READY  # its first message (OSError, EOFError: it died)
        return self._ready

    def prepare(self, version: str, folder: Path, inference: str) -> None:
        """Have the helper prepare ``version`` into ``folder``; raises its reason if it failed
        (RuntimeError), :class:`HelperStarting` at once while it is still starting (a spawned
        one imports ~4 s of code at nice 19 first: on a busy host far longer than the patience),
        or TimeoutError / OSError if it did not answer in ``HELPER_PATIENCE_S`` or died: it is
        then replaced at once (spawned: the worker has threads by now), so that its successor
        starts while the worker prepares this version itself."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._replace()
                raise OSError("the model helper was not running; its successor is starting")
            if not self._is_ready():
                raise HelperStarting(f"the model helper is still starting; not asked for version {version}")
            conn = self._conn  # close() from another thread (shutdown) sets the attribute to None
            assert conn is not None
            try:
                conn.send((version, str(folder), inference))
                if not conn.poll(HELPER_PATIENCE_S):
                    raise TimeoutError(
                        f"the model helper has not prepared version {version} in {HELPER_PATIENCE_S:.0f} s"
                    )
                answer = conn.recv()
            except (OSError, EOFError, TimeoutError):
                self._replace()
                raise
        if answer is not None:
            raise RuntimeError(f"preparing version {version} failed in the model helper: {answer}")

    def _replace(self) -> None:
        """Close this helper and spawn its successor (the worker has threads by now: no fork)."""
        self.close()
        self.start("spawn")

    def kill(self) -> None:
        """SIGKILL the process (what an OOM kill does; tests)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the helper's recv ends: it returns
        if self._proc is not None:
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._proc = self._conn = None
        self._ready = False


@dataclass
class PreparedModelStore:
    """A replica's store: aliases resolved by the registry, versions loaded through the shared
    folder of prepared versions, prepared by ``helper`` (module doc)."""

    registry: Any  # trainers.registry.MlflowModelStore
    root: Path  # <serving.model_dir>/<model name>
    helper: ModelHelper
    inference: str = "torchscript"
    device: str | None = None
    keep: int = 4  # prepared versions kept in the folder
    prepared_here: int = 0  # versions this worker prepared itself (its first load)
    prepared_by_helper: int = 0
    _loads: int = field(default=0, init=False, repr=False)

    def close(self) -> None:
        self.helper.close()

    def resolve(self, alias: str) -> str | None:
        return self.registry.resolve(alias)

    def load(self, version: str) -> Any:
        from trainers.learner import TorchLearner

        folder = self.root / f"{version}-{self.inference}"
        # one lock per folder: a worker preparing this version (wait, then read it), or
        # removing old ones (the folder read here is not removed under it)
        with file_lock(self.root / ".lock"):
            started = time.perf_counter()
            if not folder.is_dir():
                where = "here" if self._loads == 0 else "by the helper"
                if self._loads == 0:  # nothing is served yet: no request to keep the CPU for
                    self._prepare_here(version, folder)
                else:
                    try:
                        self.helper.prepare(str(version), folder, self.inference)
                        self.prepared_by_helper += 1
                    except (OSError, EOFError, TimeoutError) as exc:
                        starting = isinstance(exc, HelperStarting)
                        where = "here, the helper " + ("starting" if starting else "having failed")
                        log.log(
                            logging.INFO if starting else logging.WARNING,
                            "serve: %s; preparing version %s in the worker",
                            exc,
                            version,
                        )
                        if not folder.is_dir():  # unless the helper finished meanwhile after all
                            self._prepare_here(version, folder)
                self._evict(folder)
                log.info(
                    "serve: version %s prepared %s in %.2f s", version, where, time.perf_counter() - started
                )
            loading = time.perf_counter()
            learner = TorchLearner.load_for_serving(folder, device=self.device)
            log.info(
                "serve: version %s loaded in %.3f s (%.2f s with the lock wait)",
                version,
                time.perf_counter() - loading,
                time.perf_counter() - started,
            )
        self._loads += 1
        learner.version = str(version)
        return learner

    def _prepare_here(self, version: str, folder: Path) -> None:
        prepare(self.registry, str(version), folder, self.inference, self.device)
        self.prepared_here += 1

    def _evict(self, newest: Path) -> None:
        """Remove prepared versions beyond the ``keep`` newest, and half-written ones a crash left,
        none of them written in the last minute."""
        now = time.time()
        folders = sorted(
            (p for p in self.root.iterdir() if p.is_dir() and p != newest),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        done = [p for p in folders if ".tmp-" not in p.name]
        for old in done[self.keep - 1 :] + [p for p in folders if ".tmp-" in p.name]:
            if now - old.stat().st_mtime > _EVICT_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
