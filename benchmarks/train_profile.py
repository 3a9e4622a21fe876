"""Where a trainer step spends its time: torch.profiler over TorchLearner.learn on one synthetic block.

Prints the top operators by self time (and the block's examples/s, profiler overhead included).
Same synthetic Criteo-shaped rows as ``benchmarks/train.py``. To profile another version of the
trainer (e.g. before a change), put its checkout first on ``PYTHONPATH``; the script only uses
fields every version of ``TrainerConfig`` has.

Run: ``python benchmarks/train_profile.py --model deepfm --batch 4096 --rows 4194304 --threads 1``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.core.config import TrainerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import make_learner, synthetic_block  # a script beside this one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="deepfm")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--rows", type=int, default=1 << 22)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    p.add_argument("--top", type=int, default=15, help="operators to list")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = TrainerConfig(
        model=args.model, hash_buckets=args.rows, batch_size=args.batch, device=args.device, seed=7
    )
    learner = make_learner(cfg)
    block = synthetic_block(args.batch * args.steps, args.rows, seed=args.batch)
    learner.learn(block[: args.batch * 2])  # warm-up: optimizer state, allocator
    activities = [ProfilerActivity.CPU]
    if learner.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        learner.learn(block)
        dt = time.perf_counter() - t0
    sort = "self_cuda_time_total" if learner.device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top))
    print(
        f"{args.model} batch={args.batch} rows={args.rows:,} steps={args.steps} "
        f"threads={torch.get_num_threads()}: {len(block) / dt:,.0f} examples/s under the profiler, "
        f"{dt / args.steps * 1e3:.1f} ms/step"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
