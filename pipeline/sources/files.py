"""Log files as they are shipped: plain, or compressed with gzip, bzip2 or xz (by suffix).

Real CTR logs come compressed (Avazu's ``train.gz``, Criteo's ``train.txt.gz``, exports in
``.jsonl.gz``): every file reader opens its input here, so each format reads each compression.
The standard library's codecs; their readers seek forward by decompressing, which is what a
source's resume from a byte position needs.

>>> with_compression((".jsonl",))
('.jsonl', '.jsonl.gz', '.jsonl.bz2', '.jsonl.xz')
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["open_binary", "open_text", "with_compression"]

_OPENERS: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def with_compression(suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """``suffixes`` and each of them followed by a compression suffix (file names a folder may hold)."""
    return suffixes + tuple(s + c for s in suffixes for c in _OPENERS)


def open_binary(path: Path) -> IO[bytes]:
    """``path`` for reading bytes, decompressed when its suffix names a compression."""
    opener = _OPENERS.get(path.suffix.lower())
    stream: IO[bytes] = opener(path, "rb") if opener is not None else open(path, "rb")  # noqa: SIM115
    return stream


def open_text(path: Path) -> io.TextIOWrapper:
    """``path`` as UTF-8 text (undecodable bytes replaced; newlines as written, for the csv module)."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace", newline="")
