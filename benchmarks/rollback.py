"""Rollback freshness: seconds from a rollback to every `ctr serve` replica serving the target.

Against the running services (`make services-up`): a fresh registered model gets versions 1..3
(`trainers.testing.publish_versions`), ``--replicas`` `ctr serve` processes start on it, then the
champion alias is moved ``--trials`` times round the versions, alternating two ways:

- ``ctr rollback``: the real command as a subprocess (``ctr rollback --to V --reason ...``): moves the
  alias, pushes the swap notification on Redis, writes the who/when/why tags;
- ``alias only`` (the reference, measured in the same run): the alias moved with one MLflow API call
  and no notification, which is what a save in the MLflow UI does; replicas find it by polling
  (``serving.poll_interval_s``).

Every replica's ``GET /version`` and the MLflow alias are polled from their own threads from before
each move (:class:`serving_bridge.replica_processes.SwitchWatch`). The figure that matters is
``alias -> last replica``: from the moment MLflow answers with the new alias to the moment the last
replica answers with the new version (goal: under 2 s). ``start -> last replica`` adds how long the
command took to move the alias (for ``ctr rollback``, mostly Python and MLflow import time).

Run: ``python benchmarks/rollback.py [--trials 6] [--replicas 2]``; writes
``benchmarks/results/rollback.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from pipeline.core.config import RegistryConfig
from pipeline.core.config_loader import load_config
from serving_bridge.replica_processes import ReplicaProcesses, SwitchWatch
from trainers.registry import MlflowModelStore
from trainers.testing import publish_versions

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GOAL_S = 2.0


def service_urls() -> dict[str, str]:
    printed = subprocess.run(
        [str(ROOT / "deploy" / "services.sh"), "env"], capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"^export (CTR_[A-Z_]+)=(.*)$", printed, flags=re.M))


def move(method: str, target: str, store: MlflowModelStore, env: dict[str, str]) -> None:
    if method == "ctr rollback":
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.ops.cli", "rollback", "--to", target, "--reason", "benchmark"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ctr rollback failed: {done.stderr}")
    else:  # what the MLflow UI's "Save aliases" does: one API call, no notification
        MlflowClient(store.tracking_uri).set_registered_model_alias(store.name, "champion", target)


def trial(
    method: str, target: str, store: MlflowModelStore, fleet: ReplicaProcesses, env: dict[str, str]
) -> dict:
    watch = SwitchWatch.replicas(fleet.urls, target, mlflow_alias=lambda: store.resolve("champion"))
    start = time.perf_counter()
    move(method, target, store, env)
    seen = watch.wait(timeout_s=120)
    alias_at = seen.pop("mlflow_alias")
    if alias_at is None or None in seen.values():
        raise RuntimeError(
            f"{method} to {target}: not every replica switched in 120 s: {seen}\n{fleet.logs()}"
        )
    replicas = {u: t for u, t in seen.items() if t is not None}
    return {
        "method": method,
        "target": target,
        "start_to_alias_s": round(alias_at - start, 4),
        "alias_to_replica_s": {u: round(t - alias_at, 4) for u, t in replicas.items()},
        "alias_to_last_replica_s": round(max(replicas.values()) - alias_at, 4),
        "start_to_last_replica_s": round(max(replicas.values()) - start, 4),
    }


def summarize(trials: list[dict], method: str) -> dict[str, Any]:
    rows = [t for t in trials if t["method"] == method]
    last = [t["alias_to_last_replica_s"] for t in rows]
    total = [t["start_to_last_replica_s"] for t in rows]
    return {
        "trials": len(rows),
        "alias_to_last_replica_median_s": round(statistics.median(last), 4),
        "alias_to_last_replica_max_s": round(max(last), 4),
        "start_to_last_replica_median_s": round(statistics.median(total), 4),
        "under_goal": sum(s < GOAL_S for s in last),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=6, help="alias moves in all (half each way)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "rollback.json")
    args = p.parse_args(argv)
    urls = service_urls()
    tag = uuid.uuid4().hex[:10]
    model, experiment = f"bench-rollback-{tag}", f"bench-rollback-{tag}"
    tmp = Path(tempfile.mkdtemp(prefix="ctr-bench-rollback-"))
    env = {
        "CTR_REGISTRY_TRACKING_URI": urls["CTR_REGISTRY_TRACKING_URI"],
        "CTR_REGISTRY_MODEL_NAME": model,
        "CTR_REGISTRY_EXPERIMENT": experiment,
        "CTR_DAEMON_REDIS_URL": urls["CTR_DAEMON_REDIS_URL"],
        "CTR_DAEMON_STATE_DIR": str(tmp / "state"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    store = MlflowModelStore(
        RegistryConfig(model_name=model, experiment=experiment), urls["CTR_REGISTRY_TRACKING_URI"]
    )
    publish_versions(store, 3)
    fleet = ReplicaProcesses.start(args.replicas, env, tmp / "replicas")
    trials: list[dict] = []
    try:
        if not fleet.wait_until_all("3", timeout_s=300):
            raise RuntimeError(f"replicas never served version 3\n{fleet.logs()}")
        current = "3"
        for i in range(args.trials):
            method = "ctr rollback" if i % 2 == 0 else "alias only (UI, poll)"
            target = str((int(current) % 3) + 1)  # 3 -> 1 -> 2 -> 3 ...
            trials.append(trial(method, target, store, fleet, env))
            current = target
    finally:
        fleet.stop()
        try:
            store.client.delete_registered_model(model)
            store.client.delete_experiment(store.experiment_id)
        except Exception as e:
            print(f"warning: cleanup failed: {e!r}", file=sys.stderr)

    methods = ["ctr rollback", "alias only (UI, poll)"]
    summary = {m: summarize(trials, m) for m in methods}
    print(f"\n{'method':<24}{'trials':>7}{'alias->last median':>20}{'max':>8}{'start->last median':>20}")
    for m in methods:
        s = summary[m]
        print(
            f"{m:<24}{s['trials']:>7}{s['alias_to_last_replica_median_s']:>19.3f}s"
            f"{s['alias_to_last_replica_max_s']:>7.3f}s{s['start_to_last_replica_median_s']:>19.3f}s"
        )
    print(f"goal: every replica within {GOAL_S} s of the alias move")
    result = {
        "meta": {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "replicas": args.replicas,
            "poll_interval_s": load_config(None).serving.poll_interval_s,
            "goal_s": GOAL_S,
            "reference": "alias only (UI, poll): one MLflow API call as the UI's save, no Redis push",
            "command": "python benchmarks/rollback.py "
            + " ".join(argv if argv is not None else sys.argv[1:]),
        },
        "summary": summary,
        "trials": trials,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
