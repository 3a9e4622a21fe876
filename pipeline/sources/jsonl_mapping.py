"""Read-time renames for JSONL logs in another vocabulary: ``--map canonical=raw``.

A log tagged ``"event_type": "imp"`` with ``"uid"`` and ``"timestamp"`` is the canonical schema
(:mod:`pipeline.core.events`) under other names. A :class:`JsonlMapping` renames each line as it is read,
before validation, so every later stage sees the canonical schema. Renames only: a line that still
has a field outside the schema is rejected by the validator as before (``unknown_field``), and so is
a field whose new name is already taken (``uid`` beside a ``user_id``) keeps its raw name.

Pairs are ``canonical=raw``; the canonical side is one of

- ``type``: the name of the type tag (``type=event_type``); ``"type"`` itself is always a tag too;
- ``impression`` / ``click``: a value of the tag (``impression=imp``); the canonical values always
  count, a pair may repeat (``--map impression=imp --map impression=view``);
- a field of the schema (``user_id=uid``, ``ts=timestamp``), for both kinds.

>>> m = JsonlMapping.parse(["type=event_type", "impression=imp", "user_id=uid"])
>>> m.apply({"event_type": "imp", "uid": "alice", "impression_id": "i1"})
('impression', {'user_id': 'alice', 'impression_id': 'i1'})
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pipeline.core.config import JsonlConfig
from pipeline.core.events import Click, Conversion, Impression
from pipeline.core.types import EventKind

__all__ = ["FIELDS", "KINDS", "TAG", "JsonlMapping", "untagged_kind", "write_jsonl"]

TAG = "type"  # the canonical name of the type tag of a JSONL line
KINDS: tuple[EventKind, ...] = ("impression", "click", "conversion")
# The schema's field names, from the event classes themselves (one definition of the schema).
FIELDS = tuple(
    dict.fromkeys(f.name for cls in (Impression, Click, Conversion) for f in msgspec.structs.fields(cls))
)


def untagged_kind(obj: Mapping[str, Any]) -> EventKind:
    """The kind of an event without a type tag, by its id field.

    >>> untagged_kind({"conversion_id": "v1"}), untagged_kind({"click_id": "c1"}), untagged_kind({})
    ('conversion', 'click', 'impression')
    """
    if "conversion_id" in obj:
        return "conversion"
    return "click" if "click_id" in obj else "impression"


@dataclass(frozen=True)
class JsonlMapping:
    """Raw name -> canonical name for the tag and fields, raw tag value -> kind."""

    tags: tuple[str, ...] = (TAG,)  # names a line's type tag may have, in the order tried
    kinds: Mapping[str, EventKind] = field(default_factory=lambda: {k: k for k in KINDS})
    fields: Mapping[str, str] = field(default_factory=dict)  # raw field name -> canonical

    @property
    def is_identity(self) -> bool:
        """True when nothing is renamed (the canonical schema: the reader's fast path)."""
        return self.tags == (TAG,) and not self.fields and dict(self.kinds) == {k: k for k in KINDS}

    @staticmethod
    def parse(pairs: Iterable[str]) -> JsonlMapping:
        """From ``canonical=raw`` strings (``--map``, ``jsonl.map``); a bad pair raises ValueError."""
        items = []
        for pair in pairs:
            canonical, sep, raw = (s.strip() for s in pair.partition("="))
            if not sep or not canonical or not raw:
                raise ValueError(f"--map {pair!r}: expected canonical=raw, e.g. user_id=uid")
            items.append((canonical, raw))
        return JsonlMapping.from_items(items)

    @staticmethod
    def from_config(cfg: JsonlConfig, pairs: Iterable[str] = ()) -> JsonlMapping:
        """``cfg.map_file``'s pairs, then ``cfg.map``, then ``pairs`` (a later pair wins a raw name)."""
        return JsonlMapping.parse(
            [*(JsonlMapping.load(cfg.map_file) if cfg.map_file else []), *cfg.map, *pairs]
        )

    @staticmethod
    def load(path: str | Path) -> list[str]:
        """``canonical=raw`` pairs from a JSON object file: ``{"type": "event_type", "impression":
        ["imp", "view"], "user_id": "uid"}`` (a list gives several raw names)."""
        try:
            obj = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--map-file {path}: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"--map-file {path}: expected a JSON object of canonical: raw names")
        pairs = []
        for canonical, raws in obj.items():
            for raw in raws if isinstance(raws, list) else [raws]:
                if not isinstance(raw, str):
                    raise ValueError(f"--map-file {path}: {canonical!r} maps to {raw!r}, not a string")
                pairs.append(f"{canonical}={raw}")
        return pairs

    @staticmethod
    def from_items(items: Iterable[tuple[str, str]]) -> JsonlMapping:
        tags: list[str] = [TAG]
        kinds: dict[str, EventKind] = {k: k for k in KINDS}
        fields: dict[str, str] = {}
        for canonical, raw in items:
            if canonical == TAG:
                tags.insert(len(tags) - 1, raw)  # a named tag is tried before the canonical one
            elif canonical in KINDS:
                kinds[raw] = next(k for k in KINDS if k == canonical)
            elif canonical in FIELDS:
                fields[raw] = canonical
            else:
                known = ", ".join((TAG, *KINDS, *FIELDS))
                raise ValueError(
                    f"--map {canonical}={raw}: unknown canonical name {canonical!r}; known: {known}"
                )
        return JsonlMapping(tuple(dict.fromkeys(tags)), kinds, fields)

    def tag_of(self, obj: Mapping[str, Any]) -> str | None:
        """The name of ``obj``'s type tag, or None if it has none."""
        for tag in self.tags:
            if tag in obj:
                return tag
        return None

    def apply(self, obj: dict[str, Any]) -> tuple[EventKind | None, dict[str, Any]]:
        """``(kind, renamed obj without its tag)``; kind None: no tag, or a value not mapped (the
        tag is then kept, for the validator to reject the line with ``unknown_field``)."""
        tag = self.tag_of(obj)
        kind = self.kinds.get(obj[tag]) if tag is not None and isinstance(obj[tag], str) else None
        drop = tag if kind is not None else None  # an unmapped tag stays, for the validator
        if not self.fields:
            return kind, obj if drop is None else {k: v for k, v in obj.items() if k != drop}
        renamed: dict[str, Any] = {}
        fields = self.fields
        for k, v in obj.items():
            if k == drop:
                continue
            name = fields.get(k, k)
            if name != k and (name in obj or name in renamed):
                name = k  # it would overwrite a field present: left for the validator to reject
            renamed[name] = v
        return kind, renamed


def write_jsonl(stream: Iterable[tuple[EventKind, Mapping[str, Any]]], path: str | Path) -> int:
    """Write ``(kind, event)`` pairs one JSON object per line, tagged ``"type"``; returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for kind, event in stream:
            f.write(json.dumps({"type": kind, **event}, separators=(",", ":")))
            f.write("\n")
            n += 1
    return n
