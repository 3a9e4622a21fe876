"""``ctr backtest``: replay a log at full speed through the live loop and compare with baselines.

The replay is :class:`~pipeline.replay.loop.OnlineLoop` itself (validation, joiner, streaming features,
:class:`~trainers.incremental.IncrementalTrainer`) on the source's simulated event-time clock; only
the adapters differ from the demo: dead letters go to ``<out>/dead_letters.jsonl``, no Feast push
and no serving fleet (nothing reads them in a replay), and model versions are numbered locally
unless ``cfg.backtest.register`` publishes each one to the MLflow registry.

Three learners are scored progressively on exactly the same blocks (each block before learning it):

- ``online``: the champion, fine-tuned every ``cfg.trainer.train_every`` examples and gated;
- ``static``: the same model frozen after block 1 (what freshness buys);
- ``ftrl``: FTRL-Proximal logistic regression over the same hashed features
  (:mod:`trainers.ftrl`), the classic online reference; it learns every block entirely.

The report (:mod:`pipeline.replay.report`) goes to ``--out``; the run ends by printing
throughput in examples per second.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline.core.config import Config
from pipeline.core.events import LabelledExample
from pipeline.core.types import Source
from pipeline.replay import report
from pipeline.replay.dead_letter_check import Diagnosis, diagnose, read_dead_letters
from pipeline.replay.loop import OnlineLoop
from pipeline.replay.sinks import JsonlDeadLetters
from pipeline.sources.jsonl_mapping import JsonlMapping
from trainers.ftrl import FtrlLearner, FtrlParams
from trainers.incremental import BlockReport, BlockScores, IncrementalTrainer

__all__ = ["BacktestResult", "LocalVersions", "run_backtest"]

LEARNERS = ("online", "static", "ftrl")


@dataclass
class BacktestResult:
    summary: dict[str, Any]
    out: Path
    dead_letters: Diagnosis | None = None  # the verdict on the input (failed: mostly dead letters)
    scores: list[BlockScores] = field(default_factory=list)  # every block's labels and learners' scores


class LocalVersions:
    """A model store that only numbers accepted versions (``"1"``, ``"2"``, ...) and moves an alias.

    A replay does not need every version's weights; with ``cfg.backtest.register`` the real MLflow
    registry is used instead and the numbers match what it would assign in a fresh registry.
    """

    def __init__(self) -> None:
        self.count = 0
        self.aliases: dict[str, str] = {}

    def publish(self, model: Any, lineage: Any, metrics: Any) -> str:
        self.count += 1
        return str(self.count)

    def set_alias(self, alias: str, version: str) -> None:
        if not (str(version).isdigit() and 1 <= int(version) <= self.count):
            raise KeyError(f"LocalVersions: no version {version!r} (published: 1..{self.count})")
        self.aliases[alias] = version

    def resolve(self, alias: str) -> str | None:
        return self.aliases.get(alias)

    def load(self, version: str) -> Any:
        raise KeyError(f"LocalVersions keeps no weights (version {version}); set backtest.register")


def run_backtest(
    cfg: Config,
    source: Source,
    out: Path,
    *,
    title: str,
    seed: int,
    quiet: bool = False,
    mlflow_run: bool = True,
    extra: dict[str, Any] | None = None,
    examples_out: Path | None = None,
    ftrl: bool = True,
) -> BacktestResult:
    """Replay ``source`` through :class:`OnlineLoop` with the three learners; write the report.

    ``examples_out``: also write every labelled example there (JSONL, the bytes the joiner daemon
    puts on Kafka), in the order the trainer takes them. ``ftrl=False`` leaves the FTRL baseline out
    (a second run of the same stream with another model, whose FTRL scores would be the same).
    """
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    wall0 = time.perf_counter()
    b = cfg.backtest
    store: Any = LocalVersions()
    if b.register:
        from trainers.registry import MlflowModelStore

        store = MlflowModelStore.embedded(cfg.registry, out)
    learners = LEARNERS if ftrl else tuple(n for n in LEARNERS if n != "ftrl")
    baselines = {
        "ftrl": FtrlLearner(
            cfg.trainer.hash_buckets,
            FtrlParams(alpha=b.ftrl_alpha, beta=b.ftrl_beta, l1=b.ftrl_l1, l2=b.ftrl_l2),
            batch_size=b.ftrl_batch_size,
        )
    }
    scores: list[BlockScores] = []
    trainer = IncrementalTrainer(
        cfg.trainer,
        store,
        alias=cfg.registry.champion_alias,
        resume=False,
        baselines=baselines if ftrl else {},
        on_scores=scores.append,
        label_delay_ms=cfg.joiner.label_delay_ms,
    )
    rows: list[dict[str, Any]] = []
    progress = tqdm(
        desc="backtest", unit="ev", unit_scale=True, file=sys.stderr, mininterval=1.0, disable=quiet or None
    )

    def on_report(r: BlockReport) -> None:
        rows.append(report.block_row(r, learners))
        progress.set_postfix_str(f"block {r.index} online AUC {r.online['auc']:.4f}", refresh=False)
        if progress.disable and not quiet:  # no bar (not a terminal: a log, CI): a line per block
            ftrl_auc = r.baselines.get("ftrl", {}).get("auc")
            vs = "" if ftrl_auc is None else f", FTRL {ftrl_auc:.4f}"
            print(
                f"block {r.index}: {r.examples:,} examples, online AUC {r.online['auc']:.4f}{vs}, "
                f"{'version ' + r.version if r.version else 'refused'}; {time.perf_counter() - wall0:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    (out / "dead_letters.jsonl").unlink(missing_ok=True)
    dead = JsonlDeadLetters(out / "dead_letters.jsonl")
    examples_file = examples_out.open("wb") if examples_out is not None else None

    def on_examples(examples: list[LabelledExample]) -> None:
        assert examples_file is not None
        examples_file.writelines(ex.to_json() + b"\n" for ex in examples)

    loop = OnlineLoop(
        cfg,
        source,
        trainer,
        dead,
        on_block=lambda t: on_report(t.report),
        on_progress=progress.update,
        on_examples=on_examples if examples_file is not None else None,
    )
    say(f"backtest: {title}; output in {out}")
    try:
        result = loop.run()
        for r in trainer.flush():  # the last, partial block is scored too: every example counts
            on_report(r)
    finally:
        progress.close()
        dead.close()
        if examples_file is not None:
            examples_file.close()
    loop_s = time.perf_counter() - wall0
    verdict = _verdict(cfg, result.events, dict(dead.by_reason), out / "dead_letters.jsonl")
    summary: dict[str, Any] = {
        "title": title,
        "blocks": len(rows),
        "examples": result.examples,
        "events": result.events,
        "dead_letters": result.dead_letters,
        "dead_letters_by_reason": verdict.by_reason,
        "dead_letter_share": verdict.share,
        "dead_letter_hints": verdict.hints,
        "versions": sum(1 for r in rows if r["version"]),
        **report.summarize(scores, learners, resamples=b.bootstrap_resamples, seed=seed),
        "loop_s": loop_s,
        "examples_per_s": result.examples / loop_s if loop_s > 0 else 0.0,
        "events_per_s": result.events / loop_s if loop_s > 0 else 0.0,
        "join_stats": result.join_stats,
        "model": cfg.trainer.model,
        "train_every": cfg.trainer.train_every,
        "attribution_window_s": cfg.joiner.attribution_window_s,
        "seed": seed,
        **(extra or {}),
        "config": cfg.to_dict(),
    }
    summary["hints"] = (
        _block_hints(result.examples, cfg.trainer.train_every) + _blend_hints(rows) + verdict.notes
    )
    files = [report.write_csv(rows, out / "metrics.csv")]
    files += report.write_plots(rows, learners, out)
    files.append(report.write_html(summary, rows, files[1:], out))
    summary["wall_s"] = time.perf_counter() - wall0
    files.append(report.dump_json(summary, out / "summary.json"))
    if mlflow_run:
        uri = cfg.registry.tracking_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}"
        params = {k: summary[k] for k in ("model", "train_every", "attribution_window_s", "seed")} | (
            extra or {}
        )
        name = f"backtest-{(extra or {}).get('format', 'source')}-{cfg.trainer.model}"
        run = report.log_mlflow_run(
            uri, f"{cfg.registry.experiment}-backtest", name, params, rows, summary, files
        )
        say(f"MLflow run {run} in {uri}")
    _print_summary(summary, say)
    return BacktestResult(summary, out, verdict, scores)


def _block_hints(examples: int, train_every: int) -> list[str]:
    """What to change when the stream is too short for its block size: the progressive metrics
    judge blocks 2 and later (block 1 is scored by a model that has learned nothing), so a stream
    of fewer than two blocks has no figures, and one of fewer than three few."""
    if examples >= 3 * train_every:
        return []
    if examples < 10:  # no block size helps: the log (or what the dead letters say of it) does
        return [
            f"{examples:,} examples: too few to judge a model by (is --source the log you meant? "
            "any dead letters are counted below)"
        ]
    per_block = examples // 5
    digits = max(0, len(str(per_block)) - 2)
    suggested = max(1, per_block // 10**digits * 10**digits)  # two significant digits, down
    judged = "no block is judged" if examples <= train_every else "only block 2 is judged"
    return [
        f"{examples:,} examples in blocks of {train_every:,}: {judged} (the metrics read blocks 2 "
        f"and later; block 1 is scored before anything was learned). For about five blocks, rerun "
        f"with --train-every {suggested}."
    ]


def _blend_hints(rows: list[dict[str, Any]]) -> list[str]:
    """Say so when the last block was served mostly by the running base rate (the model's scores
    had predicted worse than the click rate alone: trainers.base_rate_blend)."""
    weight = float(rows[-1].get("served_model_weight", 1.0)) if rows else 1.0
    if weight >= 0.5:
        return []
    return [
        f"the last block was served {1 - weight:.1%} by the running click rate: the model's scores had "
        "predicted worse than the rate alone (metrics.csv served_model_weight; trainer.base_rate_blend_clamp)"
    ]


def _verdict(cfg: Config, events: int, by_reason: dict[str, int], path: Path) -> Diagnosis:
    _, samples = read_dead_letters(path, count=False)
    try:
        mapping = JsonlMapping.from_config(cfg.jsonl)
    except ValueError:  # not a JSONL run; the hints then assume the canonical names
        mapping = None
    return diagnose(events, by_reason, samples, mapping)


def _print_summary(s: dict[str, Any], say: Any) -> None:
    def f(x: Any, spec: str = ".4f") -> str:
        return "-" if x is None or x != x else format(x, spec)

    say(f"{'learner':>8} {'AUC':>7} {'95% CI':>17} {'logloss':>8} {'NE':>7} {'calib':>7}")
    for name, v in s["learners"].items():
        ci = f"[{f(v['auc_ci95'][0])}, {f(v['auc_ci95'][1])}]"
        ll, ne, cal = f(v["logloss"]), f(v["ne"]), f(v["calibration"])
        say(f"{name:>8} {f(v['auc']):>7} {ci:>17} {ll:>8} {ne:>7} {cal:>7}")
    for name, m in s["margins"].items():
        lo, hi = (f(x) for x in m["auc_ci95"])
        auc, ll = f(m["auc"], "+.4f"), f(m["logloss"], "+.4f")
        say(f"margin {name}: AUC {auc} (95% CI {lo}..{hi}), logloss {ll}")
    say(
        f"{s['blocks']} blocks, {s['examples']:,} examples ({s['events']:,} events, "
        f"{s['dead_letters']:,} dead letters) "
        f"in {s['loop_s']:.1f}s: {s['examples_per_s']:,.0f} examples/s"
    )
    for hint in s.get("hints", ()):
        say(f"note: {hint}")
    if s["dead_letters_by_reason"]:
        reasons = ", ".join(f"{r} {n:,}" for r, n in s["dead_letters_by_reason"].items())
        say(f"dead letters by reason: {reasons}")
