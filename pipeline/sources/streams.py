"""Event sources for replays and the embedded profile: the simulator and JSONL logs (Avazu's CSV:
:mod:`pipeline.sources.avazu`; other public logs: :mod:`pipeline.sources.readers`).

Every source implements :class:`pipeline.core.types.Source`: ``batches()`` yields lists of
:class:`RawEvent` in arrival order, ``snapshot()`` is a JSON-serialisable position of the *next*
event (take it after the previous batch's output is durable), and a source built with
``resume=snapshot`` delivers exactly the events that came after it. ``clock`` is a
:class:`ManualClock` moved to the event time of what has been delivered, so validation and the
joiner run on event time. Sources never raise on bad input: a line or row they cannot read becomes a
raw event that :class:`pipeline.core.validation.Validator` turns into a dead letter with a reason.
A JSONL line may carry ``kafka_key``, the record key it was produced with (default: its user id):
the replay routes it by that key, as Kafka would.
"""

from __future__ import annotations

import codecs
import heapq
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.types import EventKind, RawEvent
from pipeline.sources.batching import _BatchingSource, _key_of, _Read, _ts_of
from pipeline.sources.files import open_binary
from pipeline.sources.jsonl_mapping import KINDS, JsonlMapping, untagged_kind

__all__ = ["JsonlSource", "MergedJsonlSource", "SeededStream", "SimulatorSource"]


class SeededStream(Protocol):
    """A deterministic event stream for a seed: the simulator or a :mod:`pipeline.sources.worlds` world."""

    seed: int

    def stream(self, n_impressions: int) -> Iterator[tuple[EventKind, dict[str, Any]]]: ...


