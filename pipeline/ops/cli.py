"""The `ctr` command line.

ctr demo       the whole loop in one process with replicas: the drifting simulator, or --source LOG
ctr simulate   write a simulated impression/click stream to a JSONL file
ctr backtest   replay a log at full speed on the daemons' engine, compare online vs static vs FTRL
ctr produce    publish the simulated stream, or --source LOG, to Kafka for the daemons
ctr status     services, lag, throughput, models and replicas on one screen (--json)
ctr ab         live A/B readout: CTR, AUC, NE, calibration per served version, with CIs (pipeline/ops/ab.py)
ctr config     print the effective configuration (defaults < --config file < CTR_* environment)
ctr rollback   move the champion alias to an older version, with who/when/why (serving_bridge/rollback.py)
ctr versions   versions, aliases, block metrics and rollback tags
ctr deploy install   config, environment file, state folders and systemd units (pipeline/ops/deploy.py)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import get_args

from pipeline.core.config import ConfigError
from pipeline.core.config_loader import load_config
from pipeline.core.config_types import ModelName
from pipeline.core.logs import dump_stacks_on_sigusr1
from pipeline.ops.arg_types import count, out_problem, port, ports, positive
from pipeline.ops.probes import registry_down
from pipeline.replay.backtest_cli import add_input_arguments
from pipeline.sources.jsonl_mapping import write_jsonl
from pipeline.sources.open import FORMATS
from pipeline.sources.worlds import WORLDS, open_world

__all__ = ["main"]


def _log_arguments(p: argparse.ArgumentParser) -> None:
    """--source/--format and the JSONL input options (a log instead of the simulator)."""
    p.add_argument("--source", type=Path, help="a log file or folder instead of the simulator")
    p.add_argument("--format", choices=[f for f in FORMATS if f != "simulator"], default="jsonl")
    add_input_arguments(p)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ctr", description="Real-time online learning for CTR prediction.")
    p.add_argument("--config", type=Path, help="TOML config file (fields: see pipeline/core/config.py)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the whole loop in one process, with replicas: simulator or --source log")
    d.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (wiped first)")
    d.add_argument("--impressions", type=count, default=650_000, help="simulated impressions")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--train-every", type=count, help="examples per block (default: config, 100,000)")
    _log_arguments(d)

    s = sub.add_parser("simulate", help="write a simulated stream to a JSONL file")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--impressions", type=count, default=100_000)
    s.add_argument("--seed", type=int, default=7)
    s.add_argument(
        "--world",
        choices=WORLDS,
        default="simulator",
        help="simulator (drifting interests, [simulator] config), lifecycle (ad life cycles, position bias, "
        "CTR ~0.5%%), shifts (abrupt shifts, new-user bursts, late clicks, CTR ~2-3%%) or catalog "
        "(catalogue churn, item quality in a random walk, heavy users, CTR ~9%%); "
        "pipeline/sources/worlds/",
    )

    r = sub.add_parser(
        "replay", help="folded into `ctr backtest`, `ctr demo --source`, `ctr produce --source`"
    )
    for flag in ("--source", "--format", "--out", "--train-every", "--rate"):  # old options: says what to use
        r.add_argument(flag)
    r.add_argument("--to-kafka", action="store_true")
    add_input_arguments(r)

    pr = sub.add_parser("produce", help="publish the simulated stream, or a --source log, to Kafka")
    pr.add_argument("--impressions", type=count, default=100_000, help="simulated impressions")
    pr.add_argument("--seed", type=int, default=7)
    pr.add_argument("--rate", type=positive, help="events per second (default: as fast as possible)")
    _log_arguments(pr)

    for name, what in (("joiner", "impressions + clicks -> examples"), ("trainer", "examples -> versions")):
        dp = sub.add_parser(name, help=f"daemon: {what}")
        dp.add_argument("--exit-when-idle", type=float, metavar="S", help="stop after S s without input")

    sv = sub.add_parser("serve", help="daemon: one scoring replica")
    sv.add_argument("--port", type=port, default=8080)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--name", help="replica name (default: serve-<port>)")

    b = sub.add_parser("backtest", help="replay a log through the live loop; report vs static and FTRL")
    b.add_argument("--source", type=Path, help="file or folder (OBD: the dataset folder); not for simulator")
    b.add_argument("--format", choices=FORMATS, default="jsonl")
    b.add_argument("--train-every", type=count, help="examples per block (default: config, 100,000)")
    b.add_argument("--model", choices=get_args(ModelName), help="default: config (deepfm)")
    b.add_argument("--attribution-window", type=positive, help="seconds (default: config, 900)")
    b.add_argument("--seed", type=int, default=7, help="simulator, click delays, trainer, bootstrap")
    b.add_argument("--impressions", type=count, default=1_000_000, help="simulated impressions (simulator)")
    b.add_argument(
        "--world",
        choices=WORLDS,
        default="simulator",
        help="--format simulator: the world (see ctr simulate)",
    )
    b.add_argument("--out", type=Path, default=Path("runs/backtest"))
    b.add_argument(
        "--examples-out", type=Path, help="also write every labelled example, in training order, as JSONL"
    )
    add_input_arguments(b)

    st = sub.add_parser("status", help="services, lag, throughput, models and replicas on one screen")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--replica", action="append", default=[], help="replica base URL (default: config)")
    st.add_argument("--blocks", type=count, default=5, help="how many recent versions to show")

    sub.add_parser("config", help="print the effective configuration as JSON")
    from pipeline.ops import ab

    ab.add_arguments(sub)
    _deploy_parser(sub)
    from serving_bridge.rollback_cli import add_arguments as rollback_arguments

    rollback_arguments(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    dump_stacks_on_sigusr1()  # kill -USR1 <pid>: every thread's stack to the log
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "status" and not args.verbose:  # its report says what is down, and why
        logging.getLogger("kafka").setLevel(logging.CRITICAL)  # not kafka-python's retries above it
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("FEAST_USAGE", "False")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its INFO lines drown the block table
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # for developers, not operators
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"ctr: {exc}", file=sys.stderr)
        return 2
    if args.command in ("ab", "rollback", "versions") and (down := registry_down(cfg)):
        print(f"ctr {args.command}: {down}", file=sys.stderr)
        return 2
    if getattr(args, "train_every", None) is not None:
        cfg.trainer.train_every = args.train_every
    if cfg.daemon.log_format == "json":
        from pipeline.core.logs import set_context, use_json_logs

        use_json_logs(logging.INFO if args.verbose else logging.WARNING)
        set_context(daemon=args.command)

    if args.command == "config":
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.command == "status":
        from pipeline.ops.status import collect
        from pipeline.ops.status_view import render

        status = collect(cfg, args.replica, args.blocks)
        print(json.dumps(status, indent=2) if args.json else render(status))
        return 0 if all(svc["up"] for svc in status["services"].values()) else 1
    if problem := out_problem(args.command, getattr(args, "out", None)):
        print(f"ctr {args.command}: {problem}", file=sys.stderr)
        return 2
    if args.command == "simulate":
        n = write_jsonl(open_world(args.world, args.seed, cfg.simulator).stream(args.impressions), args.out)
        print(f"wrote {n:,} events to {args.out}")
        return 0
    if args.command == "demo" and args.source is not None:
        from pipeline.replay.backtest_cli import replay

        return replay(cfg, args)
    if args.command == "demo":
        from pipeline.replay.runner import run_demo

        run_demo(cfg, args.out, args.impressions, args.seed)
        return 0
    if args.command == "replay":
        print(
            "ctr: `ctr replay` was folded into the commands that share its engine: `ctr backtest --source "
            "LOG` (a replay with baselines and a report), `ctr demo --source LOG` (with in-process "
            "replicas), `ctr produce --source LOG` (the log to Kafka, for the daemons)",
            file=sys.stderr,
        )
        return 2
    if args.command == "produce" and args.source is not None:
        from pipeline.replay.backtest_cli import produce_log

        return produce_log(cfg, args)
    if args.command in ("trainer", "backtest") and cfg.trainer.ranks > 1 and "WORLD_SIZE" not in os.environ:
        from pipeline.ops.ranks import run_ranks

        return run_ranks(cfg.trainer.ranks, sys.argv[1:] if argv is None else argv)
    if args.command == "backtest":
        from pipeline.replay.backtest_cli import backtest

        return backtest(cfg, args)
    if args.command == "produce":
        from pipeline.kafka.io import ensure_topics, publish_stream
        from pipeline.sources.simulator import Simulator

        k = cfg.kafka
        ensure_topics(k, [k.impressions_topic, k.clicks_topic, k.conversions_topic], k.partitions)
        events = Simulator(cfg.simulator, args.seed).stream(args.impressions)
        counts = publish_stream(k, events, args.rate, progress=True, validation=cfg.validation)
        print(json.dumps(counts))
        return 0
    if args.command == "joiner":
        from pipeline.daemons.joiner import JoinerDaemon

        print(json.dumps(JoinerDaemon(cfg).run(max_idle_s=args.exit_when_idle)))
        return 0
    if args.command == "trainer":
        from pipeline.daemons.trainer import TrainerDaemon
        from pipeline.daemons.trainer_ranks import follow, join
        from trainers.sharding import leave_group

        rank = join(cfg)
        try:
            if rank:  # a follower: rank 0 prints the counts
                follow(cfg)
                return 0
            print(json.dumps(TrainerDaemon(cfg, ranked=rank == 0).run(max_idle_s=args.exit_when_idle)))
            return 0
        finally:
            leave_group()
    if args.command == "deploy":
        return _deploy(args)
    if args.command == "ab":
        from pipeline.ops import ab

        return ab.run(cfg, args)
    if args.command in ("rollback", "versions"):
        from serving_bridge import rollback_cli

        return rollback_cli.run(cfg, args)
    if args.command == "serve":
        from serving_bridge.process import run_replica

        run_replica(cfg, args.host, args.port, args.name or f"serve-{args.port}")
        return 0
    return 2  # pragma: no cover - argparse enforces the choices


def _deploy_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dep = sub.add_parser("deploy", help="install the systemd services")
    dep_sub = dep.add_subparsers(dest="action", required=True)
    i = dep_sub.add_parser("install", help="lay out config, env file, folders and units under a prefix")
    i.add_argument("--prefix", type=Path, required=True, help="/ on a host; a scratch folder to try")
    i.add_argument("--user", required=True, help="the dedicated user the services run as")
    i.add_argument("--group", help="default: the user's name")
    i.add_argument("--unit-dir", type=Path, help="default: <prefix>/etc/systemd/system")
    i.add_argument("--venv", type=Path, default=Path(sys.prefix), help="environment with ctr (default: ours)")
    i.add_argument("--kafka-libs", type=Path, help="Kafka jars (default: what deploy/services.sh fetched)")
    i.add_argument("--kafka-port", type=port, default=9092)
    i.add_argument("--mlflow-port", type=port, default=5000)
    i.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    i.add_argument("--serve-ports", type=ports, default=(8081, 8082), help="one ctr-serve@<port> each")
    i.add_argument("--create-user", action="store_true", help="useradd --system the user if missing (root)")
    i.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")


def _deploy(args: argparse.Namespace) -> int:
    from pipeline.ops.deploy import Installer, InstallOptions

    try:
        opts = InstallOptions(
            prefix=args.prefix,
            user=args.user,
            group=args.group,
            unit_dir=args.unit_dir,
            venv=args.venv,
            kafka_libs=args.kafka_libs,
            kafka_port=args.kafka_port,
            mlflow_port=args.mlflow_port,
            redis_url=args.redis_url,
            serve_ports=args.serve_ports,
            create_user=args.create_user,
            dry_run=args.dry_run,
        )
        Installer(opts).run()
    except (OSError, ValueError, KeyError) as exc:
        print(f"ctr deploy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
