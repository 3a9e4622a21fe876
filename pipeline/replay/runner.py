"""Run the loop in one process (embedded profile): `ctr demo`, on the simulator or a log (--source).

Wires the embedded adapters (:class:`~pipeline.replay.embedded.EmbeddedStack`: JSONL dead letters, Feast
with its SQLite online store, MLflow with a local SQLite tracking store, in-process replicas) around
the shared :class:`~pipeline.replay.loop.OnlineLoop` with a source, prints one row per block and writes
``summary.json`` and a plot. The demo's source is the drifting simulator; a replay's is a file.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.types import Source
from pipeline.replay.embedded import EmbeddedStack
from pipeline.replay.loop import BlockTiming, OnlineLoop
from pipeline.sources.avazu import AvazuCsvSource
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import JsonlSource, SimulatorSource

__all__ = ["RunResult", "run_demo", "run_embedded", "run_replay"]

_HEADER = (
    f"{'block':>5} {'examples':>8} {'pos':>6} {'online AUC':>10} {'static AUC':>10} "
    f"{'online LL':>9} {'static LL':>9} {'gate':>8} {'version':>7} {'fresh s':>7}"
)


@dataclass
class RunResult:
    summary: dict[str, Any]
    out: Path


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def run_demo(cfg: Config, out: Path, impressions: int, seed: int, quiet: bool = False) -> RunResult:
    """Simulate ``impressions`` impressions (plus their clicks) and run the loop over them."""
    source = SimulatorSource(Simulator(cfg.simulator, seed), impressions)
    title = (
        f"demo: {impressions:,} simulated impressions (seed {seed}), a block every "
        f"{cfg.trainer.train_every:,} examples"
    )
    return run_embedded(cfg, source, out, title, quiet=quiet, extra={"seed": seed})


def run_replay(cfg: Config, path: Path, fmt: str, out: Path, quiet: bool = False) -> RunResult:
    """Replay a historical file through the same loop (a backtest in the embedded profile)."""
    if not path.exists():
        raise FileNotFoundError(f"replay: {path} does not exist")
    source: Source
    if fmt == "avazu":
        source = AvazuCsvSource(path)
    else:
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        source = JsonlSource(files)
    title = f"replay of {path} ({fmt}), a block every {cfg.trainer.train_every:,} examples"
    return run_embedded(cfg, source, out, title, quiet=quiet, extra={"source": str(path), "format": fmt})


def run_embedded(
    cfg: Config,
    source: Source,
    out: Path,
    title: str,
    *,
    quiet: bool = False,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Run ``source`` through the loop with the embedded adapters; print and save the results."""
    if out.exists():
        shutil.rmtree(out)  # each run needs its own Feast store and registry (Feast drops "old" rows)
    out.mkdir(parents=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    wall0 = time.perf_counter()
    stack = EmbeddedStack.open(cfg, out)
    rows: list[dict[str, Any]] = []

    def on_block(t: BlockTiming) -> None:
        r = t.report
        fresh = None
        if r.version is not None:
            live = stack.fleet.wait_for(r.version, timeout_s=60)
            fresh = None if live is None else live - t.completed_at
        row = {
            "block": r.index,
            "examples": r.examples,
            "positives": r.positives,
            "event_time_min": r.event_time_min,
            "event_time_max": r.event_time_max,
            "online": r.online,
            "static": r.static,
            "holdout_candidate": r.candidate,
            "holdout_champion": r.champion,
            "accepted": r.decision.accepted,
            "gate": r.decision.reason,
            "version": r.version,
            "parent_version": r.parent_version,
            "train_s": r.train_seconds,
            "train_examples_per_s": r.examples_per_s,
            "publish_s": r.publish_seconds,
            "freshness_s": fresh,
        }
        rows.append(row)
        say(
            f"{r.index:>5} {r.examples:>8} {r.positives:>6} {_fmt(r.online.get('auc')):>10} "
            f"{_fmt(r.static.get('auc') if r.static else None):>10} {_fmt(r.online.get('logloss')):>9} "
            f"{_fmt(r.static.get('logloss') if r.static else None):>9} "
            f"{'accept' if r.decision.accepted else 'REFUSE':>8} {r.version or '-':>7} "
            f"{_fmt(fresh, '.2f'):>7}"
        )

    progress = stack.progress(total=None, desc="events")
    loop = OnlineLoop(
        cfg,
        source,
        stack.trainer,
        stack.dead_letters,
        stack.feature_writer,
        notifier=stack.fleet,
        offsets=stack.offsets,
        on_block=on_block,
        on_progress=progress.update,
    )
    say(f"{title}, {len(stack.fleet.replicas)} replicas; output in {out}")
    say(_HEADER)
    try:
        result = loop.run()
    finally:
        progress.close()
    probe = stack.fleet.replicas[0].score("user-1", {"device": "mobile"}, ["item-1", "item-2", "item-3"])
    wall = time.perf_counter() - wall0
    with_static = [r for r in rows if r["static"]]
    summary: dict[str, Any] = {
        "events": result.events,
        "dead_letters": result.dead_letters,
        "examples": result.examples,
        "blocks": len(rows),
        "versions_registered": len(stack.store.versions()),
        "champion_version": stack.store.resolve(cfg.registry.champion_alias),
        # online vs static compared over the blocks where the static copy exists (block 2 onwards)
        "online_auc": _mean([r["online"]["auc"] for r in with_static]),
        "static_auc": _mean([r["static"]["auc"] for r in with_static]),
        "online_logloss": _mean([r["online"]["logloss"] for r in with_static]),
        "static_logloss": _mean([r["static"]["logloss"] for r in with_static]),
        "freshness_s": [r["freshness_s"] for r in rows if r["version"] is not None],
        "wall_s": wall,
        "join_stats": result.join_stats,
        "replica_versions": stack.fleet.versions(),
        "probe_score": {"version": probe.version, "replica": probe.replica, "p": probe.probabilities},
        "per_block": rows,
        **(extra or {}),
        "config": cfg.to_dict(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    plot = _plot(rows, out / "auc_over_blocks.png")
    run_url = stack.log_summary_run(summary, [plot])
    stack.close()
    say("")
    say(
        f"events {result.events:,}  examples {result.examples:,}  dead letters {result.dead_letters:,}  "
        f"versions {summary['versions_registered']}  champion v{summary['champion_version']}  "
        f"wall {wall:.1f}s"
    )
    say(
        f"mean progressive AUC (blocks 2+): online {_fmt(summary['online_auc'])} vs static "
        f"{_fmt(summary['static_auc'])}; logloss online {_fmt(summary['online_logloss'])} vs static "
        f"{_fmt(summary['static_logloss'])}"
    )
    say(f"wrote {out / 'summary.json'} and {plot}")
    say(f"MLflow UI:  {stack.ui_command()}   then open {run_url}")
    return RunResult(summary, out)


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    blocks = [r["block"] for r in rows]
    ax.plot(blocks, [r["online"]["auc"] for r in rows], "o-", label="online (fine-tuned every block)")
    st = [(r["block"], r["static"]["auc"]) for r in rows if r["static"]]
    if st:
        ax.plot(*zip(*st, strict=True), "s--", label="static (frozen after block 1)")
    ax.set_xticks(blocks)
    ax.set_xlabel("block")
    ax.set_ylabel("progressive AUC")
    ax.set_title("Progressive validation AUC on the drifting simulator")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
