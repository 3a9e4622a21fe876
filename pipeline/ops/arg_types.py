"""Argument types of the command line: counts and rates refused before anything runs.

argparse's own ``type=int`` takes ``--train-every 0`` or ``--impressions -5``, and the commands then
ran with the config's default or with nothing, saying so only in their output.

>>> count("100_000"), positive("0.5")
(100000, 0.5)
>>> count("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: 0 must be at least 1
"""

from __future__ import annotations

import argparse
import math

__all__ = ["count", "positive"]


def count(text: str) -> int:
    """A whole number >= 1 (impressions, examples per block, blocks); ``_`` and ``,`` may group digits."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (events per second, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value
