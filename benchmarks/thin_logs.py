"""What a log with few clicks lets any learner show: the limits behind the quality suite's checks
on the real samples (issue 13's "NE < 1 over blocks 2+" and "calibration within [0.9, 1.1]").

For each real world of ``benchmarks/quality.py``, on the same rows in the same blocks (the labelled
examples ``ctr backtest`` writes, each block in impression-time order, as the suite scores them),
over blocks 2+:

- **clicks**, and how many blocks have the 100 clicks the per-block NE check needs;
- **in hindsight**, fitted on the judged rows themselves: the base rate (NE 1 by definition) and a
  click rate per value of the log's position field (``position``; Avazu's ``banner_pos``): the best
  NE a learner that knows only the position effect could reach, had it known it from the start;
- **prequential Bayes learners**, the most generous online references there are: each sees every
  label the moment after its row (a real learner waits the attribution window), starts from the
  log's own click rate (known only in hindsight) and has its prior's strength chosen in hindsight,
  on the judged rows, from a grid: ``base rate`` (Beta-Bernoulli) and ``base rate + position`` (each
  position's rate shrunk towards the running base rate);
- **calibration**: the chance that a *perfectly* calibrated predictor's predicted / observed clicks
  falls within [0.9, 1.1] (observed clicks Poisson with mean the predicted sum, taken as the observed
  count), and the 95% range of that ratio;
- the suite's own figures for the default model and ``baserate`` (``results/quality.json``).

If even the generous references stay above NE 1 on a log, NE < 1 there is out of reach for any
learner, however good, and "NE at most baserate's" is what the suite can judge.

    python benchmarks/thin_logs.py [--worlds obd-random-men,...] [--datasets ../shared/datasets]

Prints a table and writes ``benchmarks/results/thin_logs.json``. Needs no services (about a
minute: one replay of each log).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import REAL_BLOCK, WORLDS, open_world_source
from quality_report import BLOCK_MIN_POSITIVES, CALIBRATION

from pipeline.core.config_loader import load_config
from pipeline.replay.backtest import run_backtest
from trainers.metrics import normalized_entropy

ROOT = Path(__file__).resolve().parent.parent
POSITION_FIELDS = ("position", "banner_pos")  # the first one the log's features carry
# the grid of prior strengths (pseudo-rows); the largest is all but the log's own rate, held fixed
PRIOR_ROWS = (10, 100, 1_000, 3_000, 10_000, 30_000, 100_000, 1_000_000)


def calibration_chance(clicks: float, lo: float = CALIBRATION[0], hi: float = CALIBRATION[1]) -> float:
    """P(lo <= E / O <= hi) for O ~ Poisson(E), E = ``clicks``: how often a perfectly calibrated
    predictor passes the calibration check on a log with that many expected clicks.

    >>> round(calibration_chance(40), 2), round(calibration_chance(10_000), 2)
    (0.47, 1.0)
    """
    if clicks <= 0:
        return 0.0
    first, last = math.ceil(clicks / hi), math.floor(clicks / lo)
    return sum(math.exp(k * math.log(clicks) - clicks - math.lgamma(k + 1)) for k in range(first, last + 1))


def calibration_range(clicks: float) -> tuple[float, float]:
    """The 95% range of E / O for O ~ Poisson(E) (normal approximation with continuity), E = ``clicks``."""
    half = 1.96 * math.sqrt(clicks) + 0.5
    return clicks / (clicks + half), clicks / max(clicks - half, 0.5)


def prequential(
    labels: np.ndarray, keys: Sequence[str] | None, start: float, base_rows: float, key_rows: float
) -> np.ndarray:
    """Each row's probability from the rows before it (predict, then learn the label at once): the
    base rate with a Beta prior of ``base_rows`` pseudo-rows at ``start``; with ``keys``, each key's
    rate with ``key_rows`` pseudo-rows at the running base rate."""
    clicks, rows = start * base_rows, float(base_rows)
    per_key: dict[str, list[float]] = {}
    out = np.empty(len(labels))
    for i, y in enumerate(labels.tolist()):
        base = clicks / rows
        if keys is None:
            out[i] = base
        else:
            c, n = per_key.setdefault(keys[i], [0.0, 0.0])
            out[i] = (c + key_rows * base) / (n + key_rows)
            per_key[keys[i]][0] += y
            per_key[keys[i]][1] += 1
        clicks, rows = clicks + y, rows + 1
    return out


def judged_rows(name: str, datasets: Path) -> tuple[np.ndarray, list[str], int, int, str | None]:
    """The world's labels and position values in the suite's scoring order, its block size, and
    where blocks 2+ start; the position field used (None if the log has none)."""
    spec = WORLDS[name]
    cfg = load_config(None)
    block = spec.block or REAL_BLOCK
    cfg.trainer.model, cfg.trainer.train_every, cfg.trainer.seed = "lr", block, spec.seed
    cfg.backtest.bootstrap_resamples = 0
    with tempfile.TemporaryDirectory(prefix=f"thin-{name}-") as tmp:
        examples = Path(tmp) / "examples.jsonl"
        source = open_world_source(cfg, spec, 0, datasets, Path(tmp))
        run_backtest(
            cfg,
            source,
            Path(tmp),
            title=name,
            seed=spec.seed,
            quiet=True,
            mlflow_run=False,
            ftrl=False,
            examples_out=examples,
        )
        rows = [json.loads(line) for line in examples.open("rb")]
    features = rows[0]["impression"]["features"] if rows else {}
    field = next((f for f in POSITION_FIELDS if f in features), None)
    labels: list[float] = []
    keys: list[str] = []
    for lo in range(0, len(rows), block):  # a block is scored in impression-time order, stably
        chunk = sorted(rows[lo : lo + block], key=lambda r: r["impression"]["ts"])
        labels += [float(r["label"]) for r in chunk]
        keys += [str(r["impression"]["features"].get(field, "")) if field else "" for r in chunk]
    return np.array(labels), keys, block, min(block, len(labels)), field


def analyse(name: str, datasets: Path) -> dict[str, Any]:
    y, keys, block, start, field = judged_rows(name, datasets)
    judged, jkeys = y[start:], keys[start:]
    clicks = float(judged.sum())
    per_block = [float(judged[i : i + block].sum()) for i in range(0, len(judged), block)]
    key_of = np.array(jkeys)
    rate_of = {k: float(judged[key_of == k].mean()) for k in set(jkeys)}
    hindsight_position = normalized_entropy(judged, np.array([rate_of[k] for k in jkeys]))
    log_rate = float(y.mean())

    def best(with_keys: bool) -> dict[str, Any]:
        grid = [(b, k) for b in PRIOR_ROWS for k in (PRIOR_ROWS if with_keys else (0,))]
        scored = [
            (
                normalized_entropy(
                    judged, prequential(y, keys if with_keys else None, log_rate, b, k)[start:]
                ),
                b,
                k,
            )
            for b, k in grid
        ]
        value, b, k = min(scored)
        return {"ne": value, "prior_rows": b} | ({"position_prior_rows": k} if with_keys else {})

    lo, hi = calibration_range(clicks)
    return {
        "rows": len(y),
        "block": block,
        "judged_rows": len(judged),
        "clicks_blocks2": clicks,
        "blocks_with_100_clicks": sum(c >= BLOCK_MIN_POSITIVES for c in per_block),
        "position_field": field,
        "position_rates": {k: round(v, 5) for k, v in sorted(rate_of.items())},
        "hindsight_position_ne": hindsight_position,
        "prequential_base_rate": best(False),
        "prequential_base_rate_position": best(True) if field else None,
        "perfect_calibration_pass_chance": calibration_chance(clicks),
        "perfect_calibration_range95": [lo, hi],
    }


def suite_figures(path: Path, name: str) -> dict[str, Any]:
    """The default model's and baserate's NE and calibration over blocks 2+ from the suite's file."""
    if not path.exists():
        return {}
    world = json.loads(path.read_text())["worlds"].get(name, {})
    return {
        learner: {k: world["learners"][learner]["blocks2"][k] for k in ("ne", "calibration")}
        for learner in ("default", "baserate")
        if learner in world.get("learners", {})
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    real = [n for n, s in WORLDS.items() if s.real]
    p.add_argument("--worlds", default=",".join(real), help=f"comma-separated, of: {', '.join(real)}")
    p.add_argument("--datasets", type=Path, default=ROOT.parent / "shared" / "datasets")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "thin_logs.json")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for name in [w.strip() for w in args.worlds.split(",") if w.strip()]:
        if name not in real:
            raise SystemExit(
                f"thin_logs: {name!r} is not a real world of the suite; known: {', '.join(real)}"
            )
        if not (args.datasets / WORLDS[name].path).exists():
            print(f"{name}: {args.datasets / WORLDS[name].path} not found, skipped", file=sys.stderr)
            continue
        print(f"{name}: replaying ...", file=sys.stderr, flush=True)
        results[name] = analyse(name, args.datasets) | {
            "suite": suite_figures(ROOT / "benchmarks" / "results" / "quality.json", name)
        }
    print(
        "| world | clicks (blocks 2+) | blocks >= 100 clicks | hindsight position NE"
        " | prequential base rate NE | + position NE | P(perfect calibration in [0.9, 1.1])"
        " | default NE / calibration (suite) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        pos = r["prequential_base_rate_position"]
        d = r["suite"].get("default")
        default = f"{d['ne']:.4f} / {d['calibration']:.3f}" if d else "-"
        print(
            f"| {name} | {r['clicks_blocks2']:.0f} | {r['blocks_with_100_clicks']}"
            f" | {r['hindsight_position_ne']:.4f}"
            f" | {r['prequential_base_rate']['ne']:.4f} | {pos['ne'] if pos else float('nan'):.4f}"
            f" | {r['perfect_calibration_pass_chance']:.2f}"
            f" | {default} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "command": " ".join(["python benchmarks/thin_logs.py", *(argv or sys.argv[1:])]),
                "worlds": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
