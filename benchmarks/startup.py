"""Process start-up: the seconds a fresh interpreter spends importing what each daemon imports.

Every daemon start, restart after a crash (systemd's ``Restart=``), serving worker and ``ctr``
command pays its imports before it does anything. Feast is the largest of them: its classes carry
typeguard's ``@typechecked``, which re-parses and recompiles their methods at import. ``features``
turns that decorator into the no-op ``python -O`` makes of it (``features/__init__.py``).

Measured per target, in the same run and alternating, so that the machine's noise hits both alike:

- ``as run``: a fresh ``python -c "import <module>"``, as the daemons import it;
- ``reference``: the same with ``import feast`` first, i.e. Feast as it comes (instrumented), what
  the project paid before and any plain Feast user pays.

Targets: ``feast`` alone (through ``features.store``), the joiner, the trainer and a serving
replica's process module. Run: ``python benchmarks/startup.py [--trials 5] [--targets feast,joiner]``;
prints a table and writes ``benchmarks/results/startup.json`` (medians and every trial).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {
    "feast": "features.store",
    "joiner": "pipeline.daemons.joiner",
    "trainer": "pipeline.daemons.trainer",
    "replica": "serving_bridge.process",
}


def timed_import(module: str, feast_first: bool) -> tuple[float, bool]:
    """Wall seconds of a fresh interpreter importing ``module``, and whether Feast came instrumented."""
    first = "import feast; " if feast_first else ""  # the reference: Feast before ``features``
    code = first + f"import {module}, features; print(features.feast_typechecked())"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"importing {module} failed:\n{done.stderr[-3000:]}")
    return seconds, done.stdout.split()[-1] == "True"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5, help="imports per target and way (alternating)")
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"some of {','.join(TARGETS)}")
    ap.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    args = ap.parse_args(argv)
    unknown = set(args.targets.split(",")) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}; choose among {', '.join(TARGETS)}")
    out: dict[str, dict[str, object]] = {}
    print(f"{'target':>8}  {'as run s':>9}  {'reference s':>11}  {'saved':>6}")
    for name in args.targets.split(","):
        module = TARGETS[name]
        runs: dict[str, list[float]] = {"as_run": [], "reference": []}
        for trial in range(args.trials):
            for way in ("as_run", "reference"):
                seconds, instrumented = timed_import(module, feast_first=way == "reference")
                if instrumented != (way == "reference"):
                    raise SystemExit(f"{name}: Feast came instrumented={instrumented} in the {way} way")
                runs[way].append(round(seconds, 3))
            print(f"  {name} trial {trial + 1}: {runs['as_run'][-1]:.2f} s / {runs['reference'][-1]:.2f} s")
        ours, ref = statistics.median(runs["as_run"]), statistics.median(runs["reference"])
        out[name] = {"module": module, "as_run_p50_s": ours, "reference_p50_s": ref, "trials": runs}
        print(f"{name:>8}  {ours:>9.2f}  {ref:>11.2f}  {1 - ours / ref:>6.0%}")
    result = {
        "targets": out,
        "definition": "wall seconds of `python -c 'import <module>'` in a fresh process (median)",
        "reference": "the same import with Feast imported first: typeguard's instrumentation on",
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
