"""What the online offset costs the trainer daemon: examples/s of ``IncrementalTrainer.add`` with the
live scoring (``serves_offset=True``, what ``ctr trainer`` runs) against without it, same run.

With ``serves_offset`` the trainer scores each example with the champion as it is buffered (one
forward pass, no gradient), so that the offset it publishes is current; the backtest fits the same
offsets from scores it makes anyway and pays nothing. This feeds one synthetic stream
(``trainers.testing.synthetic_examples``) to a trainer with the default config (DeepFM) but smaller
blocks, in chunks as a daemon's polls hand them over, and times everything after the first block
(before it there is no champion to score with). The two settings alternate (``--repeats`` each) so
that a shared machine's load falls on both; the best of each is kept. Prints a table, writes JSON.

    python benchmarks/offset_cost.py                   # 3 blocks of 20,000 after the first
    python benchmarks/offset_cost.py --chunk 200 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from pipeline.core.config import TrainerConfig
from trainers.incremental import IncrementalTrainer
from trainers.testing import synthetic_examples

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--block", type=int, default=20_000, help="trainer.train_every")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks after the first")
    p.add_argument("--chunk", type=int, default=500, help="examples per add() call (a daemon's poll)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting, alternating")
    p.add_argument("--out", type=Path, default=RESULTS / "offset-cost.json")
    return p.parse_args(argv)


def timed_run(cfg: TrainerConfig, stream: list, first: int, chunk: int, serves: bool) -> float:
    """Seconds to add ``stream[first:]`` after the first block, with or without live scoring."""
    trainer = IncrementalTrainer(cfg, None, label_delay_ms=60_000, serves_offset=serves)
    trainer.add(stream[:first])
    assert trainer.has_champion and trainer.serves_offset == serves
    start = time.perf_counter()
    for at in range(first, len(stream), chunk):
        trainer.add(stream[at : at + chunk])
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = TrainerConfig(train_every=args.block, device="cpu")
    stream = synthetic_examples(args.block * (args.blocks + 1), seed=5, users=20_000, items=2_000)
    timed = len(stream) - args.block
    seconds: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(args.repeats):
        for name in ("without", "with"):
            s = timed_run(cfg, stream, args.block, args.chunk, serves=name == "with")
            seconds[name].append(s)
            print(
                f"  run {r + 1} {name:>7} live scoring: {timed / s:8,.0f} examples/s ({s:.1f} s)", flush=True
            )
    rate = {name: timed / min(s) for name, s in seconds.items()}
    cost = 1.0 - rate["with"] / rate["without"]
    print(
        f"examples/s (best of {args.repeats}): without {rate['without']:,.0f}, with {rate['with']:,.0f}"
        f" -> the live offset costs {cost:.1%} of the trainer's throughput"
    )
    result = {
        "meta": {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "model": cfg.model,
            "train_every": args.block,
            "timed_examples": timed,
            "chunk": args.chunk,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
        "seconds": seconds,
        "examples_per_s": rate,
        "throughput_cost": cost,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
