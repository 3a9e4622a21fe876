"""The quality suite's scoring: per-learner metrics of one world, the Must-show checks, table, plot.

Metrics are the project's own (:func:`trainers.metrics.block_metrics`: AUC, logloss, NE = logloss /
entropy of the evaluated rows' base rate, calibration = sum predicted / sum observed) over the
progressive (predict-then-learn) scores of ``ctr backtest``'s engine; AUC intervals are the
backtest's paired percentile bootstrap over examples (:mod:`pipeline.replay.bootstrap`).

- ``blocks2``: blocks 2 onwards, where every learner exists (block 1 is scored by untrained models);
  the checks are judged here.
- ``overall``: every block the learner scored (``static`` has no block 1: the same as ``blocks2``).
- ``per_block``: each block on its own.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.replay.bootstrap import paired_bootstrap_auc, percentile_ci
from trainers.metrics import base_rate_entropy, block_metrics

__all__ = ["checks", "conversion_summary", "markdown", "plot_world", "score_world"]

METRICS = ("auc", "logloss", "ne", "calibration")
BLOCK_MIN_POSITIVES = 100  # a block's NE is judged only with this many clicks (fewer: too noisy)
CALIBRATION = (0.9, 1.1)


def _pooled(y: np.ndarray, p: np.ndarray, boot: np.ndarray | None) -> dict[str, Any]:
    m = block_metrics(y, p) if y.size else {}
    out = {k: m.get(k, math.nan) for k in METRICS}
    out |= {"examples": int(y.size), "positives": int(y.sum()) if y.size else 0}
    out["auc_ci95"] = percentile_ci(boot) if boot is not None else [math.nan, math.nan]
    return out


def score_world(
    blocks: Sequence[Mapping[str, Any]], learners: Sequence[str], *, resamples: int, seed: int
) -> dict[str, Any]:
    """``blocks``: ``{"index", "labels", "scores": {learner: probabilities}}`` in block order."""
    out: dict[str, Any] = {"learners": {}, "margins": {}}
    later = [b for b in blocks if b["index"] >= 2 and all(n in b["scores"] for n in learners)]
    y2 = np.concatenate([b["labels"] for b in later]) if later else np.zeros(0)
    s2 = {n: np.concatenate([b["scores"][n] for b in later]) if later else np.zeros(0) for n in learners}
    boot2 = paired_bootstrap_auc(y2, s2, resamples=resamples, seed=seed)
    full = [n for n in learners if all(n in b["scores"] for b in blocks)]
    y1 = np.concatenate([b["labels"] for b in blocks]) if blocks else np.zeros(0)
    s1 = {n: np.concatenate([b["scores"][n] for b in blocks]) for n in full} if blocks else {}
    boot1 = paired_bootstrap_auc(y1, s1, resamples=resamples, seed=seed)
    for n in learners:
        per_block = []
        for b in blocks:
            if n in b["scores"]:
                m = block_metrics(b["labels"], b["scores"][n])
                per_block.append(
                    {"block": b["index"], "examples": int(m["count"]), "positives": int(m["positives"])}
                )
                per_block[-1] |= {k: m[k] for k in METRICS}
        out["learners"][n] = {
            "blocks2": _pooled(y2, s2[n], boot2[n]),
            "overall": _pooled(y1, s1[n], boot1[n]) if n in s1 else _pooled(y2, s2[n], boot2[n]),
            "per_block": per_block,
        }
    for n in learners:
        if n != "ftrl" and "ftrl" in learners:
            diff = boot2[n] - boot2["ftrl"]
            auc = out["learners"][n]["blocks2"]["auc"] - out["learners"]["ftrl"]["blocks2"]["auc"]
            out["margins"][f"{n}_vs_ftrl"] = {"auc": auc, "auc_ci95": percentile_ci(diff)}
    # what attending over the sequence adds; what learning conversions beside clicks costs the clicks
    for model in ("din", "esmm"):
        if model in learners and "default" in learners:
            diff = boot2[model] - boot2["default"]
            auc = out["learners"][model]["blocks2"]["auc"] - out["learners"]["default"]["blocks2"]["auc"]
            out["margins"][f"{model}_vs_default"] = {"auc": auc, "auc_ci95": percentile_ci(diff)}
    return out


def checks(world: Mapping[str, Any], learner: str) -> dict[str, Any]:
    """The issue's Must-show checks for ``learner`` (judged on blocks 2+): AUC >= FTRL's (and the
    paired CI of the difference above 0), NE < 1 pooled and on each block with >= 100 clicks,
    calibration within [0.9, 1.1].

    On a world where no block has 100 clicks (the Open Bandit logs: ~10 per block) even the click
    rate known in hindsight only just reaches NE 1, so there, as the issue puts it, NE < 1 means
    learning the base rate quickly: the pooled NE must be at most ``baserate``'s (``ne_le_baserate``)."""
    v = world["learners"][learner]
    b2 = v["blocks2"]
    margin = world["margins"].get(f"{learner}_vs_ftrl")
    judged = [b for b in v["per_block"] if b["block"] >= 2 and b["positives"] >= BLOCK_MIN_POSITIVES]
    base = world["learners"].get("baserate")
    lo, hi = CALIBRATION
    out: dict[str, Any] = {
        "auc_ge_ftrl": None if margin is None else bool(margin["auc"] >= 0),
        "auc_beyond_ci": None if margin is None else bool(margin["auc_ci95"][0] > 0),
        "ne_blocks2_lt_1": bool(b2["ne"] < 1),
        "ne_le_baserate": None if base is None else bool(b2["ne"] <= base["blocks2"]["ne"]),
        "ne_blocks_judged": [b["block"] for b in judged],
        "ne_every_block_lt_1": all(b["ne"] < 1 for b in judged),
        "calibration_ok": bool(lo <= b2["calibration"] <= hi),
    }
    thin = not judged and out["ne_le_baserate"] is not None
    out["ne_ok"] = out["ne_le_baserate"] if thin else out["ne_blocks2_lt_1"]
    required = [out["auc_ge_ftrl"], out["ne_ok"], out["ne_every_block_lt_1"], out["calibration_ok"]]
    out["pass"] = all(x is not False for x in required)
    return out


