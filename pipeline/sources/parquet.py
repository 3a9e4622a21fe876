"""Parquet event logs: the JSONL events' columns (``type`` plus each event's fields) in parquet.

:class:`ParquetSource` follows the :class:`pipeline.core.types.Source` contract (batches, event-time
clock, ``snapshot()``/``resume`` by file and row); :func:`write_parquet` writes what it reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.core.types import EventKind, RawEvent
from pipeline.sources.batching import _BatchingSource, _key_of, _Read, _ts_of
from pipeline.sources.files import UnreadableLog
from pipeline.sources.jsonl_mapping import KINDS, JsonlMapping, untagged_kind

__all__ = ["ParquetSource", "write_parquet"]


class ParquetSource(_BatchingSource):
    """Parquet files of events with the JSONL columns (``type`` plus the event's fields).

    ``features``/``dense`` may be maps, structs or JSON strings; null fields are left out, so the
    validator sees exactly what a JSONL line would carry. Without a ``type`` column an event is a
    click when it has a ``click_id``. ``offset`` = (file index, row within it). ``mapping`` renames
    the columns of a log in another vocabulary as it does a JSONL line's fields (``--map``).
    """

    name = "parquet"

    def __init__(
        self,
        paths: Sequence[str | Path],
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
        mapping: JsonlMapping | None = None,
    ) -> None:
        super().__init__(batch_size, resume)
        self.paths = [Path(p) for p in paths]
        self.mapping = mapping
        for p in self.paths:
            if not p.is_file():
                raise ValueError(f"ParquetSource: {p} is not a file")
        self._pos = (
            {"file": int(resume["file"]), "row": int(resume["row"])} if resume else {"file": 0, "row": 0}
        )

    def _read(self) -> _Read:
        start = self._pos
        for k in range(start["file"], len(self.paths)):
            skip = start["row"] if k == start["file"] else 0
            row = 0
            for batch in _record_batches(self.paths[k]):
                for rec in batch.to_pylist():
                    row += 1
                    if row <= skip:
                        continue
                    kind, value = _parquet_event(rec, self.mapping)
                    yield (
                        RawEvent(kind, value, str(self.paths[k]), k, row - 1, _key_of(value)),
                        _ts_of(value),
                        (k, row),
                    )

    def _position(self, pos: Any) -> dict[str, Any]:
        return {"file": pos[0], "row": pos[1]}


def _record_batches(path: Path) -> Iterator[Any]:
    """``path``'s record batches; :class:`UnreadableLog` if it is not Parquet or is damaged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=8_192)
    except pa.ArrowException as exc:  # not Parquet, its footer cut off, a damaged page
        raise UnreadableLog(
            f"{path} cannot be read as Parquet ({exc}): a file cut short or of another format? "
            "Copy it again, or pick the --format it is written in"
        ) from exc


def _parquet_event(
    rec: Mapping[str, Any], mapping: JsonlMapping | None = None
) -> tuple[EventKind, dict[str, Any]]:
    mapped: EventKind | None = None
    if mapping is not None:  # renamed first: the columns below are the schema's names
        mapped, rec = mapping.apply({k: v for k, v in rec.items() if v is not None})
    out: dict[str, Any] = {}
    for key, v in rec.items():
        if v is None or key == "type":
            continue
        if key in ("features", "dense"):
            if isinstance(v, str):
                with contextlib.suppress(ValueError):  # else left a string: the validator says bad_type
                    v = json.loads(v)
            elif isinstance(v, list):  # a parquet map reads back as (key, value) pairs
                v = dict(v)
            if isinstance(v, dict):
                v = {k: x for k, x in v.items() if x is not None}
        out[key] = v
    tag = rec.get("type")
    kind = mapped or next((k for k in KINDS if k == tag), None) or untagged_kind(out)
    return kind, out


def write_parquet(stream: Iterable[tuple[EventKind, Mapping[str, Any]]], path: str | Path) -> int:
    """Write ``(kind, event)`` pairs as a parquet file :class:`ParquetSource` reads; the count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"type": kind, **event} for kind, event in stream]
    schema = pa.schema(
        [
            ("type", pa.string()),
            ("impression_id", pa.string()),
            ("click_id", pa.string()),
            ("conversion_id", pa.string()),
            ("ts", pa.int64()),
            ("user_id", pa.string()),
            ("item_id", pa.string()),
            ("features", pa.map_(pa.string(), pa.string())),
            ("dense", pa.map_(pa.string(), pa.float64())),
            ("model_version", pa.string()),
            ("score", pa.float64()),
            ("value", pa.float64()),
        ]
    )
    cols = {name: [r.get(name) for r in rows] for name in schema.names}
    for name in ("features", "dense"):
        cols[name] = [None if v is None else list(v.items()) for v in cols[name]]
    pq.write_table(pa.table(cols, schema=schema), path)
    return len(rows)
