"""MLflow model registry as the :class:`pipeline.core.types.ModelStore` of trained learners.

Each :meth:`MlflowModelStore.publish` makes one MLflow run (params = trainer config and model spec,
metrics = the block's metrics) that outputs one MLflow-3 logged model in pyfunc "models from code"
format (code: ``trainers/mlflow_model.py``; artifact ``learner``: ``weights.pt`` + ``spec.json``),
and registers it as a new version of ``cfg.model_name``. What the version page shows (a description
of its input, metrics beside its parent's and the gate's reason; ~15 tags, timestamps ISO 8601; the
full lineage in ``lineage.json`` beside ``MLmodel``) is :mod:`trainers.version_page`.
Everything goes through one ``MlflowClient`` bound to this store's URIs: no fluent API and no
process-global tracking URI, so a store for a sqlite file and one for a tracking server can live in
the same process. ``mlflow.pyfunc.load_model("models:/<name>@champion")`` works on what it writes.

The pyfunc model imports ``trainers`` at load time, so the environment that loads it needs the
``ctr-online`` package (it is not on PyPI, hence not in the logged pip requirements; the
``code_version`` tag names the commit).

Embedded profile: ``MlflowModelStore.embedded(cfg, out_dir)`` = ``sqlite:///<out>/mlflow.db`` with
artifacts in ``<out>/mlartifacts``. Production: ``MlflowModelStore(cfg, "http://host:5000")``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.entities import LoggedModelOutput, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types.schema import Array, ColSpec, DataType, Map, Schema, TensorSpec

from pipeline.core.config import RegistryConfig
from trainers.encoding import SEQUENCE_KEY
from trainers.learner import TorchLearner
from trainers.model_registry import ModelRegistry
from trainers.multitask import CONVERSION_COLUMN, PROBABILITY_COLUMN
from trainers.version_page import (
    LINEAGE_FILE,
    describe,
    lineage_document,
    parent_metrics,
    tag_text,
    version_tags,
)

__all__ = ["MlflowModelStore", "code_version", "config_hash"]

_MODEL_CODE = str(Path(__file__).with_name("mlflow_model.py"))


@functools.cache
def code_version() -> str:
    """The git commit of this checkout (``-dirty`` if modified), or ``unknown`` outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def config_hash(learner: TorchLearner) -> str:
    """Short SHA-256 of what decides the model's shape and training (config, model, encoder)."""
    spec = learner.spec()
    blob = json.dumps({k: spec[k] for k in ("config", "model", "encoder")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _pip_requirements() -> list[str]:
    # Explicit, so MLflow never runs its slow requirement inference (it imports and traces the model).
    return [
        f"mlflow=={mlflow.__version__}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={np.__version__}",
        "pandas",
    ]


def _signature(multi_task: bool = False) -> ModelSignature:
    # Explicit: MLflow cannot infer one from the DataFrame type hint and would log a warning on
    # every publish. The five first columns are required (MLflow rejects a NaN where a map is
    # expected); the three maps may be empty. The behaviour sequence (DIN) is its own optional column.
    # A multi-task model answers two named columns (trainers.mlflow_model), a click model one.
    outputs: list[ColSpec | TensorSpec] = [ColSpec(DataType.double)]
    if multi_task:
        outputs = [ColSpec(DataType.double, PROBABILITY_COLUMN), ColSpec(DataType.double, CONVERSION_COLUMN)]
    return ModelSignature(
        inputs=Schema(
            [
                ColSpec(DataType.string, "user_id"),
                ColSpec(DataType.string, "item_id"),
                ColSpec(Map(DataType.string), "features"),
                ColSpec(Map(DataType.double), "dense"),
                ColSpec(Map(DataType.double), "stream_features"),
                ColSpec(Array(DataType.string), SEQUENCE_KEY, required=False),
            ]
        ),
        outputs=Schema(outputs),
    )


def _input_example(learner: TorchLearner) -> pd.DataFrame:
    """One impression in the signature's shape, with the learner's own field names (for the UI)."""
    enc = learner.encoder
    return pd.DataFrame(
        [
            {
                "user_id": "u_example",
                "item_id": "item_example",
                "features": {f: "example" for f in enc.fields[2:]},
                "dense": dict.fromkeys(enc.dense_keys, 0.0),
                "stream_features": dict.fromkeys(enc.stream_keys, 0.0),
            }
        ]
    )


def _flatten(prefix: str, d: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(f"{prefix}{k}.", v))
        else:
            out[f"{prefix}{k}"] = tag_text(v)
    return out


class MlflowModelStore(ModelRegistry):
    """Publishes :class:`TorchLearner` versions to an MLflow registry; aliases name the live one."""

    def __init__(
        self,
        cfg: RegistryConfig,
        tracking_uri: str | None = None,
        *,
        artifact_location: str | None = None,
        registry_uri: str | None = None,
        optimizer_state: bool | None = None,
    ) -> None:
        """``optimizer_state`` (default ``cfg.optimizer_state``): also store the Adam moments, 3x
        the artifact, so that a resumed trainer continues exactly; otherwise a loaded learner starts
        with fresh moments (they re-warm within a block)."""
        super().__init__(cfg, tracking_uri, registry_uri)
        self.cfg = cfg
        self.optimizer_state = cfg.optimizer_state if optimizer_state is None else optimizer_state
        self.experiment_id = self._experiment(artifact_location or cfg.artifact_root or None)
        self.last_publish_s = math.nan  # seconds the last publish took (for benchmarks and logs)

    @classmethod
    def embedded(cls, cfg: RegistryConfig, out_dir: str | Path, **kwargs: Any) -> MlflowModelStore:
        """The embedded profile: sqlite tracking store and artifact folder under ``out_dir``."""
        out = Path(out_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        uri = cfg.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
        artifacts = cfg.artifact_root or (out / "mlartifacts").as_uri()
        return cls(cfg, uri, artifact_location=artifacts, **kwargs)

    def _experiment(self, artifact_location: str | None) -> str:
        exp = self.client.get_experiment_by_name(self.cfg.experiment)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(
                self.client.create_experiment(self.cfg.experiment, artifact_location=artifact_location)
            )
        except MlflowException:  # created concurrently by another process
            exp = self.client.get_experiment_by_name(self.cfg.experiment)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def _ensure_registered_model(self) -> None:
        try:
            self.client.create_registered_model(self.name)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise

    # -- ModelStore ------------------------------------------------------------------------------
    def publish(self, model: TorchLearner, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        """Log ``model`` as a new registered version with ``lineage`` and ``metrics``; its number."""
        start = time.perf_counter()
        lineage = {"code_version": code_version(), "config_hash": config_hash(model)} | dict(lineage)
        tags = version_tags(lineage, metrics)
        parent = self._parent(lineage.get("parent_version"))
        description = describe(lineage, metrics, parent)
        run = self.client.create_run(
            self.experiment_id,
            tags=tags | {"mlflow.note.content": description},  # the run page says the same
            run_name=f"{self.name}-block-{lineage.get('block', '?')}",
        )
        run_id = run.info.run_id
        try:
            spec = model.spec()
            params = _flatten("trainer.", spec["config"]) | _flatten("model.", spec["model"])
            now = int(time.time() * 1000)
            self.client.log_batch(
                run_id,
                metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(float(v))],
                params=[Param(k, v) for k, v in params.items()],
            )
            logged = self.client.create_logged_model(
                self.experiment_id, name=self.name, source_run_id=run_id, tags=tags
            )
            with tempfile.TemporaryDirectory(prefix="ctr-publish-") as tmp:
                learner_dir = model.save(Path(tmp) / "learner", optimizer=self.optimizer_state)
                local = Path(tmp) / "model"
                meta = Model(
                    artifact_path=logged.artifact_location,
                    model_uuid=logged.model_id,
                    run_id=run_id,
                    model_id=logged.model_id,
                )
                mlflow.pyfunc.save_model(
                    str(local),
                    mlflow_model=meta,
                    python_model=_MODEL_CODE,
                    artifacts={"learner": str(learner_dir)},
                    pip_requirements=_pip_requirements(),
                    signature=_signature(model.multi_task),
                    input_example=_input_example(model),
                )
                (local / LINEAGE_FILE).write_text(lineage_document(lineage, metrics, tags, parent))
                self.client.log_model_artifacts(logged.model_id, str(local))
            self.client.finalize_logged_model(logged.model_id, "READY")
            self.client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
            self._ensure_registered_model()
            # source = the logged model's storage location, not "models:/<id>": the sqlite registry
            # store resolves "models:/<id>" with the process-global tracking URI (an MLflow TODO),
            # which is not ours. With model_id given, a tracking server accepts it too.
            version = self.client.create_model_version(
                self.name,
                source=logged.artifact_location,
                run_id=run_id,
                tags=tags,
                description=description,
                model_id=logged.model_id,
            )
            self.client.set_terminated(run_id, "FINISHED")
        except BaseException:
            with contextlib.suppress(Exception):  # keep the original error, not a follow-up one
                self.client.set_terminated(run_id, "FAILED")
            raise
        self.last_publish_s = time.perf_counter() - start
        return str(version.version)

    def _parent(self, version: Any) -> dict[str, Any] | None:
        """The parent version's block and tagged metrics (for the description); None if none."""
        if version is None or str(version) == "none":
            return None
        try:
            tags = self.client.get_model_version(self.name, str(version)).tags or {}
        except MlflowException as exc:  # deleted: describe without it; an outage is raised (retried)
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        return {"version": str(version), "block": tags.get("block"), "metrics": parent_metrics(tags)}

    def load(self, version: str, *, device: str | None = None) -> TorchLearner:
        """Download ``version``'s ``MLmodel`` and learner folder and rebuild its learner
        (``weights_only=True``).

        Only those two: the rest of the model's files (environment files, input examples, the
        pyfunc wrapper) are for ``mlflow.pyfunc`` users. Downloading the whole folder took ~12
        requests to the MLflow server per load, and every serving worker loads every version.
        """
        with tempfile.TemporaryDirectory(prefix="ctr-load-") as tmp:
            learner = TorchLearner.load(self.download(version, Path(tmp)), device=device)
        learner.version = str(version)
        return learner

    def download(self, version: str, dst: Path) -> Path:
        """``version``'s learner folder (what :meth:`TorchLearner.load` reads), under ``dst``."""
        # Resolve the storage URI with our client: a "models:/name/version" URI is resolved by
        # MLflow with the process-global registry URI, whatever registry_uri= says.
        uri = self.client.get_model_version_download_uri(self.name, str(version)).rstrip("/")
        mlmodel = mlflow.artifacts.download_artifacts(
            artifact_uri=f"{uri}/MLmodel", dst_path=str(dst), tracking_uri=self.tracking_uri
        )
        conf = Model.load(mlmodel).flavors["python_function"]
        rel = conf["artifacts"]["learner"]["path"]
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"{uri}/{rel}", dst_path=str(dst / "learner"), tracking_uri=self.tracking_uri
        )
        return Path(local)

    # -- inspection ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"MlflowModelStore({self.tracking_uri!r}, model={self.name!r})"
