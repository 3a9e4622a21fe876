"""Clicks and conversions: the multi-task (ESMM) loss, the conversion metrics and the gate's conversion check.

With conversions joined (``joiner.conversion_window_s > 0``, :class:`pipeline.core.events.LabelledExample`)
a block holds three kinds of rows: a never-clicked impression (click 0, conversion 0: final), a
clicked impression's first emission (click 1, conversion unknown yet) and, a conversion window
later, its *correction* (the same impression, click 1, conversion 0/1). A multi-task model
(:func:`trainers.models.is_multi_task`) learns from all of them, each label once:

- the click loss, BCE(CTR logit, click), over the rows that are not corrections (a correction's
  click was learned from its first emission);
- the conversion loss, BCE(pCTCVR, conversion) with pCTCVR = pCTR x pCVR, over the rows whose
  conversion is known: ESMM's loss over the whole impression space, so that the CVR tower is not
  trained on clicked impressions only (Ma et al. 2018). Computed from the logits in log space:
  ``log p = logsigmoid(ctr) + logsigmoid(cvr)`` and ``log(1 - p)`` by :func:`log1mexp`.

Probabilities of a multi-task learner are ``(n, 2)`` arrays ``[pCTR, pCVR]`` (pCVR = P(conversion |
click)); pCTCVR, the probability that an impression converts, is their product. A single-task
model never learns a correction (:meth:`trainers.encoding.EncodedBatch.without_corrections`).

Conversion metrics (:func:`conversion_metrics`, keys prefixed ``cvr_``) score pCTCVR against the
conversion over the rows whose conversion is known, like :func:`trainers.metrics.block_metrics`
(``cvr_examples``, ``cvr_positives``, ``cvr_rate``, ``cvr_auc``, ``cvr_logloss``, ...), plus
``cvr_clicked_auc`` and ``cvr_clicked_calibration``: pCVR's AUC and calibration over the clicked
impressions with a known conversion, the CVR tower's own ranking and level (pCTCVR's AUC also
rewards a good click ranking: every converting row was clicked). The gate's conversion check
(:func:`conversion_gate`) has the click gate's form: the candidate's ``cvr_logloss`` may exceed
the champion's by the fraction ``trainer.conversion_gate_tolerance``.

>>> cand = {"cvr_examples": 50.0, "cvr_positives": 4.0, "cvr_logloss": 0.2, "cvr_mean_prediction": 0.1}
>>> conversion_gate(cand, {"cvr_logloss": 0.1}, 0.01).kind
'worse_on_conversions'
>>> conversion_gate(cand | {"cvr_positives": 0.0}, None, 0.01).reason
'no conversion in the holdout: conversion check skipped'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainers.calibration import IDENTITY, apply_platt
from trainers.gate import GateDecision, paired_allowance, within_tolerance
from trainers.metrics import auc, block_metrics, calibration

__all__ = [
    "CONVERSION_COLUMN",
    "PREFIX",
    "PROBABILITY_COLUMN",
    "TaskTargets",
    "both_tasks",
    "conversion_allowance",
    "conversion_gate",
    "conversion_metrics",
    "conversions_to_learn",
    "log1mexp",
    "multitask_loss",
    "start_cvr_at_base_rate",
    "task_probabilities",
]

PROBABILITY_COLUMN = "probability"  # a multi-task model's pyfunc output: the click probability
CONVERSION_COLUMN = "conversion_probability"  # and pCVR beside it (trainers.mlflow_model, registry)
PREFIX = "cvr_"  # the conversion metrics' keys (metric dicts, MLflow: online.cvr_auc, holdout.cvr_auc)
_RENAMED = {"count": "examples", "ctr": "rate"}  # block_metrics' click names, said of conversions
_LOG_P_MAX = -1e-6  # log pCTCVR is clamped below 0: log(1 - p) and its gradient stay finite
_LN2 = math.log(2.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2`` (Mächler 2012).

    >>> x = torch.tensor([-1e-3, -30.0])
    >>> [f"{v:.4g}" for v in log1mexp(x).tolist()]
    ['-6.908', '-9.358e-14']
    """
    return torch.where(x > -_LN2, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def multitask_loss(
    logits: torch.Tensor, labels: torch.Tensor, conversions: torch.Tensor | None, clicks: torch.Tensor | None
) -> torch.Tensor:
    """The summed loss of a batch: click BCE over ``clicks`` (float 0/1 weights; None: every row) plus
    pCTCVR's BCE over the rows whose ``conversions`` are not NaN (None: none).

    ``logits``: ``(n, 2)`` [CTR, CVR] as ``task_logits`` returns them.

    >>> z = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    >>> round(float(multitask_loss(z, torch.tensor([1.0, 0.0]), torch.tensor([float("nan"), 0.0]), None)), 4)
    1.674
    """
    ctr, cvr = logits[:, 0].float(), logits[:, 1].float()
    loss = F.binary_cross_entropy_with_logits(ctr, labels, weight=clicks, reduction="sum")
    if conversions is None:
        return loss
    known = ~torch.isnan(conversions)
    target = torch.nan_to_num(conversions, nan=0.0)
    # pCTR enters pCTCVR as a constant: the click tower learns from clicks only (stop-gradient)
    log_p = (F.logsigmoid(ctr).detach() + F.logsigmoid(cvr)).clamp(max=_LOG_P_MAX)
    per_row = -(target * log_p + (1.0 - target) * log1mexp(log_p))
    return loss + (per_row * known.to(per_row.dtype)).sum()


class TaskTargets:
    """A block's conversion targets on the learner's device, for :func:`multitask_loss` per step."""

    def __init__(self, conversions: torch.Tensor | None, clicks: torch.Tensor | None) -> None:
        self.conversions = conversions  # float32, NaN where unknown
        self.clicks = clicks  # float32 1 where the row is not a correction

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The summed loss of the step's rows ``idx`` (``labels`` already selected)."""
        conv = None if self.conversions is None else self.conversions.index_select(0, idx)
        clicks = None if self.clicks is None else self.clicks.index_select(0, idx)
        return multitask_loss(logits, labels, conv, clicks)


def task_probabilities(logits: np.ndarray, calibration: tuple[float, float]) -> np.ndarray:
    """``(n, 2)`` [pCTR, pCVR] (float64) from ``(n, 2)`` task logits: the click logit through the
    learner's Platt ``calibration`` (as ``predict`` serves it), the conversion logit plain."""
    out = np.empty((len(logits), 2), dtype=np.float64)
    out[:, 0] = apply_platt(logits[:, 0], calibration)
    out[:, 1] = apply_platt(logits[:, 1], IDENTITY)
    return out


@torch.no_grad()
def start_cvr_at_base_rate(model: nn.Module, labels: np.ndarray, conversions: np.ndarray | None) -> None:
    """Set the CVR tower's bias to the logit of the conversions-per-click rate of the first block
    that has clicked impressions with a known conversion (shrunk towards 1/2 by one pseudo-count
    each, as the click bias), once: the model's ``cvr_started`` buffer records it. The first such
    block whose corrections number at least half its clicked impressions: in a stream's first
    conversion window the corrections trail the clicks (they come a window later), and a block of
    that window has many never-clicked impressions (conversion 0) and few clicked ones' labels."""
    started = getattr(model, "cvr_started", None)
    if conversions is None or not isinstance(started, torch.Tensor) or bool(started):
        return
    clicked = (labels > 0.5) & ~np.isnan(conversions)  # corrections
    m = int(clicked.sum())
    if m == 0 or m < 0.5 * int(((labels > 0.5) & np.isnan(conversions)).sum()):
        return  # the corrections have not caught up with the clicks yet (the stream's first window)
    rate = (float(conversions[clicked].sum()) + 1.0) / (m + 2.0)
    model.cvr_output_bias.fill_(math.log(rate / (1.0 - rate)))  # type: ignore[operator]
    started.fill_(True)


def conversions_to_learn(model: nn.Module, conversions: np.ndarray | None) -> np.ndarray | None:
    """The conversion targets a block's CTCVR loss reads: none before the CVR tower has started
    (:func:`start_cvr_at_base_rate`, called first). Until a clicked impression's conversion has come,
    every known target is the 0 of a never-clicked impression, known at once, while the clicked
    ones' arrive a conversion window later: learning from those alone drives pCVR to 0 (measured:
    mean pCTCVR 1e-7 after the first blocks of a run), a bias the stream's steady state never has."""
    started = getattr(model, "cvr_started", None)
    if conversions is None or not isinstance(started, torch.Tensor) or bool(started):
        return conversions
    return None


def conversion_metrics(labels: np.ndarray, conversions: np.ndarray | None, p: np.ndarray) -> dict[str, float]:
    """The ``cvr_`` metrics of the rows whose conversion is known, scored as pCTCVR = ``p[:, 0] *
    p[:, 1]`` (``p``: ``(n, 2)`` [pCTR, pCVR]), and ``cvr_clicked_auc``, pCVR's AUC over the known
    rows that were clicked. Rows of unknown conversion (None: all) are left out; with none known,
    every metric but the counts is nan. For reference, what the click probability alone ranks:
    ``cvr_auc_by_ctr`` (pCTR's AUC on the same rows) and ``cvr_clicked_auc_by_ctr`` (among the
    clicked ones): what the conversion tower adds is the gap.

    >>> m = conversion_metrics(np.array([0.0, 1, 1, 1]), np.array([0.0, np.nan, 1, 0]),
    ...                        np.array([[0.1, 0.5], [0.6, 0.5], [0.5, 0.8], [0.5, 0.2]]))
    >>> m["cvr_examples"], m["cvr_positives"], m["cvr_auc"], m["cvr_clicked_auc"]
    (3.0, 1.0, 1.0, 1.0)
    """
    known = np.zeros(len(p), dtype=bool) if conversions is None else ~np.isnan(conversions)
    y = np.zeros(0) if conversions is None else conversions[known]
    metrics = block_metrics(y, p[known, 0] * p[known, 1])
    out = {PREFIX + _RENAMED.get(k, k): v for k, v in metrics.items()}
    clicked = known & (labels > 0.5)
    out[PREFIX + "clicked_auc"] = auc(y[clicked[known]], p[clicked, 1]) if clicked.any() else math.nan
    out[PREFIX + "clicked_calibration"] = calibration(y[clicked[known]], p[clicked, 1])
    out[PREFIX + "auc_by_ctr"] = auc(y, p[known, 0]) if known.any() else math.nan
    out[PREFIX + "clicked_auc_by_ctr"] = auc(y[clicked[known]], p[clicked, 0]) if clicked.any() else math.nan
    return out


def conversion_allowance(
    conversions: np.ndarray | None, candidate: np.ndarray, champion: np.ndarray, confidence: float
) -> float:
    """:func:`trainers.gate.paired_allowance` of pCTCVR over the rows of known conversion (those
    :func:`conversion_metrics` scores), ``candidate`` and ``champion`` as its ``p``; 0 with none.

    >>> conversion_allowance(None, np.zeros((2, 2)), np.zeros((2, 2)), 0.95)
    0.0
    """
    if conversions is None:
        return 0.0
    known = ~np.isnan(conversions)
    return paired_allowance(
        conversions[known],
        candidate[known, 0] * candidate[known, 1],
        champion[known, 0] * champion[known, 1],
        confidence,
    )


def conversion_gate(
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    tolerance: float,
    *,
    allowance: float = 0.0,
) -> GateDecision:
    """The conversion check of a multi-task candidate on the holdout rows of known conversion.

    Skipped (accepted, and the reason says so) with no such row or no conversion among them;
    refused if the candidate's ``cvr_logloss`` or ``cvr_mean_prediction`` is not finite, or its
    ``cvr_logloss`` exceeds the champion's times ``1 + tolerance`` plus ``allowance`` (the click
    gate's form: :func:`trainers.gate.paired_allowance` over the same rows).
    """
    examples = float(candidate.get(PREFIX + "examples", 0.0))
    if examples == 0:
        return GateDecision(True, "no known conversion in the holdout: conversion check skipped")
    for key in ("logloss", "mean_prediction"):
        value = float(candidate.get(PREFIX + key, math.nan))
        if not math.isfinite(value):
            return GateDecision(False, f"candidate metric {PREFIX + key!r} is {value}", "non_finite")
    cand = float(candidate[PREFIX + "logloss"])
    if float(candidate.get(PREFIX + "positives", 0.0)) == 0:
        return GateDecision(True, "no conversion in the holdout: conversion check skipped")
    champ = math.nan if champion is None else float(champion.get(PREFIX + "logloss", math.nan))
    if not math.isfinite(champ):
        return GateDecision(
            True, f"no finite champion cvr_logloss; candidate cvr_logloss {cand:.6f} is finite"
        )
    return within_tolerance(
        cand, champ, tolerance, PREFIX + "logloss", "worse_on_conversions", allowance=allowance
    )


def both_tasks(click: GateDecision, conversion: GateDecision) -> GateDecision:
    """One decision for a multi-task candidate: accepted if both checks are; a refusal names its task.

    >>> both_tasks(GateDecision(True, "ok"), GateDecision(False, "worse", "worse_on_conversions")).reason
    'conversion task: worse'
    """
    if not click.accepted:
        return GateDecision(False, f"click task: {click.reason}", click.kind)
    if not conversion.accepted:
        return GateDecision(False, f"conversion task: {conversion.reason}", conversion.kind)
    return GateDecision(True, f"click task: {click.reason}; conversion task: {conversion.reason}")
