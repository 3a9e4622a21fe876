"""`ctr versions` (and `ctr rollback --list`): every version with its aliases, block metrics, lineage
summary and rollback tags, newest first, as a text table or JSON.

>>> print(format_table([{"version": "2", "aliases": "champion", "block": "2", "online.auc": 0.71}]))
version  aliases   block  online.auc
2        champion  2      0.7100
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from serving_bridge.rollback import MODEL_TAG_PREFIX, TAG_PREFIX, ModelRegistry

if TYPE_CHECKING:
    from trainers.registry import MlflowModelStore

__all__ = ["COLUMNS", "format_table", "model_rollback_tags", "version_rows"]

# (column, version tag it comes from); metric tags are written by the trainer as "metric.<group>.<name>"
COLUMNS: tuple[tuple[str, str], ...] = (
    ("block", "block"),
    ("parent", "parent_version"),
    ("examples", "examples"),
    ("online.auc", "metric.online.auc"),
    ("online.logloss", "metric.online.logloss"),
    ("holdout.logloss", "metric.holdout.logloss"),
    ("champion.logloss", "metric.holdout_champion.logloss"),
    ("rolled_back_at", f"{TAG_PREFIX}at"),
    ("rolled_back_by", f"{TAG_PREFIX}by"),
    ("rollback_reason", f"{TAG_PREFIX}reason"),
)


def _number(text: str | None) -> float | str | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def version_rows(store: ModelRegistry | MlflowModelStore) -> list[dict[str, Any]]:
    """One dict per version of ``store``'s model, newest first (empty if the model does not exist)."""
    try:
        found = store.client.search_model_versions(f"name = '{store.name}'")
        # search results carry no aliases (MLflow fills them only on the registered model)
        aliases = dict(store.client.get_registered_model(store.name).aliases or {})
    except Exception:  # no such model: an empty listing, not a traceback
        return []
    rows = []
    for mv in sorted(found, key=lambda v: int(v.version), reverse=True):
        tags = mv.tags or {}
        created = datetime.fromtimestamp(mv.creation_timestamp / 1000, UTC)
        row: dict[str, Any] = {
            "version": str(mv.version),
            "aliases": ",".join(sorted(a for a, v in aliases.items() if str(v) == str(mv.version))),
            "created": created.isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        for column, tag in COLUMNS:
            value = tags.get(tag)
            row[column] = _number(value) if tag.startswith("metric.") else value
        rows.append(row)
    return rows


def model_rollback_tags(store: ModelRegistry | MlflowModelStore) -> dict[str, str]:
    """The registered model's ``last_rollback.*`` tags (empty if it has none or does not exist)."""
    try:
        tags = store.client.get_registered_model(store.name).tags or {}
    except Exception:
        return {}
    return {k: v for k, v in tags.items() if k.startswith(MODEL_TAG_PREFIX)}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as aligned columns (keys of the first row; ``-`` where a value is missing)."""
    if not rows:
        return "(no versions)"
    columns = list(rows[0])
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    return "\n".join(lines)
