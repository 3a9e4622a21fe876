"""`ctr backtest`, `ctr demo --source`, `ctr produce --source` (:mod:`pipeline.ops.cli` dispatches here).

They share the log options (``--source``, ``--format``, the JSONL ``--map``/``--map-file``/``--clicks``)
and one opener (:func:`pipeline.sources.open.open_source`). A backtest or demo exits
:data:`~pipeline.replay.dead_letter_check.EXIT_MOSTLY_DEAD` when more than half the events became dead
letters, printing the top reasons, an example line and the ``--map`` that would read it.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.types import Clock, RawEvent, Source
from pipeline.replay.dead_letter_check import EXIT_MOSTLY_DEAD, Diagnosis, diagnose, read_dead_letters
from pipeline.sources.files import UnreadableLog
from pipeline.sources.jsonl_mapping import JsonlMapping

__all__ = ["add_input_arguments", "apply_input_options", "backtest", "dead_letter_status", "replay"]


def _unreadable_logs_said(command: Callable[[Config, argparse.Namespace], int]) -> Callable[..., int]:
    """``command``, with a log it cannot read on reported in one line (exit 2), not a traceback
    (an ``--out`` it cannot write is refused before: :func:`pipeline.ops.arg_types.out_problem`)."""

    @functools.wraps(command)
    def run(cfg: Config, args: argparse.Namespace) -> int:
        try:
            return command(cfg, args)
        except UnreadableLog as exc:
            print(f"ctr: {exc}", file=sys.stderr)
            return 2

    return run


def apply_input_options(cfg: Config, args: argparse.Namespace) -> None:
    """``--map-file`` replaces ``jsonl.map_file``; ``--map`` pairs come after ``jsonl.map``'s."""
    if args.format not in ("jsonl", "parquet") and (args.map or args.map_file):
        raise ValueError(f"--map and --map-file are for --format jsonl or parquet, not {args.format}")
    if args.map_file is not None:
        cfg.jsonl.map_file = str(args.map_file)
    cfg.jsonl.map = (*cfg.jsonl.map, *args.map)


@_unreadable_logs_said
def backtest(cfg: Config, args: argparse.Namespace) -> int:
    from pipeline.replay.backtest import run_backtest
    from pipeline.sources.open import open_source
    from trainers.sharding import join_launched_group, leave_group

    cfg.trainer.model = args.model or cfg.trainer.model
    cfg.trainer.seed = args.seed
    if cfg.trainer.model == "din" and not cfg.features.sequence_length:
        cfg.features.sequence_length = max(cfg.trainer.sequence_length, 50)
        print(
            f"ctr: --model din attends over behaviour sequences: features.sequence_length set to "
            f"{cfg.features.sequence_length} for this backtest (set it in the config to choose)",
            file=sys.stderr,
        )
    if cfg.trainer.model == "esmm" and not cfg.joiner.conversion_window_s:
        # a simulated hour holds ~180k impressions: a day's window would close only at the end
        cfg.joiner.conversion_window_s = 3_600.0 if args.format == "simulator" else 86_400.0
        print(
            f"ctr: --model esmm learns conversions: joiner.conversion_window_s set to "
            f"{cfg.joiner.conversion_window_s:.0f} for this backtest (set it in the config to choose)",
            file=sys.stderr,
        )
    if args.attribution_window is not None:
        cfg.joiner.attribution_window_s = args.attribution_window
    sim = args.format == "simulator"
    if (
        cfg.trainer.model == "esmm"
        and sim
        and args.world == "simulator"
        and not cfg.simulator.conversion_rate
    ):
        cfg.simulator.conversion_rate = 0.1
        print(
            "ctr: --model esmm: the simulator converts 10% of clicks (simulator.conversion_rate)",
            file=sys.stderr,
        )
    if args.world != "simulator" and not sim:
        print(f"ctr: --world is for --format simulator, not {args.format}", file=sys.stderr)
        return 2
    try:
        apply_input_options(cfg, args)
        source = open_source(
            cfg,
            args.format,
            args.source,
            seed=args.seed,
            impressions=args.impressions,
            clicks=args.clicks,
            world=args.world,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"ctr: {exc}", file=sys.stderr)
        return 2
    world = "" if args.world == "simulator" else f" of world {args.world}"
    what = f"{args.impressions:,} simulated impressions{world}" if sim else str(args.source)
    title = f"{what} ({args.format}), {cfg.trainer.model}, a block every {cfg.trainer.train_every:,} examples"
    extra: dict[str, Any] = {"format": args.format, "source": "" if sim else str(args.source)}
    if sim:
        extra |= {"impressions": args.impressions, "world": args.world}
    if args.clicks is not None:
        extra["clicks"] = str(args.clicks)
    # On several ranks (trainer.ranks, torchrun) each replays the same stream in step, holding its
    # share of the tables' rows (trainers/sharding.py); rank 0 writes the report.
    sharding = join_launched_group(cfg.trainer.device)
    if sharding is not None and cfg.backtest.register:
        print("ctr: backtest.register publishes from one process; run it without torchrun", file=sys.stderr)
        return 2
    if sharding is None or sharding.rank == 0:
        if sharding is not None:
            extra["ranks"] = sharding.world
        result = run_backtest(
            cfg, source, args.out, title=title, seed=args.seed, extra=extra, examples_out=args.examples_out
        )
    else:
        with tempfile.TemporaryDirectory(prefix=f"ctr-backtest-rank{sharding.rank}-") as scratch:
            result = run_backtest(
                cfg, source, Path(scratch), title=title, seed=args.seed, quiet=True, mlflow_run=False
            )
    leave_group()
    assert result.dead_letters is not None
    return dead_letter_status("backtest", result.dead_letters, args.out / "dead_letters.jsonl")


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """The JSONL input options of the commands that read a log (pipeline/sources/jsonl_mapping.py)."""
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="CANONICAL=RAW",
        help="JSONL or Parquet: rename at read time, repeatable: type=event_type (the tag), impression=imp, "
        "click=clk (its values), user_id=uid, ts=timestamp (fields); adds to [jsonl] map",
    )
    p.add_argument("--map-file", type=Path, help='the same as a JSON object {"type": "event_type"}')
    p.add_argument(
        "--clicks",
        type=Path,
        help="JSONL file or folder of clicks, merged on event time with --source's impressions "
        "(a --source folder of impression*.jsonl and click*.jsonl files does the same)",
    )