def _f(x: Any, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _yn(x: bool | None) -> str:
    return "-" if x is None else ("pass" if x else "FAIL")


def markdown(worlds: Mapping[str, Mapping[str, Any]], learners: Sequence[str]) -> str:
    """One row per world and learner: AUC [CI], logloss, NE, calibration over blocks 2+, the checks."""
    head = (
        "| world | learner | AUC [95% CI] | logloss | NE | calib | AUC-FTRL [95% CI] "
        "| AUC>=FTRL | NE<1 (2+, blocks) | calib ok | all |"
    )
    lines = [head, "|" + "---|" * 11]
    for name, w in worlds.items():
        for n in learners:
            if n not in w["learners"]:
                continue
            label = f"{n} (= {w['same_as'][n]})" if n in w.get("same_as", {}) else n
            b2 = w["learners"][n]["blocks2"]
            ci = f"[{_f(b2['auc_ci95'][0])}, {_f(b2['auc_ci95'][1])}]"
            m = w["margins"].get(f"{n}_vs_ftrl")
            marg = "-" if m is None else f"{m['auc']:+.4f} [{m['auc_ci95'][0]:+.4f}, {m['auc_ci95'][1]:+.4f}]"
            c = w["checks"][n]
            auc_ok = _yn(c["auc_ge_ftrl"]) + (" (CI)" if c["auc_beyond_ci"] else "")
            pooled = _yn(c.get("ne_ok", c["ne_blocks2_lt_1"]))
            if not c["ne_blocks_judged"] and c.get("ne_le_baserate") is not None:
                pooled += " (<= baserate)"
            ne = f"{pooled}, {_yn(c['ne_every_block_lt_1'])} ({len(c['ne_blocks_judged'])})"
            lines.append(
                f"| {name} | {label} | {_f(b2['auc'])} {ci} | {_f(b2['logloss'])} | {_f(b2['ne'], 3)} "
                f"| {_f(b2['calibration'], 3)} | {marg} | {auc_ok} | {ne} | {_yn(c['calibration_ok'])} "
                f"| {_yn(c['pass'])} |"
            )
    conv = [
        (name, w["conversions"]) for name, w in worlds.items() if w.get("conversions", {}).get("positives")
    ]
    if conv:
        lines += [
            "",
            "| world | conversions (blocks, tower started) | pCTCVR AUC | pCTR alone | pCVR AUC among clicks "
            "| pCTR alone | CTCVR NE | CTCVR calib |",
            "|" + "---|" * 8,
        ]
        for name, c in conv:
            lines.append(
                f"| {name} | {c['positives']:,.0f} ({c['block_indexes']}) | {_f(c['auc'])} "
                f"| {_f(c['auc_by_ctr'])} "
                f"| {_f(c['clicked_auc'])} | {_f(c['clicked_auc_by_ctr'])} | {_f(c['ne'], 3)} "
                f"| {_f(c['calibration'], 3)} |"
            )
    return "\n".join(lines)


def conversion_summary(metrics_csv: Path) -> dict[str, Any]:
    """An esmm run's conversion task over the blocks its champion had a started conversion tower
    for (``cvr_started``: the tower starts once a block's corrections have caught up with its
    clicks, a conversion window into the stream; before, pCVR is a constant 1/2), from its
    progressive ``cvr_`` metrics (``metrics.csv``): logloss, NE and calibration pooled over those
    blocks' rows (exact from each block's rows, positives, mean prediction and logloss), AUCs as
    the blocks' mean weighted by their conversions, so that a small block (a replay's last one:
    only the corrections flushed at the stream's end) counts for what it holds; and per block
    pCTCVR's and pCVR's AUC and pCTCVR's calibration."""
    with metrics_csv.open() as f:
        rows = [r for r in csv.DictReader(f) if float(r.get("online_cvr_started") or 0) == 1.0]

    def col(r: dict[str, str], m: str) -> float:
        return float(r.get(f"online_cvr_{m}") or "nan")

    n = np.array([col(r, "examples") for r in rows])
    k = np.array([col(r, "positives") for r in rows])
    out: dict[str, Any] = {
        "blocks": len(rows),
        "block_indexes": [int(r["block"]) for r in rows],
        "corrections": sum(int(r.get("corrections") or 0) for r in rows),
        "positives": float(k.sum()),
        "examples": float(n.sum()),
    }
    for m in ("auc", "clicked_auc", "auc_by_ctr", "clicked_auc_by_ctr", "clicked_calibration"):
        v = np.array([col(r, m) for r in rows])
        ok = np.isfinite(v) & (k > 0)
        out[m] = float(np.average(v[ok], weights=k[ok])) if ok.any() else float("nan")

    def row_sum(m: str) -> float:  # a per-row mean times the block's rows, summed over the blocks
        return float(np.nansum([col(r, m) for r in rows] * n))

    rate = k.sum() / n.sum() if n.sum() else float("nan")
    logloss = row_sum("logloss") / n.sum() if n.sum() else float("nan")
    entropy = base_rate_entropy(rate) or float("nan")
    out |= {
        "rate": float(rate),
        "logloss": logloss,
        "ne": logloss / entropy,
        "calibration": row_sum("mean_prediction") / k.sum() if k.sum() else float("nan"),
    }
    out["per_block_auc"] = [col(r, "auc") for r in rows]
    out["per_block_clicked_auc"] = [col(r, "clicked_auc") for r in rows]
    out["per_block_calibration"] = [col(r, "calibration") for r in rows]
    out["per_block_examples"] = n.tolist()
    return out


def plot_world(name: str, world: Mapping[str, Any], learners: Sequence[str], path: Path) -> Path:
    """Per-block AUC, NE and calibration of every learner, one small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, m in zip(axes, ("auc", "ne", "calibration"), strict=True):
        for n in learners:
            if n in world.get("same_as", {}):
                continue  # drawn as the learner it is the same run as
            pts = [(b["block"], b[m]) for b in world["learners"][n]["per_block"] if math.isfinite(b[m])]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", ms=3, lw=1.2, label=n)
        if m != "auc":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        if m == "ne":
            ax.set_ylim(0.6, 1.4)
        if m == "calibration":
            ax.set_ylim(0.4, 2.0)
        ax.set_xlabel("block")
        ax.set_title(f"progressive {m}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(name, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=60)
    plt.close(fig)
    return path
