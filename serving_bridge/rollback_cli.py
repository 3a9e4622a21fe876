"""The `ctr rollback` and `ctr versions` commands: arguments in, a message and an exit code out.

Nothing heavy is imported until a command runs: ``ctr``'s parser is built for every command.

Exit codes: 0 done; 1 refused (unknown version, empty reason, already there; nothing changed) or
the record could not be written; 2 no MLflow server configured.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from pipeline.core.config import Config

if TYPE_CHECKING:
    from serving_bridge.rollback import ModelRegistry

__all__ = ["add_arguments", "run"]


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The two subcommands, on ``ctr``'s subparsers."""
    rb = sub.add_parser("rollback", help="move the champion alias to an older version; records who/when/why")
    rb.add_argument("--to", metavar="VERSION", help="the registered version to serve")
    rb.add_argument("--reason", help="why (recorded as a tag on the version and the model)")
    rb.add_argument("--by", help="who (default: $USER@host)")
    rb.add_argument("--list", action="store_true", help="show the versions instead (as `ctr versions`)")
    rb.add_argument("--json", action="store_true", help="print JSON")
    v = sub.add_parser("versions", help="versions, aliases, block metrics and rollback tags")
    v.add_argument("--json", action="store_true", help="print JSON")


def _store(cfg: Config) -> ModelRegistry | None:
    if not cfg.registry.tracking_uri:
        print(
            "ctr: set CTR_REGISTRY_TRACKING_URI (e.g. http://127.0.0.1:15000, or sqlite:///runs/demo/mlflow.db)",
            file=sys.stderr,
        )
        return None
    from serving_bridge.rollback import ModelRegistry

    return ModelRegistry(cfg.registry)


def run(cfg: Config, args: argparse.Namespace) -> int:
    """Run ``ctr rollback`` or ``ctr versions``; the exit code."""
    from serving_bridge.rollback import RollbackError, rollback
    from serving_bridge.versions_view import format_table, model_rollback_tags, version_rows

    store = _store(cfg)
    if store is None:
        return 2
    if args.command == "versions" or args.list:
        rows = version_rows(store)
        model_tags = model_rollback_tags(store)
        if args.json:
            print(json.dumps({"model": store.name, "versions": rows, "model_tags": model_tags}, indent=2))
        else:
            print(f"model {store.name} at {store.tracking_uri}")
            print(format_table(rows))
            for key, value in sorted(model_tags.items()):
                print(f"{key}: {value}")
        return 0
    if args.to is None or args.reason is None:
        print("ctr rollback: --to VERSION and --reason TEXT are required (or --list)", file=sys.stderr)
        return 1
    try:
        record = rollback(
            store,
            args.to,
            args.reason,
            alias=cfg.registry.champion_alias,
            by=args.by,
            redis_url=cfg.daemon.redis_url,
        )
    except RollbackError as exc:
        print(f"ctr rollback: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(record.to_dict()))
    else:
        push = "announced on Redis" if record.announced else "not announced (replicas poll)"
        print(
            f"{record.model}@{record.alias}: version {record.previous or 'none'} -> {record.version} "
            f"by {record.by} at {record.at}; {push}"
        )
    return 0
