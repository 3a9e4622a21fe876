"""What a registered version's page shows: the tags kept, ISO 8601 times, the description's lines."""

from __future__ import annotations

import json

from trainers.version_page import TAGGED_METRICS, describe, lineage_document, tag_time, version_tags

LINEAGE = {
    "block": 7,
    "position": {
        "kafka_offsets_from": {"ex:0": 100, "ex:1": 90},
        "kafka_offsets_to": {"ex:0": 160, "ex:1": 150, "ex:2": 5},
    },
    "examples_after_position": 3,
    "event_time_min": 1_767_225_600_000,
    "event_time_max": 1_767_225_660_500,
    "examples": 125,
    "positives": 30,
    "train_examples": 100,
    "holdout_examples": 25,
    "parent_version": "6",
    "gate_reason": "candidate logloss 0.400000 <= champion 0.410000 * (1 + 0.01)",
    "model": "deepfm",
    "code_version": "abc123",
    "config_hash": "0123456789abcdef",
    "block_closed_at": 1_767_225_700.25,  # the trainer daemon's wall time
    "lineage_key": "k" * 24,
}
GROUPS = ("online", "static", "holdout", "holdout_champion")
METRICS = {f"{g}.{m}": 0.5 for g in GROUPS for m in ("count", "auc", "logloss", "ne", "ctr")} | {
    "train_loss": 0.4,
    "blend.model_weight": 0.99,
    "blend.base_rate": 0.03,
}


def test_tags_keep_what_code_reads_with_iso_8601_times() -> None:
    tags = version_tags(LINEAGE, METRICS)
    assert len(tags) == 16 and set(tags) >= {
        "lineage_key",
        "block",
        "parent_version",
        "position",
        "gate_reason",
    }
    assert {k.removeprefix("metric.") for k in tags if k.startswith("metric.")} == set(TAGGED_METRICS)
    assert tags["event_time_min"] == "2026-01-01T00:00:00.000Z"
    assert tags["event_time_max"] == "2026-01-01T00:01:00.500Z"
    assert tags["block_closed_at"] == "2026-01-01T00:01:40.250Z"
    assert tag_time(tags["block_closed_at"]) == LINEAGE["block_closed_at"]
    assert tag_time("1767225700.25") == LINEAGE["block_closed_at"]  # a version tagged before ISO 8601
    assert json.loads(tags["position"]) == LINEAGE["position"]


def test_lineage_json_has_everything_in_strict_json() -> None:
    doc = json.loads(lineage_document(LINEAGE, {**METRICS, "static.auc": float("nan")}, {}, None))
    assert doc["lineage"] == LINEAGE and doc["metrics"]["static.auc"] is None and doc["parent"] is None


def test_description_says_input_metrics_beside_the_parent_and_the_gate() -> None:
    parent = {"version": "6", "block": "6", "metrics": {"online.auc": 0.61, "holdout.logloss": 0.42}}
    text = describe(LINEAGE, METRICS | {"holdout_champion.logloss": 0.41}, parent)
    assert text.startswith(f"**Block 7**, fine-tuned from **version 6**. **Gate:** {LINEAGE['gate_reason']}")
    assert "100 of 125 examples (30 clicks)" in text
    assert "event time 2026-01-01T00:00:00.000Z .. 2026-01-01T00:01:00.500Z" in text
    assert "`ex` p0 100→160 · p1 90→150 · p2 start→5" in text
    assert "| this version, block 7 | parent: version 6, block 6 |" in text
    assert "| 0.5000 · 0.5000 | 0.6100 · ? |" in text  # progressive: the parent's as published
    assert "| 0.5000 · 0.5000 | 0.5000 · 0.4100 |" in text  # the gate's holdout, side by side
    first = describe({"block": 1, "parent_version": "none"}, {}, None)
    assert "trained from scratch" in first and "Learned from" not in first
