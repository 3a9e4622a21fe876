"""Inference paths: forward latency of a 100-row request and the held-out AUC of each, against eager fp32.

A default-config learner (``TrainerConfig()``: DeepFM, 2^20 hashed rows; ``--model`` for another)
learns ``--blocks`` blocks of the project's simulator, joined by the live code path
(:class:`~pipeline.join.partitioned_join.PartitionedJoin`: validation, the joiner, the streaming
features); the next block is held out. Each path scores the same model:

- ``eager``: ``model(ids, dense)`` under ``torch.inference_mode`` (the reference: what serving ran);
- ``torchscript``: :func:`trainers.inference.frozen_scorer` (``torch.jit.trace`` + ``torch.jit.freeze``),
  what ``serving.inference = "torchscript"`` runs;
- ``torchscript+ofi``: the same plus ``torch.jit.optimize_for_inference``;
- ``compile``: ``torch.compile(model)`` (inductor, C++ kernels built with gcc; its compile time is
  reported, and a failure is recorded with its reason);
- ``int8``: ``torch.ao.quantization.quantize_dynamic`` of the MLP's ``nn.Linear`` layers (int8
  weights, activations quantized per batch); ``int8+torchscript``: that model traced and frozen;
- ``bf16``: eager under CPU bf16 autocast; ``torchscript+bf16``: the frozen scorer traced under bf16
  autocast, the code path CUDA runs, here on the CPU.

Latency: batches of ``--rows`` (100) held-out rows, one torch thread (``serving.torch_threads``),
``--warmup`` calls per path first, then ``--repeats`` rounds in which every path scores the same
batch once, in a shuffled order (machine noise hits every path alike); p50 / p99 per path and the
ratio of p50 to eager's. ``request`` rows time ``TorchLearner.predict_rows`` (encoding included) of
the eager and the torchscript learner the same way. Quality: every path scores the held-out block
in batches of ``--rows`` (int8 quantizes activations per batch, as it would per request): AUC,
logloss and their change against eager, and the largest |probability difference| from eager.

Prints a table and writes ``benchmarks/results/inference.json``
(``{"meta": {...}, "paths": {path: {"p50_ms", "p99_ms", "p50_vs_eager", "auc", "auc_delta",
"logloss", "logloss_delta", "max_prob_diff", "build_s", "error"}}, "request": {...}}``).

Run: ``python benchmarks/inference.py`` (3 blocks of 100k + 100k held out, ~2 min on 2 shared
cores, most of it the join and torch.compile); ``--quick`` (blocks of 20k, 500 rounds, no compile)
for a smoke run; ``--paths eager,torchscript,int8`` for a subset.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.core.config import Config, TrainerConfig
from pipeline.core.events import DeadLetter, LabelledExample
from pipeline.join.partitioned_join import PartitionedJoin
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import SimulatorSource
from trainers.encoding import EncodedBatch, Encoder, rows_of
from trainers.inference import frozen_scorer
from trainers.learner import TorchLearner
from trainers.metrics import auc, logloss

RESULTS = Path(__file__).resolve().parent / "results"
PATHS = (
    "eager",
    "torchscript",
    "torchscript+ofi",
    "compile",
    "int8",
    "int8+torchscript",
    "bf16",
    "torchscript+bf16",
)
_CACHE: list[tempfile.TemporaryDirectory[str]] = []  # inductor's cache of this run, removed at exit
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: blocks of 20k, 500 rounds, no compile")
    p.add_argument("--model", default=TrainerConfig().model, help="trainers.models.MODELS name")
    p.add_argument("--buckets", type=int, default=TrainerConfig().hash_buckets, help="hashed rows")
    p.add_argument("--blocks", type=int, default=3, help="blocks learned before the held-out one")
    p.add_argument("--block", type=int, default=TrainerConfig().train_every, help="examples per block")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)}")
    p.add_argument("--rows", type=int, default=100, help="rows per scored batch (1 user x 100 candidates)")
    p.add_argument("--warmup", type=int, default=200, help="unmeasured calls per path")
    p.add_argument("--repeats", type=int, default=3_000, help="measured rounds (one call per path each)")
    p.add_argument("--seed", type=int, default=7, help="simulator seed")
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/inference[-quick].json)")
    args = p.parse_args(argv)
    if args.quick:
        args.block, args.repeats, args.warmup = min(args.block, 20_000), 500, 50
        if args.paths == p.get_default("paths"):
            args.paths = ",".join(x for x in PATHS if x != "compile")
    if args.out is None:
        args.out = RESULTS / ("inference-quick.json" if args.quick else "inference.json")
    return args


class _Letters(list[DeadLetter]):
    def write(self, letter: DeadLetter) -> None:
        self.append(letter)

    def flush(self) -> None:
        pass


def simulated_examples(n: int, seed: int, sequence_length: int = 0) -> list[LabelledExample]:
    """The first ``n`` examples the joiner makes of the simulator's stream (live code path), with
    behaviour sequences of ``sequence_length`` if not 0."""
    cfg = Config()
    cfg.features.sequence_length = sequence_length
    source = SimulatorSource(Simulator(cfg.simulator, seed), n + n // 20)  # + the window's tail
    join = PartitionedJoin(cfg, source.clock, _Letters())
    out: list[LabelledExample] = []
    for batch in source.batches():
        out += join.step(batch)
        if len(out) >= n:
            break
    else:
        out += join.finish()
    return out[:n]


def _eval(fn: Forward) -> Forward:
    def run(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return fn(ids, dense)

    return run


def _bf16(fn: Forward) -> Forward:
    def run(ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(ids, dense)

    return run


def _int8(model: nn.Module) -> nn.Module:
    """A copy whose MLP's Linear layers are dynamically quantized to int8."""
    q = copy.deepcopy(model).eval()
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        q.mlp = torch.ao.quantization.quantize_dynamic(q.mlp, {nn.Linear}, dtype=torch.qint8)
    return q


