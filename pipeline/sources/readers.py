"""More replay sources for labelled logs: Criteo's TSV and the Open Bandit Dataset's CSV.

All follow :class:`pipeline.sources.avazu.AvazuCsvSource`'s pattern (same :class:`Source` contract:
batches, an event-time clock, ``snapshot()``/``resume``): a log whose rows already carry their
label becomes an impression per row plus a click for each positive row, a seeded lognormal
:class:`ClickDelay` later, delivered in ``ts`` order, so the joiner does real attribution work.
A row that cannot be read becomes raw bytes for the validator to dead-letter (never an exception).
Resuming re-reads the input and skips to the snapshot's ``offset`` (the event sequence number).

- :class:`CriteoTsvSource`: ``label, I1..I13, C1..C26`` tab-separated, no timestamps. The clock is
  synthetic: row ``i`` (counting across files) gets ``ts = start_ms + i * 1000 / rows_per_s``.
  The default 76 rows/s spreads the Kaggle log's 45.8M rows over its 7 days.
- :class:`ObdCsvSource`: the Open Bandit Dataset's ``<policy>/<campaign>/<campaign>.csv`` files,
  each joined with its ``item_context.csv`` and merged on ``timestamp`` into one stream.

Parquet event logs (the JSONL events' columns) are read by :mod:`pipeline.sources.parquet`.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.core.types import EventKind, RawEvent
from pipeline.sources.batching import _BatchingSource, _key_of, _Read
from pipeline.sources.files import UnreadableLog, open_text
from pipeline.sources.labelled import labelled_events

__all__ = [
    "CRITEO_START_MS",
    "ClickDelay",
    "CriteoTsvSource",
    "ObdCsvSource",
    "obd_logs",
]

CRITEO_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: Criteo's log carries no dates at all
_Row = tuple[dict[str, Any] | bytes, int | None, bool]  # impression (or a bad row's bytes), ts, clicked


@dataclass(frozen=True)
class ClickDelay:
    """Lognormal delay from an impression to its click: median, shape, cap (seconds)."""

    median_s: float = 30.0
    sigma: float = 1.0
    max_s: float = 600.0  # keep it under the attribution window, or positives turn into negatives


class _LabelledRows(_BatchingSource):
    """Turns ``(impression, ts, clicked)`` rows into impression and click events in ``ts`` order."""

    def __init__(self, delay: ClickDelay, seed: int, batch_size: int, resume: dict[str, Any] | None) -> None:
        super().__init__(batch_size, resume)
        if delay.median_s <= 0 or delay.max_s <= 0 or delay.sigma < 0:
            raise ValueError(f"{type(self).__name__}: invalid click delay {delay}")
        self.delay, self.seed = delay, seed
        self._pos = {"offset": int(resume["offset"]) if resume else 0}

    def _rows(self) -> Iterator[_Row]:
        raise NotImplementedError

    def _read(self) -> _Read:
        skip = self._pos["offset"]
        for seq, (kind, value, ts) in enumerate(itertools.islice(self._events(), skip, None), skip):
            yield RawEvent(kind, value, self.name, 0, seq, _key_of(value)), ts, seq + 1

    def _events(self) -> Iterator[tuple[EventKind, dict[str, Any] | bytes, int | None]]:
        d = self.delay
        return labelled_events(self._rows(), self.seed, d.median_s * 1000, d.sigma, round(d.max_s * 1000))


class CriteoTsvSource(_LabelledRows):
    """Criteo display-ads rows (``label, I1..I13, C1..C26``; compressed files decompressed) as events.

    ``I*`` become dense inputs and ``C*`` categorical features (empty values are left out: the
    encoder's ``<missing>`` token). Criteo has no user or ad column: ``user_field``/``item_field``
    name a ``C*`` column to use as one, else every row has user/item ``"anon"``.
    """

    name = "criteo_tsv"

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        start_ms: int = CRITEO_START_MS,
        rows_per_s: float = 76.0,
        user_field: str = "",
        item_field: str = "",
        delay: ClickDelay | None = None,
        seed: int = 0,
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(delay or ClickDelay(), seed, batch_size, resume)
        self.paths = [Path(p) for p in paths]
        if rows_per_s <= 0:
            raise ValueError(f"CriteoTsvSource: rows_per_s must be > 0, got {rows_per_s}")
        for f in (user_field, item_field):
            if f and f not in _CRITEO_CATS:
                raise ValueError(f"CriteoTsvSource: {f!r} is not a categorical column C1..C26")
        self.start_ms, self.step_ms = start_ms, 1000.0 / rows_per_s
        self.user_field, self.item_field = user_field, item_field

    def _rows(self) -> Iterator[_Row]:
        i = 0
        for path in self.paths:
            with open_text(path) as f:
                for line in f:
                    line = line.rstrip("\r\n")
                    if not line:
                        continue
                    imp = self._impression(line.split("\t"), i)
                    if imp is None:
                        yield line.encode(), None, False
                        continue
                    yield imp, imp["ts"], line[0] == "1"
                    i += 1

    def _impression(self, cols: list[str], i: int) -> dict[str, Any] | None:
        if len(cols) != 40 or cols[0] not in ("0", "1"):
            return None
        dense: dict[str, float] = {}
        for name, v in zip(_CRITEO_INTS, cols[1:14], strict=True):
            if v:
                try:
                    dense[name] = int(v)
                except ValueError:
                    return None
        features = {name: v for name, v in zip(_CRITEO_CATS, cols[14:], strict=True) if v}
        return {
            "impression_id": f"criteo-{i}",
            "ts": self.start_ms + int(i * self.step_ms),
            "user_id": features.get(self.user_field, "anon") if self.user_field else "anon",
            "item_id": features.get(self.item_field, "anon") if self.item_field else "anon",
            "features": features,
            "dense": dense,
        }


_CRITEO_INTS = tuple(f"I{k}" for k in range(1, 14))
_CRITEO_CATS = tuple(f"C{k}" for k in range(1, 27))
_OBD_USER = tuple(f"user_feature_{k}" for k in range(4))


def obd_logs(root: str | Path) -> list[tuple[str, str, Path]]:
    """``(policy, campaign, csv)`` of every ``<policy>/<campaign>/<campaign>.csv`` under ``root``
    that has an ``item_context.csv`` beside it, sorted."""
    base = Path(root)
    found = [
        (p.parent.parent.name, p.parent.name, p)
        for p in sorted(base.glob("**/*.csv"))
        if p.stem == p.parent.name and (p.parent / "item_context.csv").is_file()
    ]
    if not found:
        raise ValueError(
            f"ObdCsvSource: no <policy>/<campaign>/<campaign>.csv with item_context.csv under {base}"
        )
    return found


class ObdCsvSource(_LabelledRows):
    """Open Bandit Dataset logs (every policy and campaign under ``root``), merged on ``timestamp``.

    Per row: ``user_id`` = a hash of the four hashed ``user_feature_*`` values joined (OBD has no
    user id; those features are the user); ``item_id`` = ``<campaign>-<item_id>``; categorical
    features: ``position``, ``policy``, ``campaign``, the user features and ``item_feature_1..3``;
    dense: ``item_feature_0`` and ``affinity`` (the row's ``user-item_affinity_<item_id>``). The
    logging ``propensity_score`` is not a feature. Equal timestamps keep file order.
    """

    name = "obd_csv"

    def __init__(
        self,
        root: str | Path,
        *,
        delay: ClickDelay | None = None,
        seed: int = 0,
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(delay or ClickDelay(), seed, batch_size, resume)
        self.logs = obd_logs(root)

    def _rows(self) -> Iterator[_Row]:
        streams = [self._file(k, *log) for k, log in enumerate(self.logs)]
        for _, _, _, row in heapq.merge(*streams, key=lambda r: r[:3]):
            yield row

    def _file(self, k: int, policy: str, campaign: str, path: Path) -> Iterator[tuple[int, int, int, _Row]]:
        items = _item_context(path.parent / "item_context.csv")
        last_ts = 0
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
            reader = csv.reader(f)
            header = next(reader, None) or []
            col = {name: i for i, name in enumerate(header)}
            missing = {"timestamp", "item_id", "position", "click"} - set(col)
            if missing:
                raise UnreadableLog(
                    f"{path} is not an Open Bandit log: its header lacks {', '.join(sorted(missing))} "
                    "(OBD's <policy>/<campaign>/<campaign>.csv start ',timestamp,item_id,position,click,...')"
                )
            for n, cols in enumerate(reader):
                imp = (
                    _obd_impression(cols, col, items, policy, campaign) if len(cols) == len(header) else None
                )
                if imp is None:  # ordered just after the file's previous good row
                    yield last_ts, k, n, (",".join(cols).encode(), None, False)
                    continue
                last_ts = imp["ts"]
                yield last_ts, k, n, (imp, last_ts, cols[col["click"]] == "1")


def _item_context(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return {row["item_id"]: row for row in csv.DictReader(f)}


def _obd_impression(
    cols: list[str], col: dict[str, int], items: dict[str, dict[str, str]], policy: str, campaign: str
) -> dict[str, Any] | None:
    try:
        ts = round(datetime.fromisoformat(cols[col["timestamp"]]).timestamp() * 1000)
        item = cols[col["item_id"]]
        ctx = items[item]
        affinity = float(cols[col[f"user-item_affinity_{item}"]])
        dense = {"item_feature_0": float(ctx["item_feature_0"]), "affinity": affinity}
        if cols[col["click"]] not in ("0", "1"):
            return None
        user = [cols[col[name]] for name in _OBD_USER]
    except (KeyError, ValueError):
        return None
    features = {"position": cols[col["position"]], "policy": policy, "campaign": campaign}
    features |= dict(zip(_OBD_USER, user, strict=True))
    features |= {f"item_feature_{j}": ctx[f"item_feature_{j}"] for j in (1, 2, 3)}
    digest = hashlib.blake2b("|".join(user).encode(), digest_size=8).hexdigest()
    return {
        "impression_id": f"obd-{policy}-{campaign}-{cols[0]}",
        "ts": ts,
        "user_id": f"obd-{digest}",
        "item_id": f"{campaign}-{item}",
        "features": features,
        "dense": dense,
    }
