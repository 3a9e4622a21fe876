"""The default model against FTRL over several trainer seeds: how much one world's margin owes to luck.

``quality.py`` replays each world with one trainer seed (the world's). On a small real log that is
one draw: on Avazu's first hour (8,000 scored rows) the default's margin over FTRL moved from
-0.007 to -0.067 between seeds at the same code. This script replays each world with every seed of
``--seeds`` (the seed of the trainer's initialisation and shuffles, of the click delays and of the
simulator, exactly as ``ctr backtest --seed``), through :func:`quality.run_world`, and reports per
world the default model's and FTRL's AUC, NE and calibration over blocks 2+ for every seed, and the
margin's mean, its worst and best seed.

    python benchmarks/seeds.py                                   # the real logs, seeds 7-12
    python benchmarks/seeds.py --worlds avazu --seeds 1,2,3 --set trainer.min_steps=0

Prints a table and writes ``benchmarks/results/seeds.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import quality

REAL = "avazu,obd-all,obd-random-men,obd-random-women,obd-bts-men,obd-bts-women"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default=REAL, help=f"comma-separated quality.py worlds (default: {REAL})")
    p.add_argument("--seeds", default="7,8,9,10,11,12", help="comma-separated trainer seeds")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--out", type=Path, default=quality.ROOT / "benchmarks" / "results" / "seeds.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    sets = [x for s in a.set for x in ("--set", s)]
    args = quality.parse_args(["--worlds", a.worlds, "--learners", "default,ftrl", *sets])
    args.env = {**os.environ, **quality.overrides(args.set)}
    base = quality.load_config(args.config, env=args.env)
    known = quality.WORLDS | quality.HELDOUT
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    t0 = time.perf_counter()
    worlds: dict[str, Any] = {}
    print(f"{'world':18s} {'margin mean':>12s} {'worst':>8s} {'best':>8s}  default AUC / FTRL AUC per seed")
    for w in [w.strip() for w in a.worlds.split(",") if w.strip()]:
        if w not in known:
            raise SystemExit(f"seeds: unknown world {w!r}; known: {', '.join(known)}")
        runs = []
        for seed in seeds:
            spec = dataclasses.replace(known[w], seed=seed)
            r = quality.run_world(w, spec, base, args, ["default", "ftrl"], lambda *_: None)
            d, f = (r["learners"][n]["blocks2"] for n in ("default", "ftrl"))
            runs.append(
                {
                    "seed": seed,
                    **{f"default_{k}": d[k] for k in ("auc", "ne", "calibration")},
                    **{f"ftrl_{k}": f[k] for k in ("auc", "ne", "calibration")},
                    "margin": d["auc"] - f["auc"],
                }
            )
        margins = np.array([r["margin"] for r in runs])
        worlds[w] = {
            "runs": runs,
            "margin_mean": float(margins.mean()),
            "margin_worst": float(margins.min()),
            "margin_best": float(margins.max()),
            "default_ne_mean": float(np.mean([r["default_ne"] for r in runs])),
            "default_calibration_mean": float(np.mean([r["default_calibration"] for r in runs])),
        }
        pairs = " ".join(f"{r['default_auc']:.4f}/{r['ftrl_auc']:.4f}" for r in runs)
        spread = f"{margins.mean():+12.4f} {margins.min():+8.4f} {margins.max():+8.4f}"
        print(f"{w:18s} {spread}  {pairs}", flush=True)
    meta = {
        "commit": quality.git_commit(),
        "uncommitted_changes": quality.dirty_files(),
        "command": " ".join(["python benchmarks/seeds.py", *(argv if argv is not None else sys.argv[1:])]),
        "seeds": seeds,
        "overrides": a.set,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    quality.dump_json({"meta": meta, "worlds": worlds}, a.out)
    print(f"{len(worlds)} worlds x {len(seeds)} seeds in {meta['wall_s']:.0f}s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
