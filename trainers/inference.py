"""How a served model runs its forward pass: eager, or traced and frozen TorchScript.

A serving replica scores 1 user x 100 candidates per request with one torch thread; there the
eager forward of the default DeepFM is mostly per-op overhead (Python module calls, attribute
lookups, the dispatcher), not arithmetic. :func:`frozen_scorer` traces the model once with example
inputs and freezes it (``torch.jit.freeze``: weights and buffers become constants, the module
hierarchy is inlined): the forward of 100 rows went from 0.251 to 0.180 ms p50 (DeepFM; DCN-V2 0.310
to 0.240, LR 0.070 to 0.048) with the same probabilities (``benchmarks/inference.py``,
benchmarks/README.md "Inference paths"; torch.compile, int8 and bf16 were slower there).

One code path for every device: the trace runs on the model's device under the learner's autocast
dtype (bf16 on CUDA, none on the CPU), so the casts are recorded in the graph and freezing folds
the weights' casts into bf16 constants; a CPU test passes ``amp_dtype=torch.bfloat16`` to exercise
what CUDA runs. A traced graph is checked against the eager model on a probe batch before it is
used; if tracing fails (``torch.jit`` warns that it is deprecated, once per process: a later
torch may drop it) or the check does not hold, the scorer is None and the learner stays eager (a
WARNING says why).

A multi-task model (:func:`trainers.models.is_multi_task`) serves two traced graphs: its forward
(the click logit, as every model) and, with ``tasks=True``, its ``task_logits`` (``(n, 2)``: click
and conversion logits), each frozen and checked the same way.

>>> from trainers.models import build_model, model_spec
>>> m = build_model(model_spec("lr", n_fields=2, n_dense=1, hash_buckets=16)).eval()
>>> f = frozen_scorer(m, n_fields=2, n_dense=1, device=torch.device("cpu"), amp_dtype=None)
>>> f(torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 1)).shape
torch.Size([3])
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

__all__ = ["INFERENCE_PATHS", "Scorer", "frozen_scorer", "load_scorer", "probe_inputs", "save_scorer"]

log = logging.getLogger(__name__)

INFERENCE_PATHS = ("eager", "torchscript")  # pipeline.core.config_types.InferencePath
Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, dense) -> logits
_PROBE_ROWS = 64
# logits: fp32 traced vs eager agree to ~1e-6; in bf16 both round alike (they run the same ops)
_TOLERANCE = {None: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-2}


def probe_inputs(
    n_rows: int, n_fields: int, n_dense: int, hash_buckets: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed batch of ids in ``[0, hash_buckets)`` and dense values in [0, 1) (own RNG: the
    caller's global torch stream is not disturbed)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hash_buckets, (n_rows, n_fields), generator=gen)
    dense = torch.rand(n_rows, n_dense, generator=gen)
    return ids.to(device), dense.to(device)


def _warm(scorer: Scorer, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """Run ``scorer`` on the probe batch as a request would; its last output. TorchScript's profiling
    executor optimises a graph on its first runs in each process: here, not on a request."""
    for _ in range(3):
        scorer(ids[:1], dense[:1])
        got = scorer(ids, dense).float()
    return got


def save_scorer(scorer: Scorer, path: Path) -> None:
    """Write a traced scorer to ``path`` (``torch.jit.save``)."""
    torch.jit.save(scorer, str(path))


def load_scorer(
    path: Path,
    *,
    n_fields: int,
    n_dense: int,
    hash_buckets: int,
    device: torch.device,
    amp_dtype: torch.dtype | None,
) -> Scorer:
    """A scorer written by :func:`save_scorer`, loaded onto ``device`` and warmed.

    About 3 ms here for the default DeepFM, and ``torch.jit.load`` does not hold the GIL: what a
    serving worker does at a swap once the tracing has been done elsewhere (serving_bridge.model_cache).
    """
    scorer: Scorer = torch.jit.load(str(path), map_location=device)
    ids, dense = probe_inputs(_PROBE_ROWS, n_fields, n_dense, hash_buckets, device)
    with torch.inference_mode(), _autocast(device, amp_dtype):
        _warm(scorer, ids, dense)
    return scorer


def _autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


class _TaskLogits(nn.Module):
    """A multi-task model's ``task_logits`` as a module's forward: what tracing records."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.task_logits(ids, dense)  # type: ignore[operator]
        return out


def frozen_scorer(
    model: nn.Module,
    *,
    n_fields: int,
    n_dense: int,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    tasks: bool = False,
) -> Scorer | None:
    """``model`` traced on ``device`` under ``amp_dtype`` autocast and frozen, or None (see above);
    ``tasks=True``: its ``task_logits`` instead of its forward (a multi-task model's).

    The frozen graph holds the weights as they are now: it must be rebuilt after they change.
    """
    buckets = int(getattr(model, "spec", {}).get("hash_buckets", 2))
    ids, dense = probe_inputs(_PROBE_ROWS, n_fields, n_dense, buckets, device)
    was_training = model.training
    traced = _TaskLogits(model) if tasks else model
    traced.eval()
    try:
        # torch.jit's FutureWarnings show once per process; not silenced here: catch_warnings
        # swaps the process's filters, a race with the other replicas' loads and the requests.
        with torch.no_grad(), _autocast(device, amp_dtype):
            frozen = torch.jit.freeze(torch.jit.trace(traced, (ids, dense), check_trace=False))
        with torch.inference_mode(), _autocast(device, amp_dtype):
            want = traced(ids, dense).float()
            got = _warm(frozen, ids, dense)
        gap = float((got - want).abs().max())
    except Exception as exc:  # an op TorchScript cannot trace, torch.jit gone in a later torch
        log.warning("inference: tracing %s failed (%r); scoring eagerly", type(model).__name__, exc)
        return None
    finally:
        model.train(was_training)
    if not gap <= _TOLERANCE.get(amp_dtype, 5e-2):
        log.warning(
            "inference: traced %s differs from eager by %.3g; scoring eagerly", type(model).__name__, gap
        )
        return None
    scorer: Scorer = frozen
    return scorer
