"""Atomic checkpoint files: write to a temporary name, fsync, rename. A reader (or a restart after
``kill -9`` at any moment) sees the previous checkpoint or the new one, never half of one.

Temporary names are unique per writer, so two processes sharing a state folder (two joiners on one
host) never rename each other's half-written file; :func:`file_lock` serialises whole set-ups.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["claim_slot", "file_lock", "read_json", "replace_dir", "temp_path", "write_json"]

_SLOTS: list[Any] = []  # the open lock files of claim_slot: held until the process exits


def temp_path(path: Path) -> Path:
    """A hidden sibling of ``path`` that no other writer (process or thread) uses."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim_slot(folder: Path, name: str) -> int:
    """The lowest ``n`` whose lock file ``folder/<name>-<n>.lock`` no other live process holds; this
    process holds it until it exits. A process restarted in the same folder gets its slot back (the
    kernel drops a dead process's locks), two running side by side get different ones."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        f = (folder / f"{name}-{n}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            n += 1
            continue
        _SLOTS.append(f)
        return n


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    text = json.dumps(data, separators=(",", ":"))  # dumps, not dump: only dumps uses the C encoder
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """The checkpoint at ``path``, or None if there is none yet."""
    if not path.exists():
        return None
    return json.loads(path.read_text())


def replace_dir(src: Path, dst: Path) -> None:
    """Move the fully written folder ``src`` to ``dst`` (the old ``dst`` is removed after the swap)."""
    old = dst.with_name(f".{dst.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if dst.exists():
        os.replace(dst, old)  # a crash here leaves `old`: read_dir falls back to it
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)
