"""What one registered version shows the operator who rolls back: a description, a few tags, a file.

The MLflow version page (model -> version) shows the description first, then the tags in a small
scrolling table sorted by name (about five rows visible). So:

- the **description** (Markdown) says in a few lines what the version learned from (event-time
  range in ISO 8601, the input position: Kafka offsets from -> to), its progressive and holdout
  metrics beside its parent's (looked up in the registry at publish time), and the gate's reason;
- the **tags** are only what code searches or reads (``lineage_key``, ``block``, ``parent_version``,
  ``position``, ``gate_reason``, the metric columns of ``ctr versions`` and ``ctr status`` ...):
  about 15 instead of ~50, timestamps in ISO 8601 UTC (:func:`iso_time`; :func:`tag_time` reads
  them back, and the epoch numbers older versions carry);
- **lineage.json**, beside the model's ``MLmodel``, holds everything: the lineage as the trainer
  passed it (epoch-ms event times included), every metric, the parent's metrics and the tags
  (:meth:`trainers.model_registry.ModelRegistry.lineage_record` reads it back).

Standard library only: ``ctr status`` and ``ctr versions`` import it without torch.

>>> iso_time(1767225800.0)
'2026-01-01T00:03:20.000Z'
>>> tag_time('2026-01-01T00:03:20.000Z'), tag_time('1767225800.5'), tag_time(None)
(1767225800.0, 1767225800.5, None)
>>> sorted(version_tags({"block": 2, "positives": 9, "event_time_min": 1767225800000},
...                     {"holdout.logloss": 0.5, "holdout.ne": 1.1}).items())
[('block', '2'), ('event_time_min', '2026-01-01T00:03:20.000Z'), ('metric.holdout.logloss', '0.5')]
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "LINEAGE_FILE",
    "TAGGED_METRICS",
    "describe",
    "iso_time",
    "lineage_document",
    "parent_metrics",
    "tag_text",
    "tag_time",
    "version_tags",
]

LINEAGE_FILE = "lineage.json"  # in the logged model's folder, beside MLmodel
TAG_LIMIT = 8_000  # longest tag value we write (MLflow's run-tag limit; version tags allow more)
# metrics kept as "metric.<key>" tags: what `ctr versions`, `ctr status`, the description of a
# child version and the tests read; the rest are the run's metrics and in lineage.json
TAGGED_METRICS = (
    "online.auc",
    "online.logloss",
    "holdout.auc",
    "holdout.logloss",
    "holdout_champion.logloss",
    "blend.model_weight",  # the model's share of what it serves at its block's start (base_rate_blend)
)
# lineage fields only in lineage.json (and the description): counts and settings nobody reads from
# a tag; every other lineage field is a tag
DETAIL_ONLY = frozenset(
    {"examples_after_position", "positives", "train_examples", "holdout_examples", "model", "config_hash"}
)
_EPOCH_MS = ("event_time_min", "event_time_max")  # impression time, epoch ms
_EPOCH_S = ("block_closed_at",)  # wall time, epoch seconds
_MAX_PARTITIONS = 6  # shown in the description; lineage.json and the position tag have them all


def iso_time(epoch_s: float) -> str:
    """``epoch_s`` as ISO 8601 UTC with milliseconds and a ``Z``."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def tag_time(text: str | None) -> float | None:
    """A timestamp tag as epoch seconds: ISO 8601, or a plain number (as versions published before
    tags were ISO 8601 wrote ``block_closed_at``); None if missing or neither."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return value if math.isfinite(value) else None


def tag_text(value: Any) -> str:
    """``value`` as a tag: a string as is, anything else as JSON; cut to :data:`TAG_LIMIT`."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= TAG_LIMIT else text[: TAG_LIMIT - 3] + "..."


def _tag_value(key: str, value: Any) -> str:
    if key in _EPOCH_MS and isinstance(value, int | float):
        return iso_time(value / 1000)
    if key in _EPOCH_S and isinstance(value, int | float):
        return iso_time(value)
    return tag_text(value)


