"""The registered model's versions, aliases, lineage tags and ``lineage.json``: MLflow's client only.

:class:`ModelRegistry` imports neither torch nor the learner and creates no experiment, so commands
that never load a model (`ctr rollback`, `ctr versions`) start fast and change nothing else.
:class:`trainers.registry.MlflowModelStore` extends it with publishing and loading.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from pipeline.core.config import RegistryConfig
from trainers.version_page import LINEAGE_FILE

__all__ = ["ModelRegistry"]

_SYSTEM_TAGS = ("mlflow.",)  # tags MLflow sets itself; not part of our lineage
# What MLflow's Databricks request-header provider tries to import before every REST call (five
# dbruntime, two pyspark, four IPython attempts a call): each failed import searches sys.path again,
# ~2-3 ms of CPU per call here; a serving worker polls its aliases every second.
_PROBED_MODULES = ("dbruntime", "pyspark", "IPython")


def _fail_absent_probes_fast() -> None:
    """Mark the modules of :data:`_PROBED_MODULES` that are not installed as absent
    (``sys.modules[name] = None``), so importing them fails at once instead of searching sys.path.
    One that is installed is left alone."""
    for name in _PROBED_MODULES:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]


class ModelRegistry:
    """Versions, aliases and lineage tags of ``cfg.model_name`` in the registry at ``tracking_uri``."""

    def __init__(
        self, cfg: RegistryConfig, tracking_uri: str | None = None, registry_uri: str | None = None
    ) -> None:
        self.tracking_uri = tracking_uri or cfg.tracking_uri
        if not self.tracking_uri:
            raise ValueError(
                f"{type(self).__name__}: no tracking URI; pass one or set registry.tracking_uri"
                + (
                    " (or use MlflowModelStore.embedded(cfg, out_dir))"
                    if type(self) is not ModelRegistry
                    else ""
                )
            )
        self.registry_uri = registry_uri or self.tracking_uri
        self.name = cfg.model_name
        _fail_absent_probes_fast()
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)

    def versions(self) -> list[str]:
        """Every version number of the model, oldest first (empty if there is no such model)."""
        try:
            found = self.client.search_model_versions(f"name = '{self.name}'")
        except MlflowException:
            return []
        return sorted((str(mv.version) for mv in found), key=int)

    def find_by_tag(self, key: str, value: str) -> str | None:
        """The oldest version whose tag ``key`` is ``value`` (one search, however many versions)."""
        if "'" in value or "'" in key:
            raise ValueError(f"find_by_tag: quotes are not allowed in {key!r}={value!r}")
        try:
            found = self.client.search_model_versions(f"name = '{self.name}' and tags.{key} = '{value}'")
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
                return None
            raise
        return min((str(mv.version) for mv in found), key=int, default=None)

    def resolve(self, alias: str) -> str | None:
        """The version ``alias`` points at, or None if the alias (or the model) does not exist."""
        try:
            return str(self.client.get_model_version_by_alias(self.name, alias).version)
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def set_alias(self, alias: str, version: str) -> None:
        """Point ``alias`` at ``version`` (what an operator does in the UI to roll back)."""
        self.client.set_registered_model_alias(self.name, alias, str(version))

    def lineage(self, version: str) -> dict[str, str]:
        """The lineage tags of ``version`` (MLflow's own ``mlflow.*`` tags left out)."""
        mv = self.client.get_model_version(self.name, str(version))
        return {k: v for k, v in mv.tags.items() if not k.startswith(_SYSTEM_TAGS)}

    def lineage_record(self, version: str) -> dict[str, Any]:
        """``version``'s ``lineage.json`` (:mod:`trainers.version_page`): the full lineage, every
        metric, the parent's metrics and the tags. Raises if the version has none (published
        before lineage.json existed: its tags then hold everything)."""
        uri = self.client.get_model_version_download_uri(self.name, str(version))
        with tempfile.TemporaryDirectory(prefix="ctr-lineage-") as tmp:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{uri.rstrip('/')}/{LINEAGE_FILE}", dst_path=tmp, tracking_uri=self.tracking_uri
            )
            record: dict[str, Any] = json.loads(Path(local).read_text())
        return record
