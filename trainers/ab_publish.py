"""The A/B readout on MLflow: each served version's online metrics, where its page shows them.

For every arm of an :class:`~trainers.ab_readout.ABReadout` whose name is a registered version,
:func:`publish` logs the arm's summary as metrics ``ab_<key>`` (``ab_ctr``, ``ab_ctr_lo``,
``ab_auc``, ``ab_auc_se``, ``ab_ne``, ``ab_calibration``, ``ab_examples``, ...; see
:meth:`~trainers.ab_readout.ArmStats.summary`) on the version's source run, linked to its logged
model (``model_id``), at ``step`` (the trainer's block index): the run page charts them over
blocks, and MLflow 3's logged-model page lists them. A one-line summary also goes in the version tag
``ab.readout``, which the model version page itself shows. Values are cumulative since the version
first served, so a missed publish (MLflow away) loses nothing: the next one carries it.

:func:`read` is the way back (``ctr ab``): the latest value of each ``ab_`` metric of a version.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from trainers.ab_readout import ABReadout, ArmStats
from trainers.model_registry import ModelRegistry

__all__ = ["PREFIX", "TAG", "publish", "publish_quietly", "read", "summary_line"]

log = logging.getLogger(__name__)
PREFIX = "ab_"
TAG = "ab.readout"
_UNKNOWN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")  # not a version of this model


def summary_line(s: Mapping[str, float]) -> str:
    """``CTR 2.31% [2.20, 2.43] of 12,345 · AUC 0.712 [0.701, 0.723] · NE 0.931 · calibration 1.04``."""
    ctr = f"CTR {100 * s['ctr']:.2f}% [{100 * s['ctr_lo']:.2f}, {100 * s['ctr_hi']:.2f}]"
    parts = [f"{ctr} of {s['examples']:,.0f}"]
    if s.get("scored", 0) and not math.isnan(s["auc"]):
        parts.append(f"AUC {s['auc']:.3f} [{s['auc_lo']:.3f}, {s['auc_hi']:.3f}]")
    if s.get("scored", 0) and not math.isnan(s["ne"]):
        parts.append(f"NE {s['ne']:.3f} [{s['ne_lo']:.3f}, {s['ne_hi']:.3f}]")
        parts.append(f"calibration {s['calibration']:.2f}")
    if not s.get("scored", 0):
        parts.append("no served scores: CTR only")
    return " · ".join(parts)


def publish(store: ModelRegistry, readout: ABReadout, step: int) -> list[str]:
    """Log the readout of each registered arm updated since the last publish; the versions logged.

    An arm named after no version of ``store.name`` (a replica of another registry, an old
    deployment) is skipped; an outage raises (``MlflowException`` or ``OSError``).
    """
    now = int(time.time() * 1000)
    done = []
    for version, s in readout.summary().items():
        if version not in readout.updated:
            continue  # nothing new since its last publish
        try:
            mv = store.client.get_model_version(store.name, version)
        except MlflowException as exc:
            if exc.error_code in _UNKNOWN:
                readout.updated.discard(version)
                continue
            raise  # stays in ``updated``: the next publish retries it
        if mv.run_id:
            model_id = getattr(mv, "model_id", None)
            metrics = [
                Metric(PREFIX + k, float(v), now, step, model_id=model_id)
                for k, v in s.items()
                if math.isfinite(float(v))
            ]
            store.client.log_batch(mv.run_id, metrics=metrics)
            store.client.set_model_version_tag(store.name, version, TAG, summary_line(s))
            done.append(version)
        readout.updated.discard(version)
    return done


def publish_quietly(store: ModelRegistry, readout: ABReadout, step: int) -> None:
    """:func:`publish`, an MLflow outage logged instead of raised (the next block publishes again)."""
    try:
        publish(store, readout, step)
    except (MlflowException, OSError) as exc:
        log.warning("A/B readout not published to MLflow (%s); the next block retries", exc)


def read(store: ModelRegistry, version: str) -> dict[str, float]:
    """The latest ``ab_`` metrics of ``version``'s run, prefix stripped, every key of a summary
    present (nan where undefined); empty if none were logged."""
    mv = store.client.get_model_version(store.name, version)
    if not mv.run_id:
        return {}
    metrics = store.client.get_run(mv.run_id).data.metrics
    found = {k[len(PREFIX) :]: float(v) for k, v in metrics.items() if k.startswith(PREFIX)}
    return dict.fromkeys(ArmStats().summary(), math.nan) | found if found else {}
