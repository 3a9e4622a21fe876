"""The `ctr` command line.

ctr demo       the whole loop in one process on the drifting simulator (embedded profile)
ctr simulate   write a simulated impression/click stream to a JSONL file
ctr replay     run the loop over a JSONL or Avazu CSV file (embedded profile): a backtest
ctr config     print the effective configuration (defaults < --config file < CTR_* environment)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from pipeline.config import ConfigError, load_config

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctr", description="Real-time online learning for CTR prediction.")
    p.add_argument("--config", type=Path, help="TOML config file (fields: see pipeline/config.py)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run the whole loop in one process on the drifting simulator")
    d.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (wiped first)")
    d.add_argument("--impressions", type=int, default=650_000, help="simulated impressions")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--train-every", type=int, help="examples per block (default: config, 100,000)")

    s = sub.add_parser("simulate", help="write a simulated stream to a JSONL file")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--impressions", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=7)

    r = sub.add_parser("replay", help="run the loop over a historical file (backtest, embedded profile)")
    r.add_argument("--source", type=Path, required=True, help="JSONL file (or Avazu train.csv)")
    r.add_argument("--format", choices=["jsonl", "avazu"], default="jsonl")
    r.add_argument("--out", type=Path, default=Path("runs/replay"))
    r.add_argument("--train-every", type=int)

    r.add_argument("--to-kafka", action="store_true", help="publish the file to the Kafka topics")
    r.add_argument("--rate", type=float, help="with --to-kafka: events per second (default: max)")

    pr = sub.add_parser("produce", help="publish a simulated stream to Kafka")
    pr.add_argument("--impressions", type=int, default=100_000)
    pr.add_argument("--seed", type=int, default=7)
    pr.add_argument("--rate", type=float, help="events per second (default: as fast as possible)")

    for name, what in (("joiner", "impressions + clicks -> examples"), ("trainer", "examples -> versions")):
        dp = sub.add_parser(name, help=f"daemon: {what}")
        dp.add_argument("--exit-when-idle", type=float, metavar="S", help="stop after S s without input")

    sv = sub.add_parser("serve", help="daemon: one scoring replica")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--name", help="replica name (default: serve-<port>)")

    sub.add_parser("config", help="print the effective configuration as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("FEAST_USAGE", "False")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its INFO lines drown the block table
    warnings.filterwarnings("ignore", module=r"(mlflow|feast|sqlalchemy)\b.*")  # third-party notices
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"ctr: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "train_every", None):
        cfg.trainer.train_every = args.train_every

    if args.command == "config":
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.command == "simulate":
        from pipeline.simulator import Simulator, write_jsonl

        n = write_jsonl(Simulator(cfg.simulator, args.seed).stream(args.impressions), args.out)
        print(f"wrote {n:,} events to {args.out}")
        return 0
    if args.command == "demo":
        from pipeline.runner import run_demo

        run_demo(cfg, args.out, args.impressions, args.seed)
        return 0
    if args.command == "replay" and args.to_kafka:
        from pipeline.kafka_io import replay_file_to_kafka

        print(json.dumps(replay_file_to_kafka(cfg.kafka, args.source, rate=args.rate)))
        return 0
    if args.command == "replay":
        from pipeline.runner import run_replay

        run_replay(cfg, args.source, args.format, args.out)
        return 0
    if args.command == "produce":
        from pipeline.kafka_io import ensure_topics, publish_stream
        from pipeline.simulator import Simulator

        k = cfg.kafka
        ensure_topics(k, [k.impressions_topic, k.clicks_topic], k.partitions)
        counts = publish_stream(k, Simulator(cfg.simulator, args.seed).stream(args.impressions), args.rate)
        print(json.dumps(counts))
        return 0
    if args.command == "joiner":
        from pipeline.joiner_daemon import JoinerDaemon

        print(json.dumps(JoinerDaemon(cfg).run(max_idle_s=args.exit_when_idle)))
        return 0
    if args.command == "trainer":
        from pipeline.trainer_daemon import TrainerDaemon

        print(json.dumps(TrainerDaemon(cfg).run(max_idle_s=args.exit_when_idle)))
        return 0
    if args.command == "serve":
        from serving_bridge.process import run_replica

        run_replica(cfg, args.host, args.port, args.name or f"serve-{args.port}")
        return 0
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
