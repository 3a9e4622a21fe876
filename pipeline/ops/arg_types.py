"""Argument types of the command line: counts, rates, ports and output paths refused before anything
runs (an output folder found unwritable after a long replay would lose it).

argparse's own ``type=int`` takes ``--train-every 0`` or ``--impressions -5``, and the commands then
ran with the config's default or with nothing, saying so only in their output.

>>> count("100_000"), positive("0.5"), ports("8081, 8082")
(100000, 0.5, (8081, 8082))
>>> count("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 0 must be at least 1
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["count", "out_problem", "port", "ports", "positive"]

T = TypeVar("T")


def _parsed(text: str, parse: Callable[[str], T], noun: str) -> T:
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def count(text: str) -> int:
    """A whole number >= 1 (impressions, examples per block, blocks); ``_`` and ``,`` may group digits."""
    value = _parsed(text.replace("_", "").replace(",", ""), int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (events per second, seconds)."""
    value = _parsed(text, float, "a number")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def port(text: str) -> int:
    """A TCP port, 1-65535."""
    value = _parsed(text, int, "a port number")
    if not 1 <= value <= 65_535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1-65535)")
    return value


def ports(text: str) -> tuple[int, ...]:
    """Comma-separated TCP ports, each once."""
    out = tuple(port(p.strip()) for p in text.split(",") if p.strip())
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{text!r} names a port twice")
    return out


def out_problem(command: str, out: Path | None) -> str | None:
    """Why ``command`` cannot write its ``--out`` (a file for ``simulate``, else a folder, created
    here), or None. Checked before the command runs."""
    if out is None or command not in ("simulate", "demo", "backtest"):  # `ctr replay` only says where to go
        return None
    folder = out.parent if command == "simulate" else out
    try:
        if command == "simulate" and out.is_dir():
            raise IsADirectoryError(21, "a folder, not a file")
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        return f"--out {out}: {exc.strerror or exc}: pick a path you can write to"
    return None