def build_path(name: str, learner: TorchLearner, probe: tuple[torch.Tensor, torch.Tensor]) -> Forward:
    """The forward of path ``name`` over ``learner.model`` (built and run once on ``probe``)."""
    model = learner.model.eval()
    dims = {"n_fields": len(learner.encoder.fields), "n_dense": len(learner.encoder.dense_names)}
    cpu = torch.device("cpu")
    fn: Forward | None
    if name == "eager":
        fn = _eval(model)
    elif name in ("torchscript", "torchscript+bf16"):
        amp = torch.bfloat16 if name.endswith("bf16") else None
        scorer = frozen_scorer(model, **dims, device=cpu, amp_dtype=amp)
        fn = None if scorer is None else (_eval(scorer) if amp is None else _bf16(scorer))
    elif name == "torchscript+ofi":
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", FutureWarning)
            frozen = torch.jit.freeze(torch.jit.trace(model, probe, check_trace=False))
            fn = _eval(torch.jit.optimize_for_inference(frozen))
    elif name == "compile":
        # a cold cache, as a replica's first load in a new process (a warm one took 9 s instead of ~25)
        _CACHE.append(tempfile.TemporaryDirectory(prefix="inductor-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _CACHE[-1].name
        fn = _eval(torch.compile(model))
    elif name in ("int8", "int8+torchscript"):
        if not hasattr(model, "mlp"):
            raise ValueError(f"{type(model).__name__} has no MLP to quantize")
        q = _int8(model)
        if name == "int8":
            fn = _eval(q)
        else:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                fn = _eval(torch.jit.freeze(torch.jit.trace(q, probe, check_trace=False)))
    elif name == "bf16":
        fn = _bf16(model)
    else:
        raise ValueError(f"unknown path {name!r}; known: {PATHS}")
    if fn is None:
        raise RuntimeError("frozen_scorer fell back to eager (see the WARNING above)")
    fn(*probe)  # compile / first-run work happens here, inside build_s
    return fn


def score(fn: Forward, batch: EncodedBatch, rows: int) -> np.ndarray:
    """Probabilities of every row, ``rows`` at a time."""
    out = []
    for start in range(0, len(batch), rows):
        part = batch[start : start + rows]
        out.append(
            torch.sigmoid(fn(torch.from_numpy(part.ids), torch.from_numpy(part.dense)).float()).numpy()
        )
    return np.concatenate(out).astype(np.float64)


def interleaved(
    calls: Mapping[str, Callable[[int], Any]], warmup: int, repeats: int, n_inputs: int
) -> dict[str, Any]:
    """p50 / p99 ms per call: ``repeats`` rounds, each calling every entry once in a shuffled order."""
    for call in calls.values():
        for k in range(warmup):
            call(k % n_inputs)
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    rng = random.Random(0)
    for r in range(repeats):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter_ns()
            calls[name](r % n_inputs)
            times[name].append((time.perf_counter_ns() - t0) / 1e6)
    return {
        name: {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}
        for name, ms in times.items()
    }


def trained(args: argparse.Namespace) -> tuple[TorchLearner, list[LabelledExample], float]:
    """A default-config learner after ``--blocks`` simulated blocks, the next block, training s."""
    sequences = 50 if args.model == "din" else 0  # what DIN attends over (features.sequence_length)
    examples = simulated_examples((args.blocks + 1) * args.block, args.seed, sequences)
    blocks = [examples[i * args.block : (i + 1) * args.block] for i in range(args.blocks + 1)]
    cfg = TrainerConfig(model=args.model, hash_buckets=args.buckets, device="cpu")
    learner = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(blocks[0]))
    t0 = time.perf_counter()
    for block in blocks[:-1]:
        learner.learn(block)
    return learner, blocks[-1], time.perf_counter() - t0


def measure_paths(
    names: list[str], learner: TorchLearner, held: EncodedBatch, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Build every path, score the held-out block with each, time them interleaved."""
    assert held.labels is not None
    labels = held.labels.astype(np.float64)
    n_inputs = min(50, len(held) // args.rows)
    inputs = [
        (torch.from_numpy(b.ids), torch.from_numpy(b.dense)) for b in _batches(held, args.rows, n_inputs)
    ]
    results: dict[str, dict[str, Any]] = {}
    fns: dict[str, Forward] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            fns[name] = build_path(name, learner, inputs[0])
            results[name] = {"error": None}
        except Exception as exc:  # a path that does not work here is a result too
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(f"{name}: failed: {results[name]['error']}", file=sys.stderr)
        results[name]["build_s"] = round(time.perf_counter() - t0, 3)
    ref = score(fns["eager"], held, args.rows)
    ref_auc, ref_ll = auc(labels, ref), logloss(labels, ref)
    for name, fn in fns.items():
        p = score(fn, held, args.rows)
        a, ll = auc(labels, p), logloss(labels, p)
        results[name] |= {
            "auc": a,
            "auc_delta": a - ref_auc,
            "logloss": ll,
            "logloss_delta": ll - ref_ll,
            "max_prob_diff": float(np.abs(p - ref).max()),
        }
    calls = {name: functools.partial(_call, fn, inputs) for name, fn in fns.items()}
    for name, figures in interleaved(calls, args.warmup, args.repeats, n_inputs).items():
        results[name] |= figures
    for r in results.values():
        if "p50_ms" in r:
            r["p50_vs_eager"] = r["p50_ms"] / results["eager"]["p50_ms"]
    return results


def _call(fn: Forward, inputs: list[tuple[torch.Tensor, torch.Tensor]], k: int) -> torch.Tensor:
    return fn(*inputs[k])


def _batches(batch: EncodedBatch, rows: int, n: int) -> list[EncodedBatch]:
    return [batch[k * rows : (k + 1) * rows] for k in range(n)]


def measure_requests(
    learner: TorchLearner, held: list[LabelledExample], args: argparse.Namespace
) -> dict[str, Any]:
    """``predict_rows`` (encode + forward) of one request, the eager vs the torchscript learner."""
    traced = learner.clone(frozen=True)
    if traced.use_inference("torchscript") != "torchscript":
        return {}
    n = min(50, len(held) // args.rows)
    rows = rows_of(held[: n * args.rows])
    reqs = [
        (
            [imp for imp, _ in rows[k * args.rows : (k + 1) * args.rows]],
            [f for _, f in rows[k * args.rows : (k + 1) * args.rows]],
        )
        for k in range(n)
    ]
    calls = {
        "eager": lambda k: learner.predict_rows(*reqs[k]),
        "torchscript": lambda k: traced.predict_rows(*reqs[k]),
    }
    return interleaved(calls, args.warmup, max(1, args.repeats // 3), n)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.paths.split(",") if n.strip()]
    if "eager" not in names:
        names.insert(0, "eager")
    torch.set_num_threads(1)  # serving.torch_threads; training too: the machine is shared
    wall0 = time.perf_counter()
    learner, held_block, train_s = trained(args)
    held = learner.encode(held_block)
    results = measure_paths(names, learner, held, args)
    request = measure_requests(learner, held_block, args)
    eager = results["eager"]
    report(results, request, args, eager["auc"], eager["logloss"])
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "hash_buckets": args.buckets,
        "blocks": args.blocks,
        "block": args.block,
        "held_out_rows": len(held),
        "held_out_positives": int(sum(ex.label for ex in held_block)),
        "rows_per_batch": args.rows,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "train_s": round(train_s, 2),
        "wall_s": round(time.perf_counter() - wall0, 2),
        "eager_auc": eager["auc"],
        "eager_logloss": eager["logloss"],
        "argv": sys.argv[1:] if argv is None else argv,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "paths": results, "request": request}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def report(
    results: dict[str, dict[str, Any]], request: dict[str, Any], args: argparse.Namespace, a: float, ll: float
) -> None:
    learned = f"{args.blocks} x {args.block:,} learned"
    print(f"\n{args.model}, {args.buckets:,} rows, {learned}; held-out AUC {a:.4f}, logloss {ll:.4f}")
    head = ("p50 ms", "p99 ms", "vs eager", "dAUC", "dlogloss", "max|dp|", "build s")
    print(f"{'path':<18}" + "".join(f"{h:>10}" for h in head))
    for name, r in results.items():
        if r["error"]:
            print(f"{name:<18}failed: {r['error'][:90]}")
            continue
        print(
            f"{name:<18}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}{r['p50_vs_eager']:>9.2f}x"
            f"{r['auc_delta']:>+10.5f}{r['logloss_delta']:>+10.5f}{r['max_prob_diff']:>10.1e}{r['build_s']:>10.2f}"
        )
    for name, r in request.items():
        print(
            f"{'request/' + name:<18}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}  predict_rows: encode + forward"
        )


if __name__ == "__main__":
    raise SystemExit(main())
