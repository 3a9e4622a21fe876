"""Did a replay read its input at all? Dead letters by reason, an example line and what to change.

A log in another vocabulary (tagged ``"event_type"``, ``"uid"`` for ``user_id``) is rejected line by
line: the run "succeeds" with no examples. :func:`diagnose` turns the dead-letter counts and the
first dead letters into a verdict: more than :data:`FAIL_SHARE` of the events dead fails the run
(``ctr backtest`` / ``ctr demo --source`` exit :data:`EXIT_MOSTLY_DEAD`), and the keys of the first
rejected lines suggest the ``--map`` pairs (:mod:`pipeline.sources.jsonl_mapping`) that would read them.
Many events refused for their time suggest a log that is not in event-time order (a replay reads it
in file order, as Kafka delivers it). A run that did not fail prints its specific hints as notes
(:attr:`Diagnosis.notes`) when more than :data:`NOTE_SHARE` of its events became dead letters.

>>> d = diagnose(10, {"unknown_field": 10}, [{"reason": "unknown_field", "detail": "unknown field "
...     "'event_type'", "raw": '{"event_type": "imp", "impression_id": "i1", "uid": "a"}'}])
>>> d.failed, d.suggested
(True, ['type=event_type', 'impression=imp', 'user_id=uid'])
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.sources.jsonl_mapping import FIELDS, KINDS, JsonlMapping

__all__ = ["EXIT_MOSTLY_DEAD", "FAIL_SHARE", "NOTE_SHARE", "Diagnosis", "diagnose", "read_dead_letters"]

FAIL_SHARE = 0.5  # a run with more dead letters than this share of its events failed
EXIT_MOSTLY_DEAD = 3  # exit status of such a run (2 is a usage error)
NOTE_SHARE = 0.01  # a run that did not fail still prints its hints above this share
_TIME_REASONS = ("ts_in_future", "ts_too_old")  # refused against the events around them
_DISORDER_MIN, _DISORDER_SHARE = 10, 0.01  # at least this many of them, over this share: the order is suspect
_SAMPLES = 50  # dead letters read from the start of the file to guess the mapping
_PER_KIND = 5  # ... and at least this many of each kind among the first _SCAN
_SCAN = 20_000
_EXAMPLE_CHARS = 200  # prefix of the example line printed (dead letters keep 1,024 bytes)
# Names a type tag often has elsewhere, and common names of the schema's fields (lower case, no "_").
_TAG_NAMES = ("eventtype", "kind", "event", "type", "eventname", "action", "recordtype")
_SYNONYMS = {
    **{f.replace("_", ""): f for f in FIELDS},
    **dict.fromkeys(("uid", "user", "userkey", "visitorid"), "user_id"),
    **dict.fromkeys(("timestamp", "time", "eventtime", "tsms", "timestampms", "timems"), "ts"),
    **dict.fromkeys(("item", "ad", "adid", "itemkey", "creativeid", "offerid"), "item_id"),
    **dict.fromkeys(("impid", "imp", "impressionkey", "requestid"), "impression_id"),
    **dict.fromkeys(("clickkey", "clkid", "clk"), "click_id"),
    **dict.fromkeys(("feats", "attributes"), "features"),
    **dict.fromkeys(("version", "modelid"), "model_version"),
    **dict.fromkeys(("pctr", "prediction", "probability"), "score"),
}
_KEY = re.compile(r'"([^"\\]{1,64})"\s*:')
_UNREAD = ("too_large", "bad_encoding", "bad_json", "not_an_object")  # no keys to learn from
# The row formats' readers pass a row they cannot read on as its text, which validation then refuses as
# bad_json: the hint is the layout the reader wanted (by the dead letter's source, the reader's name).
_ROW_LAYOUTS = {  # source prefix: (the layout, its separator)
    "criteo": (
        "Criteo rows are a 0/1 label, 13 integers and 26 categorical values, tab-separated (40 fields; "
        "Criteo's test files have no label, so they cannot be replayed)",
        "\t",
    ),
    "avazu": ("Avazu rows need every column of the header, click 0 or 1 and hour as YYMMDDHH", ","),
    "obd": (
        "Open Bandit rows need every column of the header, a timestamp, click 0 or 1 and an item_id "
        "listed in item_context.csv",
        ",",
    ),
}


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@dataclass
class Diagnosis:
    """The verdict on a run's dead letters; :meth:`lines` is what the command line prints."""

    events: int
    dead: int
    by_reason: dict[str, int]  # most frequent first
    details: dict[str, str] = field(default_factory=dict)  # reason -> the first detail seen
    example: str = ""  # a safe prefix of the first dead letter's raw line, and where it was
    suggested: list[str] = field(default_factory=list)  # --map pairs that would read the lines
    hints: list[str] = field(default_factory=list)
    generic: bool = False  # the hint is only the schema (nothing more specific was found)

    @property
    def notes(self) -> list[str]:
        """The hints a run that did not fail prints (it exits 0): only specific ones, and only when
        a notable share of its events became dead letters."""
        if self.failed or self.generic or self.share <= NOTE_SHARE:
            return []
        return self.hints

    @property
    def share(self) -> float:
        return self.dead / self.events if self.events else 0.0

    @property
    def failed(self) -> bool:
        return self.share > FAIL_SHARE

    def reasons_line(self) -> str:
        return ", ".join(f"{r} {n:,}" for r, n in self.by_reason.items()) or "none"

    def lines(self, dead_letters_file: Path | None = None) -> list[str]:
        out = [
            f"{self.dead:,} of {self.events:,} events ({self.share:.1%}) became dead letters; top reasons:"
        ]
        for reason, n in list(self.by_reason.items())[:5]:
            detail = self.details.get(reason, "")
            out.append(f"  {reason:<14} {n:>10,}" + (f"  e.g. {detail}" if detail else ""))
        if self.example:
            out.append(f"example: {self.example}")
        out += [f"what to change: {h}" for h in self.hints]
        if dead_letters_file is not None:
            out.append(f"every dead letter: {dead_letters_file}")
        return out


