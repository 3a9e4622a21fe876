"""Log files as they are shipped: plain, or compressed with gzip, bzip2 or xz (known by their first
bytes; the suffixes name the files a folder may hold).

Real CTR logs come compressed (Avazu's ``train.gz``, Criteo's ``train.txt.gz``, exports in
``.jsonl.gz``): every file reader opens its input here, so each format reads each compression.
The standard library's codecs; their readers seek forward by decompressing, which is what a
source's resume from a byte position needs. Text is UTF-8, a leading byte-order mark dropped (what
Excel and some Windows exports write before the header).

A file a reader cannot go on reading (a compressed stream cut short or damaged, a CSV without the
columns its format needs) raises :class:`UnreadableLog`, which the commands report in one line with
what to do, never as a traceback; a bad *line* or *row* is not that, but a dead letter.

>>> with_compression((".jsonl",))
('.jsonl', '.jsonl.gz', '.jsonl.bz2', '.jsonl.xz')
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["DAMAGED", "UnreadableLog", "open_binary", "open_text", "what_to_do", "with_compression"]

# suffix, first bytes, opener: a compression is known by its first bytes, whatever the file is called
# (Avazu's `train`, renamed); the suffixes name the files a folder may hold
_CODECS: tuple[tuple[str, bytes, Callable[..., Any]], ...] = (
    (".gz", b"\x1f\x8b", gzip.open),
    (".bz2", b"BZh", bz2.open),
    (".xz", b"\xfd7zXZ\x00", lzma.open),
)
# what reading a file raises when its bytes are cut short or damaged (gzip's BadGzipFile and bz2's
# "Invalid data stream" are OSErrors), or when it cannot be read at all (a missing file, permissions)
DAMAGED: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error, lzma.LZMAError)


def what_to_do(exc: BaseException) -> str:
    """The advice for ``exc``, one of :data:`DAMAGED`."""
    cut = isinstance(exc, EOFError | zlib.error | lzma.LZMAError | gzip.BadGzipFile)
    if cut or "Invalid data stream" in str(exc):  # bz2's word for it
        return (
            "a file cut short or damaged? Test it (gzip -t, bzip2 -t or xz -t FILE), copy it again and rerun"
        )
    return "check that the file is there and readable, and rerun"


class UnreadableLog(ValueError):
    """A log file that cannot be read on: its message says which, where, and what to do."""


def with_compression(suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """``suffixes`` and each of them followed by a compression suffix (file names a folder may hold)."""
    return suffixes + tuple(s + suffix for s in suffixes for suffix, _, _ in _CODECS)


_UNREAD: tuple[tuple[bytes, str, str], ...] = (  # magic, name, the command that decompresses it
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"\x04\x22\x4d\x18", "lz4", "lz4 -d"),
)


def open_binary(path: Path) -> IO[bytes]:
    """``path`` for reading bytes, decompressed when its first bytes are gzip's, bzip2's or xz's;
    :class:`UnreadableLog` for a compression the standard library does not read (zstd, zip, lz4)."""
    with open(path, "rb") as f:
        head = f.read(6)
    opener = next((o for _, magic, o in _CODECS if head.startswith(magic)), None)
    for magic, name, tool in _UNREAD:
        if head.startswith(magic):
            raise UnreadableLog(
                f"{path} is compressed with {name}, which the readers do not read: decompress it "
                f"({tool} {path.name}) or compress it with gzip or xz instead"
            )
    stream: IO[bytes] = opener(path, "rb") if opener is not None else open(path, "rb")  # noqa: SIM115
    return stream


def open_text(path: Path) -> io.TextIOWrapper:
    """``path`` as UTF-8 text (undecodable bytes replaced; newlines as written, for the csv module)."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", errors="replace", newline="")