class SimulatorSource(_BatchingSource):
    """An in-process :class:`SeededStream` (the simulator or another world); ``offset`` is the event's
    arrival sequence number.

    Resuming regenerates the (deterministic) stream and skips to the snapshot's offset.
    """

    name = "simulator"

    def __init__(
        self,
        simulator: SeededStream,
        n_impressions: int,
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(batch_size, resume)
        if resume is not None and resume.get("seed") != simulator.seed:
            raise ValueError(f"SimulatorSource: snapshot seed {resume.get('seed')!r} != {simulator.seed}")
        self.simulator, self.n_impressions = simulator, n_impressions
        self._pos = {"seed": simulator.seed, "offset": int(resume["offset"]) if resume else 0}

    def _read(self) -> _Read:
        skip = self._pos["offset"]
        stream = itertools.islice(self.simulator.stream(self.n_impressions), skip, None)
        for seq, (kind, value) in enumerate(stream, skip):
            yield RawEvent(kind, value, "simulator", 0, seq, value["user_id"].encode()), value["ts"], seq + 1

    def _position(self, pos: Any) -> dict[str, Any]:
        return {"seed": self.simulator.seed, "offset": pos}


class JsonlSource(_BatchingSource):
    """Replays JSONL files (one event per line, tagged ``"type"``) in order; resumes by byte offset.

    A tagged line becomes a mapping without its ``"type"``. Any other line stays raw bytes for the
    validator to judge: kind ``kind`` if given (a file of one kind), else ``"conversion"`` if it is
    an object with a ``conversion_id``, ``"click"`` with a ``click_id``, else ``"impression"``. So
    a line that is too long, not JSON or wrongly tagged becomes a dead letter with a reason, and an
    untagged but well-formed event is accepted. ``mapping`` renames tag, tag values and fields first
    (:mod:`pipeline.sources.jsonl_mapping`; a renamed line is passed on as a mapping). ``partition``
    is the file's index in ``paths`` and ``offset`` the line number.
    """

    name = "jsonl"

    def __init__(
        self,
        paths: Sequence[str | Path],
        batch_size: int = 5_000,
        resume: dict[str, Any] | None = None,
        max_line_bytes: int = 65_536,
        *,
        mapping: JsonlMapping | None = None,
        kind: EventKind | None = None,
    ) -> None:
        super().__init__(batch_size, resume)
        self.mapping = None if mapping is None or mapping.is_identity else mapping
        self.kind = kind
        self.paths = [Path(p) for p in paths]
        for p in self.paths:
            if not p.is_file():
                raise ValueError(f"JsonlSource: {p} is not a file")
        self.max_line_bytes = max_line_bytes
        pos = {"file": 0, "byte": 0, "line": 0}
        if resume is not None:
            pos = {k: int(resume[k]) for k in pos}
            if pos["file"] < len(self.paths) and resume.get("path") != self.paths[pos["file"]].name:
                raise ValueError(
                    f"JsonlSource: snapshot is of file {resume.get('path')!r}, "
                    f"paths[{pos['file']}] is {self.paths[pos['file']]}"
                )
        self._pos = self._at(pos["file"], pos["byte"], pos["line"])

    def resumed(self, position: dict[str, Any]) -> JsonlSource:
        """The same source from ``position`` (a snapshot's file, path, byte and line)."""
        resume = {**position, "source": self.name}
        return JsonlSource(
            self.paths, self.batch_size, resume, self.max_line_bytes, mapping=self.mapping, kind=self.kind
        )

    def _at(self, file: int, byte: int, line: int) -> dict[str, Any]:
        path = self.paths[file].name if file < len(self.paths) else ""
        return {"file": file, "path": path, "byte": byte, "line": line}

    def _decode(self, line: bytes) -> tuple[EventKind, bytes | dict[str, Any], Any]:
        """``(kind, value, parsed line or None)``; ts and key are read from the parsed line."""
        if len(line) > self.max_line_bytes:
            return self.kind or "impression", line, None  # not parsed: the validator says "too_large"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return self.kind or "impression", line, None
        if not isinstance(obj, dict):
            return self.kind or "impression", line, None
        if self.mapping is None:  # the canonical schema: no renames
            kind = obj.get("type")
            if kind in KINDS:
                del obj["type"]
                return kind, obj, obj
            return self.kind or untagged_kind(obj), line, obj
        kind, mapped = self.mapping.apply(obj)
        if kind is not None:
            return kind, mapped, mapped
        # untagged (or tagged with a value not mapped): the validator says why, if anything is wrong
        return self.kind or untagged_kind(mapped), mapped, mapped

    def _read(self) -> _Read:
        start = self._pos
        for file in range(start["file"], len(self.paths)):
            path = self.paths[file]
            byte, line_no = (start["byte"], start["line"]) if file == start["file"] else (0, 0)
            with open_binary(path) as f:
                f.seek(byte)
                for line in f:
                    byte += len(line)
                    line_no += 1
                    raw = line.rstrip(b"\r\n")
                    if line_no == 1 and raw.startswith(codecs.BOM_UTF8):  # an export's byte-order mark
                        raw = raw[len(codecs.BOM_UTF8) :]
                    if not raw.strip():
                        continue  # blank lines are not events
                    kind, value, obj = self._decode(raw)
                    event = RawEvent(kind, value, str(path), file, line_no - 1, _key_of(obj, pop=True))
                    yield event, _ts_of(obj), (file, byte, line_no)

    def _position(self, pos: Any) -> dict[str, Any]:
        return self._at(*pos)


class MergedJsonlSource(_BatchingSource):
    """Several :class:`JsonlSource` streams (impressions in one, clicks in another) merged on ``ts``.

    Each part is read in its own order and the heads are merged by event time (ties: the earlier
    part first; a line without a ``ts`` goes with the line before it). The snapshot holds every
    part's position after the last event it delivered, so a resume restarts each part there.
    """

    name = "jsonl-merged"

    def __init__(
        self, parts: Sequence[JsonlSource], batch_size: int = 5_000, resume: dict[str, Any] | None = None
    ) -> None:
        super().__init__(batch_size, resume)
        if resume is not None:
            if len(resume.get("parts", [])) != len(parts):
                raise ValueError(f"MergedJsonlSource: snapshot has {len(resume.get('parts', []))} parts")
            parts = [p.resumed(r) for p, r in zip(parts, resume["parts"], strict=True)]
        self.parts = list(parts)
        self._pos = self._position(tuple((p._pos["file"], p._pos["byte"], p._pos["line"]) for p in parts))

    def _read(self) -> _Read:
        def timed(i: int, part: JsonlSource) -> Iterator[tuple[int, int, RawEvent, int | None, Any]]:
            last = 0
            for event, ts, pos in part._read():
                last = last if ts is None else ts
                yield last, i, event, ts, pos

        cursor = [(p["file"], p["byte"], p["line"]) for p in self._pos["parts"]]
        # (last ts, part) is unique among the heads, so events themselves are never compared
        for _, i, event, ts, pos in heapq.merge(*(timed(i, p) for i, p in enumerate(self.parts))):
            cursor[i] = pos
            yield event, ts, tuple(cursor)

    def _position(self, pos: Any) -> dict[str, Any]:
        return {"parts": [part._at(*p) for part, p in zip(self.parts, pos, strict=True)]}
