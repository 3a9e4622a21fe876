"""A log with many fields, replayed the way an outside user would: the default model against FTRL.

Every world of ``quality.py`` but the real samples has 6-10 categorical fields; Criteo's logs have
26 (and 13 integer columns), Avazu's 23. This script writes streams in Criteo's TSV layout
(``label, I1..I13, C1..C26``, no header, no timestamps) from a hidden logistic model of the kind
that favours online logistic regression: 26 fields whose values are Zipf(1.3) draws from
vocabularies of 5 to 100,000 (most values rare), first-order weights on ten of them (sd 0.4) and
small ones on the rest (sd 0.05), four pairwise interactions (4-dim factors), one integer column
with an effect, ~25-30% CTR. Each stream is replayed by ``ctr backtest --format criteo`` with its
defaults but ``--train-every`` and ``--seed``, once with the configuration as it is and once per
``--compare`` setting (environment overrides, e.g. the learner before a change), and the AUC
margin of the online model over FTRL (blocks 2+, paired bootstrap CI) is taken from
``summary.json``. Never used to choose a default.

    python benchmarks/many_fields.py     # 2 streams x 2 trainer seeds, 20k rows, blocks of 4k
    python benchmarks/many_fields.py --compare "CTR_TRAINER_MIN_STEPS=0"

Prints a table and writes ``benchmarks/results/many-fields.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIELDS, INTS = 26, 13
PAIRS = ((0, 1), (2, 3), (1, 4), (5, 6))


def write_stream(path: Path, rows: int, seed: int) -> float:
    """``rows`` Criteo-layout lines from the hidden model of seed ``seed``; returns the click rate."""
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.choice([5, 20, 100, 1_000, 10_000, 100_000], FIELDS)]
    first = [rng.normal(0, 0.4 if j < 10 else 0.05, s) for j, s in enumerate(sizes)]
    factors = [rng.normal(0, 0.5, (s, 4)) for s in sizes]
    clicks = 0
    with path.open("w") as f:
        for _ in range(rows):
            c = [min(int(rng.zipf(1.3)) - 1, s - 1) for s in sizes]
            ints = rng.poisson(3, INTS)
            z = -1.6 + sum(first[j][c[j]] for j in range(FIELDS)) + 0.1 * (ints[0] - 3)
            z += sum(float(factors[a][c[a]] @ factors[b][c[b]]) for a, b in PAIRS)
            y = int(rng.random() < 1 / (1 + np.exp(-z)))
            clicks += y
            cats = [format((j * 7919 + v * 104729) % (1 << 32), "08x") for j, v in enumerate(c)]
            f.write("\t".join([str(y), *map(str, ints), *cats]) + "\n")
    return clicks / rows


def backtest(stream: Path, out: Path, train_every: int, seed: int, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pipeline.ops.cli", "backtest", "--source", str(stream)]
    cmd += ["--format", "criteo", "--train-every", str(train_every), "--seed", str(seed), "--out", str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, capture_output=True)
    s = json.loads((out / "summary.json").read_text())
    online, ftrl, margin = s["learners"]["online"], s["learners"]["ftrl"], s["margins"]["online_vs_ftrl"]
    return {
        "online_auc": online["auc"],
        "ftrl_auc": ftrl["auc"],
        "margin": margin["auc"],
        "margin_ci95": margin["auc_ci95"],
        "online_ne": online["ne"],
        "online_calibration": online["calibration"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--streams", default="1,2", help="comma-separated stream seeds")
    p.add_argument("--seeds", default="7,8", help="comma-separated trainer seeds (ctr backtest --seed)")
    p.add_argument("--train-every", type=int, default=4_000)
    p.add_argument("--compare", action="append", default=[], help='a setting: "VAR=VALUE VAR=VALUE"')
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "many-fields.json")
    a = p.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CTR_")}
    base["PYTHONPATH"] = str(ROOT)
    settings = {"as configured": {}} | {c: dict(kv.split("=", 1) for kv in shlex.split(c)) for c in a.compare}
    t0, runs = time.perf_counter(), []
    print(f"{'stream':>6s} {'seed':>4s}  {'setting':40s} {'online':>7s} {'FTRL':>7s}  margin [95% CI]")
    with tempfile.TemporaryDirectory(prefix="many-fields-") as tmp:
        for stream_seed in [int(s) for s in a.streams.split(",")]:
            stream = Path(tmp) / f"stream-{stream_seed}.tsv"
            ctr = write_stream(stream, a.rows, stream_seed)
            for seed in [int(s) for s in a.seeds.split(",")]:
                for name, env in settings.items():
                    r = backtest(stream, Path(tmp) / "out", a.train_every, seed, base | env)
                    runs.append({"stream": stream_seed, "ctr": ctr, "seed": seed, "setting": name, **r})
                    lo, hi = r["margin_ci95"]
                    print(
                        f"{stream_seed:>6d} {seed:>4d}  {name:40s} {r['online_auc']:.4f} {r['ftrl_auc']:.4f}"
                        f"  {r['margin']:+.4f} [{lo:+.4f}, {hi:+.4f}]",
                        flush=True,
                    )
    means = {n: float(np.mean([r["margin"] for r in runs if r["setting"] == n])) for n in settings}
    for n, m in means.items():
        print(f"mean margin over FTRL, {n}: {m:+.4f}")
    meta = {
        "command": " ".join(["python benchmarks/many_fields.py", *(sys.argv[1:] if argv is None else argv)]),
        "rows": a.rows,
        "train_every": a.train_every,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"meta": meta, "mean_margin": means, "runs": runs}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