def read_dead_letters(path: Path, *, count: bool) -> tuple[Counter[str], list[dict[str, Any]]]:
    """The first dead letters of a ``dead_letters.jsonl``, with the first few of each kind (clicks
    may start later), and their reasons; with ``count``, the reasons of the whole file."""
    reasons: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    per_kind: Counter[str] = Counter()
    if not path.is_file():
        return reasons, samples
    with open(path, "rb") as f:
        for n, line in enumerate(f):
            if n >= _SCAN and not count:
                break
            try:
                letter = json.loads(line)
            except ValueError:
                continue
            reasons[str(letter.get("reason"))] += 1
            kind = str(letter.get("kind"))
            if len(samples) < _SAMPLES or per_kind[kind] < _PER_KIND:
                samples.append(letter)
                per_kind[kind] += 1
    return reasons, samples


def _keys(raw: str) -> tuple[dict[str, Any], list[str]]:
    try:
        obj = json.loads(raw)
    except ValueError:  # cut at the dead letter's prefix: the keys it shows
        return {}, list(dict.fromkeys(_KEY.findall(raw)))
    return (obj, list(obj)) if isinstance(obj, dict) else ({}, [])


def _kind_guess(value: str) -> str:
    low = value.lower()
    if low.startswith(("cl", "tap")):
        return "click"
    return "impression" if low.startswith(("im", "view", "show", "exp", "serve")) else ""


