"""A backtest's report: ``metrics.csv``, ``summary.json``, PNG plots, ``index.html``, an MLflow run.

Learners are compared on the blocks where all of them exist: block 2 onwards (the static copy is
frozen after block 1, whose scores come from untrained models). Over those examples, per learner:
the pooled AUC / logloss / normalized entropy / calibration of the progressive scores and
``auc_ci95``, a seeded percentile bootstrap over examples (:mod:`pipeline.replay.bootstrap`, paired across
learners). Margins are "online better by": ``auc`` = online - other, ``logloss`` = other - online,
each with the paired bootstrap interval of the AUC difference.

``metrics.csv`` holds only what the data and seed decide (no timings), so the same inputs and seed
give a byte-identical file on the CPU.
"""

from __future__ import annotations

import csv
import html
import json
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.replay.bootstrap import paired_bootstrap_auc, percentile_ci
from trainers.incremental import BlockReport, BlockScores
from trainers.metrics import block_metrics

__all__ = ["METRICS", "block_row", "log_mlflow_run", "summarize", "write_csv", "write_html", "write_plots"]

METRICS = ("auc", "logloss", "ne", "calibration")
REFERENCE = "online"  # the learner the margins are measured for


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def block_row(report: BlockReport, learners: Sequence[str]) -> dict[str, Any]:
    """One ``metrics.csv`` row: the block's event-time range, counts, each learner's metrics, gate."""
    groups: dict[str, Mapping[str, float] | None] = {"online": report.online, "static": report.static}
    groups |= report.baselines
    row: dict[str, Any] = {
        "block": report.index,
        "event_time_min": report.event_time_min,
        "event_time_max": report.event_time_max,
        "event_time_min_iso": _iso(report.event_time_min),
        "event_time_max_iso": _iso(report.event_time_max),
        "examples": report.examples,
        "positives": report.positives,
    }
    for name in learners:
        metrics = groups.get(name) or {}
        for m in METRICS:
            row[f"{name}_{m}"] = metrics.get(m, math.nan)
    if "cvr_auc" in report.online:  # a multi-task model: its conversion task too (trainers.multitask)
        row["corrections"] = report.corrections
        row |= {f"online_{k}": v for k, v in report.online.items() if k.startswith("cvr_")}
    row["served_model_weight"] = report.served_weight  # the model's share; the base rate's the rest
    row["gate_accepted"] = int(report.decision.accepted)
    row["scored_by_version"] = report.parent_version or ""
    row["version"] = report.version or ""
    return row


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)  # floats as repr: exact, so identical runs give identical files
    return path


def summarize(
    blocks: Sequence[BlockScores], learners: Sequence[str], *, resamples: int, seed: int
) -> dict[str, Any]:
    """Pooled metrics with bootstrap CIs per learner, and the margins of the online model."""
    evaluated = [b for b in blocks if all(name in b.scores for name in learners)]
    y = np.concatenate([b.labels for b in evaluated]) if evaluated else np.zeros(0)
    scores = {
        n: np.concatenate([b.scores[n] for b in evaluated]) if evaluated else np.zeros(0) for n in learners
    }
    boot = paired_bootstrap_auc(y, scores, resamples=resamples, seed=seed)
    out: dict[str, Any] = {
        "evaluated_blocks": [b.index for b in evaluated],
        "evaluated_examples": int(y.size),
        "evaluated_positives": int(y.sum()),
        "bootstrap_resamples": resamples,
        "learners": {},
        "margins": {},
    }
    for name in learners:
        pooled = block_metrics(y, scores[name]) if y.size else {}
        per_block = [block_metrics(b.labels, b.scores[name]) for b in evaluated]
        out["learners"][name] = {m: pooled.get(m, math.nan) for m in METRICS} | {
            "auc_ci95": percentile_ci(boot[name]),
            "mean_block_auc": _nanmean([m["auc"] for m in per_block]),
            "mean_block_logloss": _nanmean([m["logloss"] for m in per_block]),
        }
    ref = out["learners"].get(REFERENCE)
    for name in learners:
        if name == REFERENCE or ref is None:
            continue
        other = out["learners"][name]
        out["margins"][f"{REFERENCE}_vs_{name}"] = {
            "auc": ref["auc"] - other["auc"],
            "auc_ci95": percentile_ci(boot[REFERENCE] - boot[name]),
            "logloss": other["logloss"] - ref["logloss"],
            "mean_block_auc": ref["mean_block_auc"] - other["mean_block_auc"],
        }
    return out


