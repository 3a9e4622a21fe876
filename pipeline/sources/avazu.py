"""Avazu's ``train.csv`` (or ``train.gz``) as a replayable event source (impressions, plus a click per
clicked row).

Same :class:`pipeline.core.types.Source` contract as :mod:`pipeline.sources.streams`: exact resume from a
snapshot, event-time clock, unreadable rows become raw events the validator dead-letters.
"""

from __future__ import annotations

import calendar
import csv
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.types import EventKind, RawEvent
from pipeline.sources.batching import _BatchingSource, _key_of, _Read
from pipeline.sources.files import UnreadableLog, open_text
from pipeline.sources.labelled import labelled_events

__all__ = ["AvazuCsvSource", "avazu_hour_to_ms"]


def avazu_hour_to_ms(hour: str) -> int:
    """Epoch ms of the start of an Avazu ``hour`` value (``YYMMDDHH``, UTC).

    >>> avazu_hour_to_ms("14102100")
    1413849600000
    """
    if len(hour) != 8 or not hour.isdigit():
        raise ValueError(f"avazu_hour_to_ms: {hour!r} is not YYMMDDHH")
    yy, mm, dd, hh = (int(hour[i : i + 2]) for i in range(0, 8, 2))
    return calendar.timegm((2000 + yy, mm, dd, hh, 0, 0)) * 1000


_AVAZU_NOT_FEATURES = {"id", "click", "hour", "C14"}
_AVAZU_ANON_DEVICE = "a99f214a"  # the device_id most rows share: the device is unknown


class AvazuCsvSource(_BatchingSource):
    """Avazu ``train.csv`` rows as impressions, plus a click for each ``click == 1`` row.

    Avazu has hour resolution only, so the clock is synthetic: the ``n`` rows of one hour get
    ``ts = hour start + i * span_s / n`` in file order (``start_ms``, when given, moves the first
    hour there). A click comes a seeded lognormal delay later (median ``click_delay_median_s``,
    capped at ``click_delay_max_s``, below the attribution window so labels are kept), and events
    are delivered in ``ts`` order. ``user_id`` is ``device_id``, or ``device_ip-device_model`` for
    the anonymous device; ``item_id`` is the ad (``C14``); the other columns are features (the
    validator pseudonymises ``device_id``/``device_ip``). A malformed row becomes raw bytes for the
    validator to dead-letter. Rows are buffered one hour at a time; resuming re-reads and skips.
    """

    name = "avazu_csv"

    def __init__(
        self,
        path: str | Path,
        start_ms: int | None = None,
        span_s: float = 3_600.0,
        click_delay_median_s: float = 30.0,
        click_delay_max_s: float = 600.0,
        click_delay_sigma: float = 1.0,
        seed: int = 0,
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(batch_size, resume)
        self.path, self.start_ms, self.span_ms = Path(path), start_ms, int(span_s * 1000)
        self.delay_median_ms, self.delay_max_ms = click_delay_median_s * 1000, int(click_delay_max_s * 1000)
        self.delay_sigma, self.seed = click_delay_sigma, seed
        self._pos = {"offset": int(resume["offset"]) if resume else 0}

    def _read(self) -> _Read:
        skip, source = self._pos["offset"], f"avazu:{self.path.name}"
        for seq, (kind, value, ts) in enumerate(itertools.islice(self._events(), skip, None), skip):
            yield RawEvent(kind, value, source, 0, seq, _key_of(value)), ts, seq + 1

    def _events(self) -> Iterator[tuple[EventKind, bytes | dict[str, Any], int | None]]:
        return labelled_events(
            self._rows(), self.seed, self.delay_median_ms, self.delay_sigma, self.delay_max_ms
        )

    def _rows(self) -> Iterator[tuple[dict[str, Any] | bytes, int | None, bool]]:
        shift: int | None = None
        for hour, rows, col in self._hours():
            if not hour:  # a malformed row, delivered when read: no ts to order it by
                yield ",".join(rows[0]).encode(), None, False
                continue
            hour_ms = avazu_hour_to_ms(hour)
            shift = (0 if self.start_ms is None else self.start_ms - hour_ms) if shift is None else shift
            for i, row in enumerate(rows):
                ts = hour_ms + shift + i * self.span_ms // len(rows)
                yield self._impression(row, col, ts), ts, row[col["click"]] == "1"

    def _hours(self) -> Iterator[tuple[str, list[list[str]], dict[str, int]]]:
        """``(hour, rows of that hour, column index)``, or ``("", [bad row], ...)`` for a bad row."""
        with open_text(self.path) as f:
            reader = _rows(csv.reader(f))
            header = next(reader, None) or []
            missing = {"id", "click", "hour", "C14", "device_id", "device_ip", "device_model"} - set(header)
            if missing:
                start = f"it starts {','.join(header[:6])[:120]!r}" if header else "it is empty"
                raise UnreadableLog(
                    f"{self.path} is not an Avazu CSV: its header lacks {', '.join(sorted(missing))} "
                    f"({start}). Avazu's train file starts 'id,click,hour,C1,banner_pos,...'; for "
                    "another log, use --format jsonl with --map"
                )
            col = {name: i for i, name in enumerate(header)}
            hour, group = "", list[list[str]]()
            for row in reader:
                if not _valid_row(row, header, col):
                    yield "", [row], col
                    continue
                if row[col["hour"]] != hour and group:
                    yield hour, group, col
                    group = []
                hour = row[col["hour"]]
                group.append(row)
            if group:
                yield hour, group, col

    @staticmethod
    def _impression(row: list[str], col: dict[str, int], ts: int) -> dict[str, Any]:
        device = row[col["device_id"]]
        user = (
            device if device != _AVAZU_ANON_DEVICE else f"{row[col['device_ip']]}-{row[col['device_model']]}"
        )
        features = {k: row[i] for k, i in col.items() if k not in _AVAZU_NOT_FEATURES}
        features["hour"] = row[col["hour"]][6:]  # hour of day, as the simulator's feature
        return {
            "impression_id": row[col["id"]],
            "ts": ts,
            "user_id": user,
            "item_id": row[col["C14"]],
            "features": features,
        }


def _rows(reader: Iterator[list[str]]) -> Iterator[list[str]]:
    """CSV rows; a row the csv module cannot read (e.g. an oversized field) becomes a marker row."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            row = [f"unreadable CSV row: {exc}"]
        yield row


def _valid_row(row: list[str], header: list[str], col: dict[str, int]) -> bool:
    hour = row[col["hour"]] if len(row) == len(header) else ""
    return len(hour) == 8 and hour.isdigit() and row[col["click"]] in ("0", "1")