@_unreadable_logs_said
def replay(cfg: Config, args: argparse.Namespace) -> int:
    from pipeline.replay.runner import run_embedded
    from pipeline.sources.open import open_source

    try:
        apply_input_options(cfg, args)
        source = open_source(cfg, args.format, args.source, seed=0, impressions=0, clicks=args.clicks)
    except (FileNotFoundError, ValueError) as exc:
        print(f"ctr: {exc}", file=sys.stderr)
        return 2
    title = f"demo over {args.source} ({args.format}), a block every {cfg.trainer.train_every:,} examples"
    extra = {"source": str(args.source), "format": args.format}
    counted = _Counted(source)
    path = args.out / "dead_letters.jsonl"
    try:
        run_embedded(cfg, counted, args.out, title, extra=extra)
    except RuntimeError:  # no examples, so no model for the replicas' probe: say why, if that is why
        verdict = _replay_verdict(cfg, args, counted.events, path)
        if not verdict.failed:
            raise
        return dead_letter_status("demo", verdict, path)
    verdict = _replay_verdict(cfg, args, counted.events, path)
    if verdict.dead:
        print(f"dead letters by reason: {verdict.reasons_line()}")
    return dead_letter_status("demo", verdict, path)


@_unreadable_logs_said
def produce_log(cfg: Config, args: argparse.Namespace) -> int:
    """`ctr produce --source LOG`: the log, read as a backtest reads it, onto the event topics."""
    from pipeline.kafka.io import ensure_topics, publish_source
    from pipeline.sources.open import open_source

    try:
        apply_input_options(cfg, args)
        source = open_source(cfg, args.format, args.source, seed=args.seed, impressions=0, clicks=args.clicks)
    except (FileNotFoundError, ValueError) as exc:
        print(f"ctr: {exc}", file=sys.stderr)
        return 2
    k = cfg.kafka
    ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.conversions_topic], k.partitions)
    counts = publish_source(k, source, rate=args.rate, progress=True, validation=cfg.validation)
    print(json.dumps(counts))
    return 0


def _replay_verdict(cfg: Config, args: argparse.Namespace, events: int, path: Path) -> Diagnosis:
    reasons, samples = read_dead_letters(path, count=True)
    return diagnose(events, reasons, samples, JsonlMapping.from_config(cfg.jsonl))


class _Counted:
    """``source``, counting the events it delivers (for the verdict, even when the run fails)."""

    def __init__(self, source: Source) -> None:
        self.source, self.events = source, 0

    @property
    def clock(self) -> Clock:
        return self.source.clock

    def snapshot(self) -> dict[str, Any]:
        return self.source.snapshot()

    def batches(self) -> Iterator[list[RawEvent]]:
        for batch in self.source.batches():
            self.events += len(batch)
            yield batch


def dead_letter_status(command: str, verdict: Diagnosis, path: Path) -> int:
    """0, or :data:`~pipeline.replay.dead_letter_check.EXIT_MOSTLY_DEAD` with the reasons and a fix."""
    if not verdict.failed:
        return 0
    for line in verdict.lines(path):
        print(f"ctr {command}: {line}", file=sys.stderr)
    return EXIT_MOSTLY_DEAD
