"""The vocabulary of :mod:`pipeline.core.config`: its choices (``Literal``), its ranges, its error, masking.

>>> masked("redis://:hunter2@127.0.0.1:6379/0")
'redis://:***@127.0.0.1:6379/0'
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

__all__ = [
    "CHECKED",
    "URL_PASSWORD",
    "Compression",
    "ConfigError",
    "Count",
    "Device",
    "FeaturePath",
    "GateConfidence",
    "InferencePath",
    "LogFormat",
    "ModelName",
    "Natural",
    "NewValues",
    "NonNegative",
    "OpenShare",
    "Port",
    "Positive",
    "RowOptimizer",
    "SaslMechanism",
    "Seconds",
    "Section",
    "SecurityProtocol",
    "SequenceLength",
    "Share",
    "masked",
]


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


# -- the choices (tests/test_config.py pins each to the constant of the module that acts on it) --
# trainers.models.MODELS; esmm (clicks and conversions) needs joiner.conversion_window_s > 0
ModelName = Literal["deepfm", "dcnv2", "lr", "din", "esmm"]
Device = Literal["auto", "cpu", "cuda"]  # trainers.learner.resolve_device
RowOptimizer = Literal["adagrad", "adam", "ftrl"]  # trainers.rowwise
NewValues = Literal["field_mean", "fresh"]  # trainers.models.HashedEmbedding
FeaturePath = Literal["redis", "feast"]  # serving_bridge.process.FEATURE_PATHS
InferencePath = Literal["eager", "torchscript"]  # trainers.inference.INFERENCE_PATHS
LogFormat = Literal["text", "json"]  # pipeline.core.logs
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]  # kafka_client._PROTOCOLS
SaslMechanism = Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]  # kafka_client._SASL, or none
Compression = Literal["", "gzip", "snappy", "lz4", "zstd"]  # kafka-python's codecs, or none

# -- the ranges --------------------------------------------------------------------------------
Count = Annotated[int, Field(ge=1)]  # how many of something: at least one
Natural = Annotated[int, Field(ge=0)]  # a count, size or time where 0 means what the comment says
Seconds = Annotated[float, Field(ge=0)]  # a duration; 0 where the comment says what it means
Positive = Annotated[float, Field(gt=0)]  # a duration, rate or scale that something divides by
Share = Annotated[float, Field(ge=0, le=1)]  # a fraction of a whole
OpenShare = Annotated[float, Field(gt=0, lt=1)]  # a fraction that must leave something on both sides
Port = Annotated[int, Field(ge=0, le=65_535)]  # a TCP port; 0 = off
NonNegative = Annotated[float, Field(ge=0)]  # a weight, exponent or regularization strength
SequenceLength = Annotated[int, Field(ge=0, le=1_000)]  # entries of a behaviour sequence; 0 = none
GateConfidence = Annotated[float, Field(ge=0.5, lt=1)]  # a one-sided confidence level; 0.5 = none

# validate_default: a default that breaks its own rule fails the first load, not a run hours later
CHECKED = ConfigDict(extra="forbid", validate_default=True)
URL_PASSWORD = re.compile(r"(//[^:/@]*):[^@/]*@")


def masked(value: Any) -> Any:
    """The value as it may be shown: a URL without its password (secrets are SecretStr already)."""
    if isinstance(value, str):
        return URL_PASSWORD.sub(r"\1:***@", value)
    if isinstance(value, tuple):
        return tuple(masked(v) for v in value)
    return value


class Section:
    """What every config section shares: a repr with secrets and URL passwords masked."""

    def __repr__(self) -> str:
        shown = (f"{f.name}={masked(getattr(self, f.name))!r}" for f in dataclasses.fields(self))  # type: ignore[arg-type]
        return f"{type(self).__name__}({', '.join(shown)})"