def diagnose(
    events: int,
    by_reason: Mapping[str, int],
    samples: Sequence[Mapping[str, Any]],
    mapping: JsonlMapping | None = None,
) -> Diagnosis:
    """The verdict on ``by_reason`` out of ``events``; ``samples`` (the first dead letters, as in
    ``dead_letters.jsonl``) give the example and the suggested ``--map`` pairs under ``mapping``."""
    mapping = mapping or JsonlMapping()
    ranked = dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])))
    d = Diagnosis(events, sum(ranked.values()), ranked)
    for s in samples:
        d.details.setdefault(str(s.get("reason")), str(s.get("detail", ""))[:120])
    if samples:
        s = samples[0]
        where = f"{s.get('source', '?')} line {int(s.get('offset', 0)) + 1}"
        d.example = f"({where}) {str(s.get('raw', ''))[:_EXAMPLE_CHARS]}"
    pairs: dict[str, None] = {}
    unknown_values: dict[str, None] = {}
    seconds, text_ts = False, ""
    for s in samples:
        if s.get("reason") in _UNREAD:
            continue
        obj, keys = _keys(str(s.get("raw", "")))
        tag = mapping.tag_of(dict.fromkeys(keys))
        if tag is None:
            tag = next((k for k in keys if _norm(k) in _TAG_NAMES), None)
            if tag is not None:
                pairs[f"type={tag}"] = None
        value = obj.get(tag) if tag is not None else None
        if isinstance(value, str) and value not in mapping.kinds:
            kind = _kind_guess(value)
            if kind:
                pairs[f"{kind}={value}"] = None
            else:
                unknown_values[value] = None
        for k in keys:
            canonical = _SYNONYMS.get(_norm(k))
            if (
                k != tag
                and k not in FIELDS
                and k not in mapping.fields
                and canonical
                and canonical not in keys
            ):
                pairs[f"{canonical}={k}"] = None
        ts = obj.get(next((k for k in keys if _SYNONYMS.get(_norm(k)) == "ts"), "ts"))
        seconds |= s.get("reason") == "ts_too_old" and isinstance(ts, int | float) and 0 < ts < 1e11
        if s.get("reason") == "bad_type" and isinstance(ts, str) and not text_ts:
            text_ts = ts  # a date ("2026-01-01T00:00:00Z") or digits in quotes
    d.suggested = list(pairs)
    tag_pair = next((p for p in pairs if p.startswith("type=")), None)
    if d.suggested:
        look = f"events look tagged {tag_pair[5:]!r}: " if tag_pair else ""
        d.hints.append(look + "pass " + " ".join(f"--map {p}" for p in d.suggested))
    for value in list(unknown_values)[:3]:
        d.hints.append(
            f"tag value {value!r} is no kind: pass --map impression={value} or --map click={value}"
        )
    if seconds:
        d.hints.append(
            "ts looks like epoch seconds; the schema wants epoch milliseconds (no --map converts it)"
        )
    if text_ts:
        d.hints.append(
            f"ts is text ({text_ts[:32]!r}); the schema wants epoch milliseconds as a JSON integer: "
            "convert it before the replay (no --map converts it)"
        )
    rows = [s for s in samples if s.get("reason") == "bad_json"]
    source = str(rows[0].get("source")) if rows else ""
    layout, sep = next((v for k, v in _ROW_LAYOUTS.items() if source.startswith(k)), ("", ""))
    if layout:
        fields, name = str(rows[0].get("raw", "")).count(sep) + 1, "tab" if sep == "\t" else "comma"
        d.hints.append(f"{layout}; the example has {fields} {name}-separated field{'s' * (fields != 1)}")
    elif samples and str(samples[0].get("raw", "")).lstrip().startswith("["):
        d.hints.append(
            "the log looks like one JSON array, not JSON Lines (one event object per line): convert "
            "it, e.g. jq -c '.[]' FILE > events.jsonl"
        )
    timed_out = sum(by_reason.get(r, 0) for r in _TIME_REASONS)
    jsonl = any(".json" in str(s.get("source", "")) for s in samples if s.get("reason") in _TIME_REASONS)
    if not seconds and timed_out >= _DISORDER_MIN and timed_out > _DISORDER_SHARE * events:
        d.hints.append(
            f"{timed_out:,} events ({timed_out / events:.1%}) were refused for their time: a replay reads "
            "the log in file order, as a Kafka topic delivers it, and judges each event against the "
            "events next to it (validation.max_future_skew_s ahead, max_past_age_s behind). If the "
            "log is not in event-time order, sort it by ts first"
            + (", e.g. jq -c -s 'sort_by(.ts)[]' FILE > sorted.jsonl" if jsonl else "")
        )
    if d.dead and not d.hints:
        d.generic = True
        schema = ", ".join((*KINDS, *FIELDS))
        d.hints.append(f"lines must follow the event schema ({schema}); see the reasons and the example")
    return d
