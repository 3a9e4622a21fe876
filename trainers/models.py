"""CTR models over hashed categorical ids and dense inputs.

Every model is an ``nn.Module`` built from a JSON-able spec (``MODELS[spec["type"]](spec)``) whose
``forward(ids, dense)`` returns one logit per row. Categorical ids index ONE shared
:class:`HashedEmbedding` table with sparse gradients (so SparseAdam only touches the rows a batch
used); it is its own module so DCN-V2 (and later models) reuse it.

>>> spec = model_spec("deepfm", n_fields=3, n_dense=2, hash_buckets=64, embedding_dim=4, hidden=(8,))
>>> m = build_model(spec)
>>> m(torch.zeros(5, 3, dtype=torch.long), torch.zeros(5, 2)).shape
torch.Size([5])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["MODELS", "DCNv2", "DeepFM", "HashedEmbedding", "LogisticRegression", "build_model", "model_spec"]

_INIT_STD = 0.01  # small embeddings: the FM term starts near zero instead of dominating the logit


class HashedEmbedding(nn.Module):
    """One ``(hash_buckets, dim)`` table shared by all categorical fields; sparse gradients."""

    def __init__(self, hash_buckets: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(hash_buckets, dim, sparse=True)
        nn.init.normal_(self.table.weight, std=_INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``(n, fields)`` ids -> ``(n, fields, dim)`` vectors."""
        out: torch.Tensor = self.table(ids)
        return out


class DeepFM(nn.Module):
    """DeepFM (Guo et al. 2017): first-order + FM pairwise interactions + an MLP, summed.

    The shared table is ``embedding_dim + 1`` wide: column 0 is the field value's first-order
    weight, the rest its embedding. One table means one sparse optimizer and one lookup per batch.
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_fields, n_dense = int(spec["n_fields"]), int(spec["n_dense"])
        dim = int(spec["embedding_dim"])
        self.embedding = HashedEmbedding(int(spec["hash_buckets"]), dim + 1)
        with torch.no_grad():
            self.embedding.table.weight[:, 0].zero_()  # first-order weights start neutral
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        layers: list[nn.Module] = []
        width = n_fields * dim + n_dense
        for h in spec["hidden"]:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            width = int(h)
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        e = self.embedding(ids)
        first, v = e[..., 0], e[..., 1:]
        logit = first.sum(1) + self.bias
        if self.dense_linear is not None:
            logit = logit + self.dense_linear(dense).squeeze(1)
        # FM identity: sum_{i<j} <v_i, v_j> = ((sum v)^2 - sum v^2) / 2, O(fields * dim).
        s = v.sum(1)
        fm = 0.5 * (s * s - (v * v).sum(1)).sum(1)
        deep = self.mlp(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        out: torch.Tensor = logit + fm + deep.float()
        return out


class CrossLayer(nn.Module):
    """One DCN-V2 cross layer: ``x_{l+1} = x0 * (W x_l + b) + x_l`` (full-rank ``W``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x0 * self.linear(x) + x
        return out


class DCNv2(nn.Module):
    """DCN-V2 (Wang et al. 2021), parallel form: a cross network and an MLP over the same input.

    Input ``x0`` = the fields' vectors from the shared :class:`HashedEmbedding` (flattened) and the
    dense inputs. ``spec["cross_layers"]`` explicit cross layers model bounded-degree feature
    interactions; the MLP (``spec["hidden"]``) the rest; one linear layer combines both outputs.
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_fields, n_dense = int(spec["n_fields"]), int(spec["n_dense"])
        dim = int(spec["embedding_dim"])
        self.embedding = HashedEmbedding(int(spec["hash_buckets"]), dim)
        width = n_fields * dim + n_dense
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(int(spec.get("cross_layers", 3))))
        layers: list[nn.Module] = []
        deep = width
        for h in spec["hidden"]:
            layers += [nn.Linear(deep, int(h)), nn.ReLU()]
            deep = int(h)
        self.mlp = nn.Sequential(*layers)
        self.head = nn.Linear(width + deep, 1)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([self.embedding(ids).flatten(1), dense], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        out: torch.Tensor = self.head(torch.cat([x, self.mlp(x0)], dim=1)).squeeze(1).float()
        return out


class LogisticRegression(nn.Module):
    """Hashed logistic regression: one weight per hashed token, a linear term on the dense inputs."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_dense = int(spec["n_dense"])
        self.embedding = HashedEmbedding(int(spec["hash_buckets"]), 1)
        with torch.no_grad():
            self.embedding.table.weight.zero_()
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        logit = self.embedding(ids).squeeze(2).sum(1) + self.bias
        if self.dense_linear is not None:
            logit = logit + self.dense_linear(dense).squeeze(1)
        out: torch.Tensor = logit.float()
        return out


MODELS: dict[str, Callable[[Mapping[str, Any]], nn.Module]] = {
    "dcnv2": DCNv2,
    "deepfm": DeepFM,
    "lr": LogisticRegression,
}


def model_spec(
    kind: str,
    *,
    n_fields: int,
    n_dense: int,
    hash_buckets: int,
    embedding_dim: int = 16,
    hidden: Sequence[int] = (128, 64),
    cross_layers: int = 3,
) -> dict[str, Any]:
    """The JSON-able spec a model is rebuilt from (``cross_layers``: DCN-V2 only)."""
    if kind not in MODELS:
        raise ValueError(f"model_spec: unknown model {kind!r}; known: {sorted(MODELS)}")
    spec: dict[str, Any] = {
        "type": kind,
        "n_fields": n_fields,
        "n_dense": n_dense,
        "hash_buckets": hash_buckets,
        "embedding_dim": embedding_dim,
        "hidden": [int(h) for h in hidden],
    }
    if kind == "dcnv2":
        spec["cross_layers"] = int(cross_layers)
    return spec


def build_model(spec: Mapping[str, Any]) -> nn.Module:
    """Instantiate ``MODELS[spec["type"]]`` (fresh weights from torch's current RNG)."""
    kind = spec.get("type")
    if kind not in MODELS:
        raise ValueError(f"build_model: unknown model {kind!r}; known: {sorted(MODELS)}")
    return MODELS[str(kind)](spec)
