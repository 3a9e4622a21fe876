"""The embedded profile's adapters, wired together: nothing to start, everything under one folder.

- model store: MLflow with a SQLite tracking store and a local artifact folder (``<out>/mlflow.db``);
- features: Feast with its SQLite online store and a parquet offline log (``<out>/feast``);
- serving: ``cfg.serving.replicas`` in-process replicas watching the champion alias;
- dead letters: ``<out>/dead_letters.jsonl``.

The production profile swaps these adapters (Kafka, Redis, an MLflow server, replica processes);
the loop, joiner, features and trainer do not change.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from tqdm import tqdm

from features.store import FeatureWriter, OnlineFeatureReader, open_store
from pipeline.core.config import Config
from pipeline.core.pseudonyms import Pseudonymizer
from pipeline.replay.sinks import JsonlDeadLetters
from serving_bridge.fleet import Fleet
from serving_bridge.online_offset import MemoryOffsets, OffsetPublisher
from serving_bridge.replica import Replica
from trainers.incremental import IncrementalTrainer
from trainers.registry import MlflowModelStore

__all__ = ["EmbeddedStack"]


@dataclass
class EmbeddedStack:
    cfg: Config
    out: Path
    store: MlflowModelStore
    trainer: IncrementalTrainer
    feature_writer: FeatureWriter
    fleet: Fleet
    dead_letters: JsonlDeadLetters
    offsets: OffsetPublisher

    @classmethod
    def open(cls, cfg: Config, out: Path) -> EmbeddedStack:
        out = out.resolve()
        store = MlflowModelStore.embedded(cfg.registry, out)
        features = open_store(out / "feast", "embedded", project=cfg.features.project, cfg=cfg.features)
        reader = OnlineFeatureReader(features, cfg.features)
        pseudonymize = Pseudonymizer(cfg.validation.pseudonym_key.get_secret_value(), "u_")
        board = MemoryOffsets()  # the trainer's online offset, in process
        replicas = [
            Replica(
                f"r{i}",
                store,
                reader,
                pseudonymize,
                alias=cfg.registry.champion_alias,
                poll_interval_s=cfg.serving.poll_interval_s,
                inference=cfg.serving.inference,
                offsets=board,
            )
            for i in range(cfg.serving.replicas)
        ]
        return cls(
            cfg=cfg,
            out=out,
            store=store,
            trainer=IncrementalTrainer(
                cfg.trainer,
                store,
                alias=cfg.registry.champion_alias,
                resume=False,
                label_delay_ms=cfg.joiner.label_delay_ms,
                serves_offset=True,
            ),
            feature_writer=FeatureWriter(features, cfg.features),
            fleet=Fleet.start(replicas),
            dead_letters=JsonlDeadLetters(out / "dead_letters.jsonl"),
            offsets=OffsetPublisher(board),
        )

    @staticmethod
    def progress(total: int | None, desc: str) -> tqdm[Any]:
        return tqdm(
            total=total,
            desc=desc,
            unit="ev",
            unit_scale=True,
            file=sys.stderr,
            leave=False,
            mininterval=1.0,
            disable=not sys.stderr.isatty(),
        )

    def ui_command(self) -> str:
        mlflow_bin = Path(sys.executable).parent / "mlflow"  # the venv's, whatever is on PATH
        return f"{mlflow_bin} ui --backend-store-uri {self.store.tracking_uri} --host 127.0.0.1 --port 5000"

    def log_summary_run(self, summary: dict[str, Any], files: list[Path]) -> str:
        """One MLflow run holding the whole replay: per-block metrics as steps, summary, plot."""
        mlflow.set_tracking_uri(self.store.tracking_uri)
        with mlflow.start_run(experiment_id=self.store.experiment_id, run_name="loop-summary") as run:
            mlflow.set_tags({"kind": "loop-summary", "champion_version": str(summary["champion_version"])})
            for row in summary["per_block"]:
                step = row["block"]
                mlflow.log_metrics({f"online_{k}": v for k, v in row["online"].items()}, step=step)
                if row["static"]:
                    mlflow.log_metrics({f"static_{k}": v for k, v in row["static"].items()}, step=step)
                if row["freshness_s"] is not None:
                    mlflow.log_metric("freshness_s", row["freshness_s"], step=step)
            for key in ("online_auc", "static_auc", "online_logloss", "static_logloss", "wall_s"):
                mlflow.log_metric(f"mean_{key}" if "auc" in key or "logloss" in key else key, summary[key])
            for f in files:
                mlflow.log_artifact(str(f))
            mlflow.log_artifact(str(self.out / "summary.json"))
            exp, run_id = run.info.experiment_id, run.info.run_id
        return f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}"

    def close(self) -> None:
        self.fleet.stop()
        self.dead_letters.close()
