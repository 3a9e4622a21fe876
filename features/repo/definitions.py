"""Feast objects: the ``user`` and ``item`` entities, their push sources and feature views.

The feature names come from :mod:`features.aggregations`, so the store and the streaming counters
cannot drift apart. With ``features.sequence_length`` > 0 the user view also holds the behaviour
sequence as two list features (``Array(String)`` item ids, ``Array(Int64)`` click times), in the same
Redis hash as the counters: serving reads both in one round trip. Counts are Int64; CTRs are Float64
(not Float32) so that what serving reads is bit-for-bit what the joiner put into training examples:
no train/serve skew from rounding.

The batch sources are folders of parquet part files under the store folder (``offline/<view>/``),
written by :class:`features.store.FeatureWriter`; relative paths resolve against the store's
``repo_path``, so the same objects serve every profile and every per-run store folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Float64, Int64, String

from features.aggregations import SEQUENCE_NAMES, entity_feature_names
from pipeline.core.config import FeatureConfig

__all__ = [
    "JOIN_KEYS",
    "OFFLINE_DIR",
    "TIMESTAMP_FIELD",
    "definitions",
    "item",
    "item_stats",
    "item_stats_push",
    "stats_view",
    "user",
    "user_stats",
    "user_stats_push",
]

JOIN_KEYS = {"user": "user_id", "item": "item_id"}
TIMESTAMP_FIELD = "event_timestamp"
OFFLINE_DIR = "offline"  # under the store folder: offline/<feature view>/part-*.parquet

user = Entity(
    name="user",
    join_keys=["user_id"],
    value_type=ValueType.STRING,
    description="A pseudonymized user",
)
item = Entity(name="item", join_keys=["item_id"], value_type=ValueType.STRING, description="An ad/item")
_ENTITIES = {"user": user, "item": item}


def stats_view(
    entity: str, windows_s: Sequence[int], ttl_s: int, sequence: bool = False
) -> tuple[PushSource, FeatureView]:
    """The push source and feature view ``<entity>_stats`` of one entity ("user" or "item");
    ``sequence``: with the user's behaviour sequence (two list features, :data:`SEQUENCE_NAMES`)."""
    key = JOIN_KEYS[entity]
    batch = FileSource(
        name=f"{entity}_stats_log",
        path=f"{OFFLINE_DIR}/{entity}_stats",  # a folder of part files; never one growing file
        timestamp_field=TIMESTAMP_FIELD,
        description=f"Offline log of every {entity}_stats row pushed online",
    )
    push = PushSource(name=f"{entity}_stats_push", batch_source=batch)
    schema = [Field(name=key, dtype=String)]
    for name in entity_feature_names(entity, windows_s):
        schema.append(Field(name=name, dtype=Float64 if "_ctr_" in name else Int64))
    if sequence and entity == "user":
        items, times = SEQUENCE_NAMES
        schema += [Field(name=items, dtype=Array(String)), Field(name=times, dtype=Array(Int64))]
    view = FeatureView(
        name=f"{entity}_stats",
        entities=[_ENTITIES[entity]],
        ttl=timedelta(seconds=ttl_s),
        schema=schema,
        source=push,
        online=True,
        description=f"Sliding-window impressions, clicks and smoothed CTR per {entity}",
    )
    return push, view


def definitions(cfg: FeatureConfig | None = None) -> list[Entity | PushSource | FeatureView]:
    """Every object to ``apply``, for the windows and ttl of ``cfg`` (defaults if None)."""
    cfg = cfg or FeatureConfig()
    out: list[Entity | PushSource | FeatureView] = [user, item]
    for entity in JOIN_KEYS:
        out.extend(stats_view(entity, cfg.windows_s, cfg.ttl_s, cfg.sequence_length > 0))
    return out


# Module-level objects for the default config, so `feast apply` on this folder also works.
user_stats_push, user_stats = stats_view("user", FeatureConfig().windows_s, FeatureConfig().ttl_s)
item_stats_push, item_stats = stats_view("item", FeatureConfig().windows_s, FeatureConfig().ttl_s)