def _nanmean(xs: Sequence[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else math.nan


def write_plots(rows: Sequence[Mapping[str, Any]], learners: Sequence[str], out: Path) -> list[Path]:
    """One PNG per metric: each learner's per-block value at the block's last event time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    when = [datetime.fromtimestamp(r["event_time_max"] / 1000, UTC) for r in rows]
    paths = []
    for m in METRICS:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for name in learners:
            pts = [
                (t, r[f"{name}_{m}"])
                for t, r in zip(when, rows, strict=True)
                if math.isfinite(r[f"{name}_{m}"])
            ]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=name)
        ax.set_xlabel("event time (end of block, UTC)")
        ax.set_ylabel(f"progressive {m}")
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(mdates.AutoDateLocator()))
        ax.grid(alpha=0.3)
        if ax.lines:  # no blocks (an input of dead letters): an empty plot, no legend
            ax.legend()
        fig.tight_layout()
        path = out / f"{m}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return "-" if not math.isfinite(x) else f"{x:.4f}"
    if isinstance(x, list):
        return "[" + ", ".join(_cell(v) for v in x) + "]"
    return html.escape(str(x))


def write_html(
    summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], plots: Sequence[Path], out: Path
) -> Path:
    """A single static page: headline table, margins, the plots and the per-block table."""
    learners = summary["learners"]
    head = "".join(f"<th>{m}</th>" for m in (*METRICS, "auc_ci95"))
    lines = [
        f"<tr><td>{html.escape(n)}</td>"
        + "".join(f"<td>{_cell(v[m])}</td>" for m in (*METRICS, "auc_ci95"))
        + "</tr>"
        for n, v in learners.items()
    ]
    margins = [
        f"<li>{html.escape(k)}: AUC {_cell(v['auc'])} (95% CI {_cell(v['auc_ci95'])}), "
        f"logloss {_cell(v['logloss'])}</li>"
        for k, v in summary["margins"].items()
    ]
    cols = list(rows[0]) if rows else []
    table = "".join("<tr>" + "".join(f"<td>{_cell(r[c])}</td>" for c in cols) + "</tr>" for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>ctr backtest</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}img{{max-width:48%}}</style></head><body>
<h1>Backtest: {html.escape(str(summary.get("title", "")))}</h1>
<p>{summary["blocks"]} blocks, {summary["examples"]:,} examples, {summary["examples_per_s"]:,.0f} examples/s;
learners compared on blocks {_cell(summary["evaluated_blocks"])} ({summary["evaluated_examples"]:,} examples,
{summary["evaluated_positives"]:,} positives).</p>
{"".join(f"<p><b>Note:</b> {html.escape(h)}</p>" for h in summary.get("hints", ()))}
<table><tr><th>learner</th>{head}</tr>{"".join(lines)}</table>
<p>Margins (online better by):</p><ul>{"".join(margins)}</ul>
{"".join(f'<img src="{p.name}" alt="{p.stem}">' for p in plots)}
<h2>Per block</h2><table><tr>{"".join(f"<th>{html.escape(c)}</th>" for c in cols)}</tr>{table}</table>
</body></html>"""
    path = out / "index.html"
    path.write_text(page)
    return path


def log_mlflow_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    files: Sequence[Path],
) -> str:
    """One MLflow run: params, per-block metrics as steps, headline metrics, the report files."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    run = client.create_run(exp_id, run_name=run_name, tags={"kind": "backtest"})
    now = int(time.time() * 1000)
    metrics = [
        Metric(key, float(v), now, int(r["block"]))
        for r in rows
        for key, v in r.items()
        if isinstance(v, float) and math.isfinite(v)
    ]
    for name, v in summary["learners"].items():
        metrics += [Metric(f"{name}.{m}", float(v[m]), now, 0) for m in METRICS if math.isfinite(v[m])]
    for name, v in summary["margins"].items():
        metrics += [
            Metric(f"margin.{name}.{m}", float(v[m]), now, 0)
            for m in ("auc", "logloss")
            if math.isfinite(v[m])
        ]
    metrics.append(Metric("examples_per_s", float(summary["examples_per_s"]), now, 0))
    plist = [Param(k, str(v)[:500]) for k, v in params.items()]
    for i in range(0, max(len(metrics), 1), 1_000):  # MLflow takes at most 1,000 metrics per batch
        client.log_batch(run.info.run_id, metrics=metrics[i : i + 1_000], params=plist if i == 0 else [])
    for f in files:
        client.log_artifact(run.info.run_id, str(f))
    client.set_terminated(run.info.run_id)
    return f"{exp_id}/{run.info.run_id}"


def dump_json(obj: Any, path: Path) -> Path:
    """JSON with nan/inf as null (strict JSON readers reject NaN)."""
    path.write_text(json.dumps(_clean(obj), indent=2, default=str))
    return path


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj
