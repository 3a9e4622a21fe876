"""A/B of ``TorchLearner.learn`` between two checkouts: wall and per-CPU-second examples/s.

Run it once per checkout, alternating, with that checkout first on ``PYTHONPATH`` (it only uses
fields every version of ``TrainerConfig`` has); ``--out`` appends one JSON line per model. On a
shared machine the per-CPU-second rate (``time.process_time``, one torch thread) is the steadier
figure: it does not count the time the process waited for a core.

    for i in 1 2 3; do
      PYTHONPATH=/path/to/old python benchmarks/train_ab.py --label before --out /tmp/ab.jsonl
      PYTHONPATH=.            python benchmarks/train_ab.py --label after  --out /tmp/ab.jsonl
    done
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from pipeline.core.config import TrainerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import make_learner, synthetic_block  # a script beside this one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True, help="which checkout this is (before, after, ...)")
    p.add_argument("--models", default="deepfm,dcnv2")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--rows", type=int, default=1 << 22)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, help="append one JSON line per model here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for model in args.models.split(","):
        cfg = TrainerConfig(model=model, hash_buckets=args.rows, batch_size=args.batch, device="cpu", seed=7)
        learner = make_learner(cfg)
        block = synthetic_block(args.batch * args.steps, args.rows, seed=args.batch)
        learner.learn(block[: args.batch * 2])  # warm-up
        wall = cpu = 0.0
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            learner.learn(block)
            wall = max(wall, len(block) / (time.perf_counter() - t))
            cpu = max(cpu, len(block) / (time.process_time() - c))
        row = {"label": args.label, "model": model, "batch": args.batch, "rows": args.rows}
        row |= {"examples_per_s": round(wall), "examples_per_cpu_s": round(cpu)}
        print(f"{args.label:<8}{model:<8}wall {wall:>10,.0f} ex/s   per CPU-second {cpu:>10,.0f} ex/s")
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
