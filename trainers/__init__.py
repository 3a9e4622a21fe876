"""CTR models, the incremental training loop, evaluation, the promotion gate and MLflow registration.

- :mod:`trainers.encoding` — impressions + streaming features -> hashed ids and dense inputs;
- :mod:`trainers.models` — DeepFM and logistic regression over one shared hashed embedding table;
- :mod:`trainers.rowwise` — :class:`RowwiseAdam`, lazy Adam on the embedding rows a batch used;
- :mod:`trainers.learner` — :class:`TorchLearner`: learn / predict / clone / save / load;
- :mod:`trainers.metrics` — AUC, logloss, normalized entropy, calibration;
- :mod:`trainers.gate` — the promotion gate;
- :mod:`trainers.registry` — :class:`MlflowModelStore` (imports MLflow: loaded only when used);
- :mod:`trainers.incremental` — :class:`IncrementalTrainer`, one block at a time.

Names are imported lazily (the gate function lives at ``trainers.gate.gate``: the module name
wins) so that ``import trainers.metrics`` does not pay for torch or MLflow.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "MODELS",
    "BlockReport",
    "Encoder",
    "GateDecision",
    "IncrementalTrainer",
    "MlflowModelStore",
    "TorchLearner",
    "block_metrics",
]

_WHERE = {
    "MODELS": "trainers.models",
    "BlockReport": "trainers.incremental",
    "Encoder": "trainers.encoding",
    "GateDecision": "trainers.gate",
    "IncrementalTrainer": "trainers.incremental",
    "MlflowModelStore": "trainers.registry",
    "TorchLearner": "trainers.learner",
    "block_metrics": "trainers.metrics",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'trainers' has no attribute {name!r}")
