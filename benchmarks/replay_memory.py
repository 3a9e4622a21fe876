"""Peak memory of ``ctr backtest`` against the length of the log: does a replay hold the stream?

A replay must run in memory bounded by its windows and its model, not by the length of its input:
a day of Criteo's display log is 45.8M rows. This writes Criteo-layout logs
(:mod:`benchmarks.criteo_like`: no user ids, so every event goes to one partition of three) of each
``--rows`` length, runs ``ctr backtest --format criteo`` on each in a child process with the default
config, and reads the child's peak resident memory: ``VmHWM`` of its own address space, which the
child reads from ``/proc/self/status`` as it exits. (``wait4``'s ``ru_maxrss`` would not do: Linux
carries into it the peak of the address space the child was spawned from, i.e. of this process.)

``--log clickless`` writes instead the simulator's stream (JSONL, ``ctr simulate``'s format) with
every click of the users of one partition of three taken out: a replay used to hold that
partition's impressions, and through the example merge every other partition's examples, until
its input ended (:mod:`pipeline.join.lookahead`).

Reported per length: peak RSS, wall seconds, examples/s (the backtest's own ``summary.json``), and
over all lengths the least-squares growth in MB per 100,000 rows. ``--code DIR`` runs another
checkout (e.g. a ``git worktree`` of an older commit) with the same logs, for a before/after in one
sitting.

    python benchmarks/replay_memory.py [--rows 100000,300000,1000000] [--log criteo|clickless]
                                       [--code DIR] [--out FILE]

Writes ``benchmarks/results/replay-memory.json``. Needs no services (the backtest's registry is a
local file); about 5 minutes at the default lengths on a 2-core machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.criteo_like import INTERACTION, generate, write
from pipeline.core.config import Config
from pipeline.core.partitioning import partition_of
from pipeline.sources.jsonl_mapping import write_jsonl
from pipeline.sources.simulator import Simulator

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


# run first in the child: at exit, its own peak resident memory (kB) to the file the parent named
_REPORT_PEAK = """
import atexit, os
def _report_peak():
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(os.environ["REPLAY_MEMORY_PEAK_FILE"], "w") as out:
        out.write(kb)
atexit.register(_report_peak)
"""


def peak_rss_run(code: str, args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, float, int]:
    """``python -c code args`` in ``cwd``: its exit status, wall seconds and peak resident memory (MB)."""
    with tempfile.TemporaryDirectory(prefix="peak-") as tmp:
        report = Path(tmp) / "vmhwm_kb"
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _REPORT_PEAK + code, *args],
            env={**env, "REPLAY_MEMORY_PEAK_FILE": str(report)},
            cwd=cwd,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - started
        kb = int(report.read_text()) if report.exists() else 0
    return done.returncode, wall, round(kb / 1024)


def growth_per_100k(rows: list[int], mb: list[int]) -> float | None:
    """Least-squares slope of peak MB against rows, per 100,000 rows."""
    if len(rows) < 2:
        return None
    return round(statistics.linear_regression(rows, mb).slope * 100_000, 1)


def commit_of(code: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def describe(log: str, seed: int) -> str:
    if log == "criteo":
        return f"benchmarks/criteo_like.py --seed {seed} (prefixes of one log)"
    return f"the simulator, seed {seed}, without the clicks of partition 0's users (of 3)"


def write_clickless(path: Path, seed: int, impressions: int) -> None:
    """The simulator's stream in ``ctr simulate``'s JSONL, the clicks of partition 0's users taken out."""
    events = Simulator(Config().simulator, seed=seed).stream(impressions)
    kept = (e for e in events if not (e[0] == "click" and partition_of(e[1]["user_id"], 3) == 0))
    write_jsonl(kept, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="100000,300000,1000000", help="log lengths, comma-separated")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose ctr backtest runs")
    ap.add_argument("--log", choices=("criteo", "clickless"), default="criteo", help="which log (docstring)")
    ap.add_argument("--out", type=Path, default=None, help="default: results/replay-memory[-clickless].json")
    args = ap.parse_args(argv)
    name = "replay-memory.json" if args.log == "criteo" else "replay-memory-clickless.json"
    out_file = args.out or RESULTS / name
    lengths = sorted(int(r) for r in args.rows.split(","))
    code = args.code.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTR_")}
    env["PYTHONPATH"] = str(code)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="replay-memory-") as tmp:
        print(f"code {code} ({commit_of(code)}); {describe(args.log, args.seed)}", flush=True)
        longest = Path(tmp) / "log.txt"
        if args.log == "criteo":
            labels, counts, values = generate(args.seed, lengths[-1], INTERACTION)
            write(longest, labels, counts, values)
            del labels, counts, values
        for rows in lengths:
            log, out = Path(tmp) / f"log-{rows}.txt", Path(tmp) / f"bt-{rows}"
            if args.log == "clickless":
                write_clickless(log, args.seed, rows)
            else:
                with longest.open() as src, log.open("w") as dst:
                    dst.writelines(itertools.islice(src, rows))
            cli = "from pipeline.ops.cli import main; raise SystemExit(main())"
            fmt = "criteo" if args.log == "criteo" else "jsonl"
            backtest = ["backtest", "--source", str(log), "--format", fmt, "--out", str(out)]
            rc, wall, mb = peak_rss_run(cli, backtest, env, code)  # python -c puts the cwd first
            if rc != 0:
                print(f"ctr backtest failed on {rows:,} rows (exit {rc})", file=sys.stderr)
                return 1
            summary = json.loads((out / "summary.json").read_text())
            run = {
                "rows": rows,
                "events": summary["events"],
                "examples": summary["examples"],
                "blocks": summary["blocks"],
                "peak_rss_mb": mb,
                "wall_s": round(wall, 1),
                "examples_per_s": round(summary["examples_per_s"]),
                "online_auc_blocks2": summary.get("learners", {}).get("online", {}).get("auc"),
            }
            runs.append(run)
            print(
                f"{rows:>10,} rows: peak RSS {mb:>6,} MB, {wall:6.1f} s, {run['examples_per_s']:,} examples/s"
            )
    slope = growth_per_100k([r["rows"] for r in runs], [r["peak_rss_mb"] for r in runs])
    print(f"growth: {slope} MB per 100,000 rows")
    result = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "code": str(code),
            "commit": commit_of(code),
            "log": describe(args.log, args.seed),
            "config": "defaults (3 partitions, blocks of 100,000, DeepFM)",
            "cpus": os.cpu_count(),
            "load_avg_1m_before": os.getloadavg()[0],
        },
        "runs": runs,
        "growth_mb_per_100k_rows": slope,
    }
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