def version_tags(lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> dict[str, str]:
    """The version's tags: its lineage less :data:`DETAIL_ONLY`, and the :data:`TAGGED_METRICS`."""
    tags = {k: _tag_value(k, v) for k, v in lineage.items() if v is not None and k not in DETAIL_ONLY}
    tags.update({f"metric.{k}": repr(float(metrics[k])) for k in TAGGED_METRICS if k in metrics})
    return tags


def parent_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """The :data:`TAGGED_METRICS` of a version, from its tags (what a child's description shows)."""
    out = {}
    for key in TAGGED_METRICS:
        try:
            out[key] = float(tags[f"metric.{key}"])
        except (KeyError, ValueError):
            continue
    return out


def lineage_document(
    lineage: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    parent: Mapping[str, Any] | None,
) -> str:
    """``lineage.json``: the full lineage, every metric, the parent's metrics and the tags."""
    doc = {
        "lineage": dict(lineage),
        "metrics": {k: float(v) for k, v in metrics.items()},
        "parent": dict(parent) if parent is not None else None,
        "tags": dict(tags),
    }
    # NaN/inf metrics become null: strict JSON for any reader
    return json.dumps(_finite(doc), indent=2, sort_keys=True, default=str) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    return value


# -- the description -----------------------------------------------------------------------------
def _num(value: Any, spec: str = ",") -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "?"
    return format(int(number) if spec == "," else number, spec) if math.isfinite(number) else "?"


def _pair(metrics: Mapping[str, float], group: str) -> str:
    auc, logloss = metrics.get(f"{group}.auc"), metrics.get(f"{group}.logloss")
    if auc is None and logloss is None:
        return "-"
    return f"{_num(auc, '.4f')} · {_num(logloss, '.4f')}"


def _when(lineage: Mapping[str, Any], key: str) -> str:
    value = lineage.get(key)
    return _tag_value(key, value) if value is not None else "?"


def _position(position: Any) -> str:
    """Kafka offsets as ``topic`` p0 100→160 line 3 · p1 ...; any other position as compact JSON."""
    if isinstance(position, str):
        try:
            position = json.loads(position)
        except ValueError:
            return f"`{position[:200]}`"
    if not (isinstance(position, Mapping) and isinstance(position.get("kafka_offsets_to"), Mapping)):
        return f"`{json.dumps(position, sort_keys=True, default=str)[:200]}`"
    start, end = position.get("kafka_offsets_from") or {}, position["kafka_offsets_to"]
    lines = position.get("kafka_lines_from") or {}, position.get("kafka_lines_to") or {}

    def at(offsets: Mapping[str, Any], lines: Mapping[str, Any], tp: str) -> str:
        return f"{offsets.get(tp, 'start')}" + (f" line {lines[tp]}" if lines.get(tp) else "")

    topics: dict[str, list[str]] = {}
    for tp in sorted(end, key=lambda k: (k.rpartition(":")[0], int(k.rpartition(":")[2] or 0))):
        topic, _, partition = tp.rpartition(":")
        topics.setdefault(topic, []).append(f"p{partition} {at(start, lines[0], tp)}→{at(end, lines[1], tp)}")
    parts = []
    for topic, ranges in topics.items():
        more = f" · … {len(ranges) - _MAX_PARTITIONS} more" if len(ranges) > _MAX_PARTITIONS else ""
        parts.append(f"`{topic}` " + " · ".join(ranges[:_MAX_PARTITIONS]) + more)
    return "; ".join(parts) + " (offsets from → to: the next record to read, and its lines read already)"


def describe(
    lineage: Mapping[str, Any], metrics: Mapping[str, float], parent: Mapping[str, Any] | None
) -> str:
    """The version's description (Markdown): input, metrics beside the parent's, the gate.

    ``parent``: ``{"version", "block", "metrics"}`` of the parent version as found in the registry
    (its :func:`parent_metrics`), or None (no parent, or not found).
    """
    parent_version = str(lineage.get("parent_version") or "none")
    origin = (
        "trained from scratch"
        if parent_version == "none"
        else f"fine-tuned from **version {parent_version}**"
    )
    lines = [
        f"**Block {lineage.get('block', '?')}**, {origin}. "
        f"**Gate:** {lineage.get('gate_reason', 'no reason recorded')}",
    ]
    if lineage.get("examples") is not None:
        lines += [
            "",
            f"**Learned from** {_num(lineage.get('train_examples'))} of {_num(lineage['examples'])} "
            f"examples ({_num(lineage.get('positives'))} clicks), event time "
            f"{_when(lineage, 'event_time_min')} .. {_when(lineage, 'event_time_max')}; "
            f"the newest {_num(lineage.get('holdout_examples'))} held out for the gate.",
        ]
    if lineage.get("position") is not None:
        lines += ["", f"**Input:** {_position(lineage['position'])}"]
    p_metrics: Mapping[str, float] = (parent or {}).get("metrics") or {}
    head = "parent" if parent_version == "none" else f"parent: version {parent_version}"
    if parent is not None and parent.get("block") is not None:
        head += f", block {parent['block']}"
    lines += [
        "",
        f"| AUC · logloss | this version, block {lineage.get('block', '?')} | {head} |",
        "|:--|--:|--:|",
        f"| progressive (its block, scored before training on it) | {_pair(metrics, 'online')} "
        f"| {_pair(p_metrics, 'online')} |",
        f"| holdout (its block's newest examples) | {_pair(metrics, 'holdout')} "
        f"| {_pair(p_metrics, 'holdout')} |",
        f"| this block's holdout (what the gate compared) | {_pair(metrics, 'holdout')} "
        f"| {_pair(metrics, 'holdout_champion')} |",
        "",
        "_Full lineage, every metric: `lineage.json` in the model's artifacts._",
    ]
    return "\n".join(lines)
