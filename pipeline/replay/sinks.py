"""Where dead letters go: a JSONL file in the embedded profile (a Kafka topic in production)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import IO

from pipeline.core.events import DeadLetter

__all__ = ["JsonlDeadLetters"]


class JsonlDeadLetters:
    """Appends each dead letter as one JSON line and counts them by reason."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f: IO[bytes] = path.open("ab")
        self.by_reason: Counter[str] = Counter()

    def write(self, letter: DeadLetter) -> None:
        self._f.write(letter.to_json() + b"\n")
        self.by_reason[letter.reason] += 1

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())
