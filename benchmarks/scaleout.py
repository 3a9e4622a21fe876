"""Scale-out: trainer examples/s with 1 and more ranks (row-sharded tables, trainers/sharding.py).

For each rank count, ``torchrun --standalone --nproc-per-node R`` runs this script's ``--rank``
mode: every rank builds the same learner (DeepFM on Criteo-shaped rows, ``benchmarks/train.py``'s
synthetic blocks), learns ``--blocks`` blocks of ``--examples`` rows after one warm-up block, and
reports the timed blocks' examples/s, the rows of each hashed table it holds, and its peak
resident memory. The ranks share the machine's cores: ``R`` ranks get ``cores / R`` torch threads
each, one process gets them all, so the figures compare the same CPU time spent two ways. The
reference is the one-process learner (the default, what runs without torchrun).

Run: ``python benchmarks/scaleout.py`` (ranks 1 and 2, 2^20 and 2^24 rows); ``--quick`` for a smoke
run. Writes ``benchmarks/results/scaleout.json``::

    {"meta": {...}, "trainer": {"<rows>": {"<ranks>": {"examples_per_s", "rows_per_rank",
                                                       "peak_rss_mb_per_rank", ...}}}}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import make_cfg, make_learner, synthetic_block  # a script beside this one

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2", help="comma list of rank counts")
    p.add_argument("--rows", default=f"{1 << 20},{1 << 24}", help="comma list of hashed table rows")
    p.add_argument("--examples", type=int, default=65_536, help="examples per block")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks (after one warm-up block)")
    p.add_argument("--batch", type=int, default=4096, help="examples per optimizer step (all ranks)")
    p.add_argument("--quick", action="store_true", help="smoke: 2^16 rows, blocks of 8k, 1 timed block")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/scaleout[-quick].json)")
    p.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # the per-rank mode, under torchrun
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.examples, args.blocks = str(1 << 16), 8192, 1
    return args


def rank_main(args: argparse.Namespace) -> None:
    """One rank: learn the blocks, write what it measured to ``--rank-out``-<rank>.json."""
    from trainers.sharding import join_launched_group

    sharding = join_launched_group("cpu")
    world = 1 if sharding is None else sharding.world
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    rows = int(args.rows)
    learner = make_learner(make_cfg("deepfm", rows, args.batch, "cpu"))
    blocks = [synthetic_block(args.examples, rows, seed=b) for b in range(args.blocks + 1)]
    learner.learn(blocks[0])  # warm-up: first-touch of the tables and optimizer state
    start = time.perf_counter()
    for block in blocks[1:]:
        learner.learn(block)
    seconds = time.perf_counter() - start
    held = {n: m.num_embeddings for n, m in learner.model.named_modules() if n.endswith(".table")}
    rank = 0 if sharding is None else sharding.rank
    out = {
        "examples_per_s": args.examples * args.blocks / seconds,
        "seconds": seconds,
        "rows_per_rank": held,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }
    Path(f"{args.rank_out}-{rank}.json").write_text(json.dumps(out))


def measure(ranks: int, rows: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    base = scratch / f"r{ranks}-{rows}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd += [__file__, "--rank-out", str(base), "--rows", str(rows), "--examples", str(args.examples)]
    cmd += ["--blocks", str(args.blocks), "--batch", str(args.batch)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks))}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    per_rank = [json.loads(Path(f"{base}-{r}.json").read_text()) for r in range(ranks)]
    first = per_rank[0]
    return {
        "examples_per_s": round(min(float(p["examples_per_s"]) for p in per_rank), 1),
        "rows_per_rank": first["rows_per_rank"],
        "peak_rss_mb_per_rank": [round(float(p["peak_rss_mb"])) for p in per_rank],
        "threads_per_rank": first["threads"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_out is not None:
        rank_main(args)
        return 0
    import tempfile

    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ctr-scaleout-") as tmp:
        for rows in (int(r) for r in args.rows.split(",")):
            results[str(rows)] = {}
            for ranks in (int(r) for r in args.ranks.split(",")):
                print(f"trainer: {rows:,} rows, {ranks} rank(s) ...", file=sys.stderr, flush=True)
                r = results[str(rows)][str(ranks)] = measure(ranks, rows, args, Path(tmp))
                print(
                    f"  {r['examples_per_s']:>10,.0f} examples/s  rows per rank {r['rows_per_rank']}  "
                    f"peak RSS MB {r['peak_rss_mb_per_rank']}",
                    flush=True,
                )
            one = results[str(rows)].get("1")
            for r in results[str(rows)].values():
                if one is not None:
                    r["ratio_to_one_process"] = round(r["examples_per_s"] / one["examples_per_s"], 3)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/scaleout.py", *(argv if argv is not None else sys.argv[1:])]),
        "examples_per_block": args.examples,
        "timed_blocks": args.blocks,
        "batch_all_ranks": args.batch,
        "model": "deepfm",
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cpu": platform.machine(),
        "load_avg_1m": os.getloadavg()[0],
        "reference": "one process, all cores (what runs without torchrun)",
    }
    out = args.out or RESULTS / ("scaleout-quick.json" if args.quick else "scaleout.json")
    out.write_text(json.dumps({"meta": meta, "trainer": results}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
