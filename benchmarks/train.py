"""Trainer throughput: examples/s of one fine-tuning block, TorchLearner beside a plain reference loop.

For each device, model and batch size, one synthetic block (``--steps`` optimizer steps of Criteo-
shaped rows: 26 hashed categorical fields with heavy-tailed ids, 13 dense inputs) is learned twice,
timed end to end (shuffle, copies, forward, backward, optimizer, the block's loss read back):

- ``trainer``: :class:`trainers.learner.TorchLearner.learn`, the production path (row-wise lazy Adam
  on the embedding table, Adam on the rest, bf16 autocast and pinned copies on CUDA, the loss summed
  on the device and read once per block);
- ``reference``: the plain loop a first version would write: the same model with dense embedding
  gradients, one Adam over every parameter, fp32, pageable copies and ``loss.item()`` every step.

Each figure is the best of ``--repeats`` timed blocks after one warm-up block (the machine may be
shared: the best run is the least disturbed). Prints a table, writes JSON::

    {"meta": {...}, "results": {device: {model: {batch: {"examples_per_s", "reference_examples_per_s",
                                                        "speedup_vs_reference", ...}}}}}

Run: ``python benchmarks/train.py`` (CPU, and CUDA when torch sees one); ``--quick`` is a CI-sized
smoke run (small table, two batch sizes, a few steps).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.core.config import TrainerConfig
from trainers.encoding import EncodedBatch, Encoder
from trainers.learner import TorchLearner
from trainers.models import build_model

FIELDS, DENSE = 26, 13  # Criteo's shape
RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI smoke: 2^16 rows, batches 1k and 4k, 3 steps")
    p.add_argument("--devices", default="auto", help="comma list (cpu,cuda); auto = cpu + cuda if present")
    p.add_argument("--models", default="deepfm,dcnv2", help="comma list of trainers.models.MODELS names")
    p.add_argument("--batch-sizes", default="1024,4096,16384,65536", help="comma list of examples/step")
    p.add_argument("--rows", type=int, default=1 << 22, help="hashed embedding rows (up to 2^24)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per timed block")
    p.add_argument("--repeats", type=int, default=2, help="timed blocks per figure (the best is kept)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/train[-quick].json)")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.repeats = min(args.rows, 1 << 16), 3, 1
        if args.batch_sizes == p.get_default("batch_sizes"):
            args.batch_sizes = "1024,4096"
    if args.out is None:
        args.out = RESULTS / ("train-quick.json" if args.quick else "train.json")
    return args


def devices(spec: str) -> list[str]:
    if spec == "auto":
        return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return [d.strip() for d in spec.split(",") if d.strip()]


def synthetic_block(n: int, rows: int, seed: int) -> EncodedBatch:
    """``n`` Criteo-shaped rows: Zipf-distributed values per field hashed into ``rows`` buckets."""
    rng = np.random.default_rng(seed)
    values = rng.zipf(1.2, size=(n, FIELDS)).astype(np.int64)
    field_salt = np.arange(FIELDS, dtype=np.int64) * 1_000_003
    ids = ((values * 2_654_435_761 + field_salt) % rows).astype(np.int64)
    dense = rng.random((n, DENSE), dtype=np.float32)
    labels = (rng.random(n) < 0.1).astype(np.float32)
    return EncodedBatch(ids, dense, labels)


def make_cfg(model: str, rows: int, batch: int, device: str) -> TrainerConfig:
    return TrainerConfig(
        model=model, hash_buckets=rows, batch_size=batch, batch_size_cuda=batch, device=device, seed=7
    )


def make_learner(cfg: TrainerConfig) -> TorchLearner:
    enc = Encoder.from_spec(
        {
            "version": 1,
            "hash": "blake2b64",
            "hash_buckets": cfg.hash_buckets,
            "fields": [f"c{i}" for i in range(FIELDS)],
            "dense_keys": [f"i{i}" for i in range(DENSE)],
            "stream_keys": [],
        }
    )
    return TorchLearner(cfg, enc)


class ReferenceLoop:
    """The plain loop: dense embedding gradients, one Adam, fp32, ``loss.item()`` every step."""

    def __init__(self, learner: TorchLearner) -> None:
        self.device = learner.device
        self.cfg = learner.cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            self.model = build_model(learner.model_spec).to(self.device)
        for m in self.model.modules():
            if isinstance(m, torch.nn.Embedding):
                m.sparse = False
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr_dense)
        self.rng = np.random.default_rng(self.cfg.seed)

    def learn(self, block: EncodedBatch) -> float:
        assert block.labels is not None
        n, bs, total = len(block), self.cfg.batch_size, 0.0
        self.model.train()
        perm = self.rng.permutation(n)
        for start in range(0, n, bs):
            idx = perm[start : start + bs]
            ids = torch.from_numpy(block.ids[idx]).to(self.device)
            dense = torch.from_numpy(block.dense[idx]).to(self.device)
            labels = torch.from_numpy(block.labels[idx]).to(self.device)
            loss = F.binary_cross_entropy_with_logits(self.model(ids, dense), labels)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            total += loss.item() * len(idx)
        return total / n


def best_rate(learn: Callable[[EncodedBatch], float], block: EncodedBatch, repeats: int) -> float:
    """Examples/s of ``learn(block)``: one warm-up block, then the best of ``repeats``."""
    learn(block[: max(1, len(block) // 4)])
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = learn(block)  # returns a host float: the device work is finished
        dt = time.perf_counter() - t0
        if not np.isfinite(loss):
            raise RuntimeError(f"benchmarks/train.py: non-finite loss {loss}")
        best = max(best, len(block) / dt)
    return best


def measure(device: str, model: str, batch: int, args: argparse.Namespace) -> dict[str, float]:
    block = synthetic_block(batch * args.steps, args.rows, seed=batch)
    learner = make_learner(make_cfg(model, args.rows, batch, device))
    trainer = best_rate(learner.learn, block, args.repeats)
    reference_loop = ReferenceLoop(learner)
    del learner
    gc.collect()
    reference = best_rate(reference_loop.learn, block, args.repeats)
    del reference_loop
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "examples_per_s": round(trainer, 1),
        "reference_examples_per_s": round(reference, 1),
        "speedup_vs_reference": round(trainer / reference, 2),
        "examples_per_block": batch * args.steps,
    }


def meta(args: argparse.Namespace) -> dict[str, object]:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/train.py", *sys.argv[1:]]),
        "rows": args.rows,
        "fields": FIELDS,
        "dense": DENSE,
        "steps_per_block": args.steps,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": gpu,
        "reference": "dense embedding grads, one Adam, fp32, pageable copies, loss.item() per step",
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    grid = [
        (d, m, int(b))
        for d in devices(args.devices)
        for m in args.models.split(",")
        for b in args.batch_sizes.split(",")
    ]
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for k, (device, model, batch) in enumerate(grid, 1):
        r = measure(device, model, batch, args)
        results.setdefault(device, {}).setdefault(model, {})[str(batch)] = r
        print(
            f"[{k}/{len(grid)}] {device} {model} batch={batch}: {r['examples_per_s']:,.0f} ex/s, "
            f"reference {r['reference_examples_per_s']:,.0f} ex/s, x{r['speedup_vs_reference']}",
            file=sys.stderr,
            flush=True,
        )
    print(f"\nrows={args.rows:,}  steps/block={args.steps}  threads={torch.get_num_threads()}")
    print(f"{'device':<7}{'model':<8}{'batch':>7}{'trainer ex/s':>15}{'reference ex/s':>17}{'speedup':>9}")
    for device, models in results.items():
        for model, batches in models.items():
            for batch, r in batches.items():
                print(
                    f"{device:<7}{model:<8}{batch:>7}{r['examples_per_s']:>15,.0f}"
                    f"{r['reference_examples_per_s']:>17,.0f}{r['speedup_vs_reference']:>8.2f}x"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta(args), "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
