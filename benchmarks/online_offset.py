"""What-if for issue 13: a per-version intercept that follows the joined labels within a block.

Each block is scored by one version, the champion trained on the blocks before it; where the click
rate moved since (seasonality, life cycles, shifts) its intercept is off for the whole block, and the
per-block correction (``trainer.intercept_gain``) moves it once a block. This replays worlds of
the quality suite through ``ctr backtest``'s engine (:func:`pipeline.replay.backtest.run_backtest`,
default model and FTRL) and, on each learner's progressive scores, lets the serving version's
intercept follow the labels already joined for it: every ``--every`` examples,
:func:`trainers.calibration.fit_shift` over that version's newest ``--recent`` examples whose
attribution window had closed by then (event times interpolated within a block between its first
and last impression; a new version starts at 0). Predict-then-learn holds: an example's offset uses
only labels known before its impression.

Nothing here changes a learner. It measures whether the loop is worth building (the trainer
publishing each version's offset, replicas adding it to the logit) before it is built. Prints a table,
writes ``results/online-offset.json``.

    python benchmarks/online_offset.py                        # lifecycle, shifts-2, sim-sparse, sim-default
    python benchmarks/online_offset.py --worlds lifecycle-2 --every 500 --recent 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from quality import REAL_BLOCK, SYNTHETIC_BLOCK, SYNTHETIC_IMPRESSIONS, WORLDS, open_world_source

from pipeline.core.config_loader import load_config
from pipeline.replay.backtest import run_backtest
from trainers.calibration import fit_shift
from trainers.metrics import calibration, normalized_entropy

RESULTS = Path(__file__).resolve().parent / "results"
LEARNERS = {"online": "default", "ftrl": "ftrl"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="lifecycle,shifts-2,sim-sparse,sim-default")
    p.add_argument("--every", type=int, default=1_000, help="examples between two offset updates")
    p.add_argument("--recent", type=int, default=20_000, help="newest labelled examples an update fits on")
    p.add_argument(
        "--datasets", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "datasets"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "online-offset.json")
    return p.parse_args(argv)


def offsets(
    z: np.ndarray,
    y: np.ndarray,
    t: np.ndarray,
    version: np.ndarray,
    args: argparse.Namespace,
    window_ms: float,
) -> np.ndarray:
    """Each example's offset: fitted on its version's examples labelled before its impression."""
    out = np.zeros_like(z)
    known = 0  # examples [0, known) have their label by the current impression time
    for s in range(0, len(z), args.every):
        while known < s and t[known] + window_ms <= t[s]:
            known += 1
        lo = max(known - args.recent, int(np.searchsorted(version, version[s])))
        if known - lo >= 100:
            out[s : s + args.every] = fit_shift(z[lo:known], y[lo:known])
    return out


def summarise(y: np.ndarray, p: np.ndarray, block: np.ndarray) -> dict[str, Any]:
    """NE and calibration over blocks 2+ and per block; whether every block with 100 clicks has NE < 1."""
    later = block >= 2
    per = []
    for k in np.unique(block[later]):
        m = block == k
        per.append(
            {
                "block": int(k),
                "positives": int(y[m].sum()),
                "ne": round(normalized_entropy(y[m], p[m]), 4),
                "calibration": round(calibration(y[m], p[m]), 3),
            }
        )
    return {
        "ne": round(normalized_entropy(y[later], p[later]), 4),
        "calibration": round(calibration(y[later], p[later]), 3),
        "every_block_ne_lt_1": all(b["ne"] < 1 for b in per if b["positives"] >= 100),
        "per_block": per,
    }


def run_world(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = WORLDS[name]
    cfg = load_config(None, env={})
    impressions = 0 if spec.real else spec.impressions or SYNTHETIC_IMPRESSIONS[0]
    cfg.trainer.train_every = (
        (spec.block or REAL_BLOCK) if spec.real else (spec.train_every or SYNTHETIC_BLOCK[0])
    )
    cfg.trainer.seed = spec.seed
    cfg.backtest.bootstrap_resamples = 0
    with tempfile.TemporaryDirectory(prefix=f"offset-{name}-") as tmp:
        source = open_world_source(cfg, spec, impressions, args.datasets, Path(tmp))
        result = run_backtest(
            cfg, source, Path(tmp), title=name, seed=spec.seed, quiet=True, mlflow_run=False
        )
    blocks = [b for b in result.scores if b.labels.size]
    y = np.concatenate([b.labels for b in blocks]).astype(np.float64)
    t = np.concatenate([np.linspace(b.event_time_min, b.event_time_max, b.labels.size) for b in blocks])
    version = np.concatenate([np.full(b.labels.size, b.index) for b in blocks])
    out: dict[str, Any] = {"block": cfg.trainer.train_every, "window_s": cfg.joiner.attribution_window_s}
    for key, learner in LEARNERS.items():
        p = np.clip(np.concatenate([b.scores[key] for b in blocks]).astype(np.float64), 1e-7, 1 - 1e-7)
        z = np.log(p / (1 - p))
        q = 1 / (1 + np.exp(-(z + offsets(z, y, t, version, args, cfg.joiner.attribution_window_s * 1000))))
        out[learner] = {"served": summarise(y, p, version), "with_offset": summarise(y, q, version)}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {}
    print(
        f"{'world':<12}{'learner':<9}{'NE 2+':>8}{'-> offset':>10}{'cal 2+':>8}{'-> offset':>10}"
        "  every block NE < 1"
    )
    for name in [w.strip() for w in args.worlds.split(",") if w.strip()]:
        if name not in WORLDS:
            raise SystemExit(f"online_offset: unknown world {name!r}; known: {', '.join(WORLDS)}")
        print(f"{name}: replaying ...", file=sys.stderr, flush=True)
        results[name] = run_world(name, args)
        for learner in LEARNERS.values():
            a, b = results[name][learner]["served"], results[name][learner]["with_offset"]
            print(
                f"{name:<12}{learner:<9}{a['ne']:>8.4f}{b['ne']:>10.4f}{a['calibration']:>8.3f}"
                f"{b['calibration']:>10.3f}  {a['every_block_ne_lt_1']} -> {b['every_block_ne_lt_1']}"
            )
    meta = {
        "every": args.every,
        "recent": args.recent,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "worlds": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
