"""Atomic checkpoint files: write to a temporary name, fsync, rename. A reader (or a restart after
``kill -9`` at any moment) sees the previous checkpoint or the new one, never half of one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["read_json", "replace_dir", "write_json"]


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
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
