"""What the online offset and residual cost the trainer daemon: examples/s of ``IncrementalTrainer.add``
with the live scoring (``serves_offset=True``, what ``ctr trainer`` runs) against without it, same run.

With ``serves_offset`` the trainer scores each example with the champion as it is buffered (one
forward pass, no gradient), so that the offset it publishes is current; the backtest fits the same
offsets from scores it makes anyway and pays nothing. This feeds one synthetic stream
(``trainers.testing.synthetic_examples``) to a trainer with the default config (DeepFM) but smaller
blocks, in chunks as a daemon's polls hand them over, and times everything after the first block
(before it there is no champion to score with). The two settings alternate (``--repeats`` each) so
that a shared machine's load falls on both; the best of each is kept. Prints a table, writes JSON.

Four settings: ``without`` (no live scoring, ``trainer.online_residual`` off: the engine still fits
the block's offsets for its metrics), ``with`` (live scoring and the offset published as the daemon
does, once a second, residual off), ``residual`` (the same with the online residual on: the
engine learns it over each closed block for the metrics, the live path as examples arrive) and
``mixture`` (and the mixture with the click rate, ``trainer.base_rate_blend_clamp``: the defaults,
what ``ctr trainer`` runs). The first three run with the mixture off.

    python benchmarks/offset_cost.py                   # 3 blocks of 20,000 after the first
    python benchmarks/offset_cost.py --chunk 200 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from pipeline.core.config import TrainerConfig
from serving_bridge.online_offset import MemoryOffsets, OffsetPublisher
from trainers.incremental import IncrementalTrainer
from trainers.testing import InMemoryModelStore, synthetic_examples

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--block", type=int, default=20_000, help="trainer.train_every")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks after the first")
    p.add_argument("--chunk", type=int, default=500, help="examples per add() call (a daemon's poll)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting, alternating")
    p.add_argument("--out", type=Path, default=RESULTS / "offset-cost.json")
    return p.parse_args(argv)


def timed_run(
    cfg: TrainerConfig, stream: list, first: int, chunk: int, serves: bool
) -> tuple[float, int, int]:
    """Seconds to add ``stream[first:]`` after the first block, with or without live scoring (and
    then publishing what it serves at most once a second, as ``ctr trainer`` does); and the largest
    residual published (weights, bytes)."""
    # an in-memory registry: versions to publish the offset for, at the cost of a state_dict copy
    trainer = IncrementalTrainer(cfg, InMemoryModelStore(), label_delay_ms=60_000, serves_offset=serves)
    trainer.add(stream[:first])
    assert trainer.has_champion and trainer.serves_offset == serves
    board = MemoryOffsets()
    publisher = OffsetPublisher(board)
    weights = size = 0
    start = time.perf_counter()
    for at in range(first, len(stream), chunk):
        trainer.add(stream[at : at + chunk])
        if serves:
            publisher.maybe_publish(trainer)
            version = trainer.champion_version
            residual = None if version is None else board.get_residual(version)
            if residual is not None and len(residual.coords) > weights:
                weights, size = len(residual.coords), len(residual.to_bytes())
    return time.perf_counter() - start, weights, size


SETTINGS = {  # serves, residual, mixture
    "without": (False, False, False),
    "with": (True, False, False),
    "residual": (True, True, False),
    "mixture": (True, True, True),
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = TrainerConfig(train_every=args.block, device="cpu")
    stream = synthetic_examples(args.block * (args.blocks + 1), seed=5, users=20_000, items=2_000)
    timed = len(stream) - args.block
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    largest = (0, 0)  # the residual's weights and bytes, the most published
    for r in range(args.repeats):
        for name, (serves, residual, mixture) in SETTINGS.items():
            clamp = cfg.base_rate_blend_clamp if mixture else 0.0
            setting = dataclasses.replace(cfg, online_residual=residual, base_rate_blend_clamp=clamp)
            s, weights, size = timed_run(setting, stream, args.block, args.chunk, serves=serves)
            if residual:
                largest = max(largest, (weights, size))
            seconds[name].append(s)
            print(
                f"  run {r + 1} {name:>7} live scoring: {timed / s:8,.0f} examples/s ({s:.1f} s)", flush=True
            )
    rate = {name: timed / min(s) for name, s in seconds.items()}
    print(f"the largest residual published: {largest[0]:,} weights, {largest[1]:,} bytes on Redis")
    cost = 1.0 - rate["with"] / rate["without"]
    residual_cost = 1.0 - rate["residual"] / rate["without"]
    mixture_cost = 1.0 - rate["mixture"] / rate["without"]
    print(
        f"examples/s (best of {args.repeats}): without {rate['without']:,.0f}, with {rate['with']:,.0f},"
        f" with the residual {rate['residual']:,.0f}, and the mixture {rate['mixture']:,.0f} -> the live"
        f" offset costs {cost:.1%} of the trainer's throughput, offset and residual {residual_cost:.1%},"
        f" all three {mixture_cost:.1%}"
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
        "throughput_cost_with_residual": residual_cost,
        "throughput_cost_with_mixture": mixture_cost,
        "largest_residual": {"weights": largest[0], "bytes": largest[1]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
