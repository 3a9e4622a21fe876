"""Shared fixtures. Integration fixtures (real Kafka, Redis, MLflow server) live in tests/integration."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("FEAST_USAGE", "False")
