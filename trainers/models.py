"""CTR models over hashed categorical ids and dense inputs.

Every model is an ``nn.Module`` built from a JSON-able spec (``MODELS[spec["type"]](spec)``) whose
``forward(ids, dense)`` returns one logit per row. A sequence model (DIN) reads ``ids`` as the
fields' columns followed by ``spec["sequence_length"]`` columns of the user's clicked items (-1 past
the sequence's end; :mod:`trainers.encoding`). Categorical ids index hashed tables with sparse
gradients (:class:`HashedEmbedding`; the optimizer only touches the rows a batch used): ``wide``, one
first-order weight per hashed value (DeepFM, LR), and ``embedding``, one vector per hashed value
(DeepFM, DCN-V2). The learner picks each table's optimizer by that name.

A multi-task model (ESMM) also has ``task_logits(ids, dense) -> (n, 2)``, the click and the
conversion-after-click logits; its ``forward`` stays the click logit, so every click-only path
(serving, tracing, metrics, the gate) reads it as any other model (:func:`is_multi_task`).

Every model starts as its linear part: first-order weights at 0, the output bias (``output_bias``,
set by the learner to the first block's base rate), and a deep part whose last layer is 0.

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

from trainers.dense_range import DenseRange
from trainers.sharding import ShardedRows, built_for

__all__ = [
    "DIN",
    "ESMM",
    "MODELS",
    "DCNv2",
    "DeepFM",
    "HashedEmbedding",
    "LogisticRegression",
    "build_model",
    "is_multi_task",
    "model_spec",
]

_INIT_STD = 0.01  # small embeddings: the FM term starts near zero instead of dominating the logit
_MEAN_ROWS = 16_384  # rows a field's mean is taken over: the newest traffic, a few ms per block


def _zero_linear(width: int, out: int) -> nn.Linear:
    """A linear layer that starts at exactly 0: the deep part adds to the wide part's logit only as
    it learns, instead of adding an untrained network's noise to every early prediction."""
    layer = nn.Linear(width, out)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(width: int, hidden: Sequence[int], last: Callable[[int, int], nn.Module]) -> nn.Sequential:
    """Linear + ReLU layers of sizes ``hidden``, then ``last(width, 1)`` to one output."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    layers.append(last(width, 1))
    return nn.Sequential(*layers)


def _zero_table(hash_buckets: int, n_fields: int = 0, *, warm_start: bool = False) -> HashedEmbedding:
    """A one-column table of first-order weights, all 0 (an unseen value reads 0, or its field's mean
    with ``warm_start``)."""
    table = HashedEmbedding(hash_buckets, 1, n_fields=n_fields, warm_start=warm_start)
    with torch.no_grad():
        table.table.weight.zero_()
    return table


class HashedEmbedding(nn.Module):
    """A ``(hash_buckets, dim)`` table shared by all categorical fields; sparse gradients.

    Before a block is learned, :meth:`admit` is called with its ids; after, :meth:`refresh` (the
    learner does both). Two ways to treat values training has not seen, both buffers of the model,
    saved with the weights, so a served version treats a value exactly as its trainer did:

    - ``warm_start`` (the spec's ``new_values: "field_mean"``): a value never learned scores as its
      row plus its field's mean row over the last learned block's traffic (:attr:`field_mean`), and
      :meth:`admit` starts its row from there. Why: a value that is on in (nearly) every row of a
      block (the hour of day, a campaign's only creative, the logging policy) carries a share of the
      intercept, the bias and it being indistinguishable within the block; at 0, a new such value
      (the next hour) loses that share, and the rows that have it are scored below the rows that
      still have the old one. Measured on the simulator's hour field: the blocks where a new hour
      starts lost 0.005-0.017 of AUC to FTRL (benchmarks/README.md). A new user or item likewise
      starts as the field's average traffic rather than as nothing.
    - ``min_count > 0``, frequency admission (as Monolith and TorchRec do): a hashed value gets its
      own row only once training has seen it ``min_count`` times; until then it reads its field's
      shared "rare" row (one extra row per field). One click on a value seen once cannot then carve
      out a vector of its own. Off by default; ``warm_start`` is unused with it.
    """

    counts: torch.Tensor  # buffers, present when min_count > 0
    rare: torch.Tensor
    seen: torch.Tensor  # buffers, present with warm_start: rows learned at least once
    field_mean: torch.Tensor  # (n_fields, dim): each field's mean row over the last block learned

    def __init__(
        self, hash_buckets: int, dim: int, *, min_count: int = 0, n_fields: int = 0, warm_start: bool = False
    ) -> None:
        super().__init__()
        self.n_fields = int(n_fields)  # admit/refresh read these first columns (a sequence may follow)
        self.min_count = int(min_count)
        self.warm_start = bool(warm_start) and self.min_count == 0 and n_fields > 0
        extra = n_fields if self.min_count > 0 else 0
        sharding = built_for()  # under torchrun: only this rank's rows, drawn as the whole table is
        self.table: nn.Embedding
        if sharding is not None:
            self.table = ShardedRows.initialised(hash_buckets + extra, dim, _INIT_STD, sharding)
        else:
            self.table = nn.Embedding(hash_buckets + extra, dim, sparse=True)
            nn.init.normal_(self.table.weight, std=_INIT_STD)
        if self.min_count > 0:
            self.register_buffer("counts", torch.zeros(hash_buckets, dtype=torch.int32))
            self.register_buffer("rare", hash_buckets + torch.arange(n_fields, dtype=torch.long))
        if self.warm_start:
            self.register_buffer("seen", torch.zeros(hash_buckets, dtype=torch.bool))
            self.register_buffer("field_mean", torch.zeros(n_fields, dim))

    @torch.no_grad()
    def admit(self, ids: torch.Tensor) -> None:
        """``(n, fields)`` ids of a block about to be learned: count them (``min_count``), and start
        each value never learned from its row plus its field's mean (``warm_start``)."""
        ids = ids[:, : self.n_fields] if self.n_fields else ids
        if self.min_count > 0:
            flat = ids.reshape(-1)
            self.counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        if self.warm_start:
            weight = self.table.weight
            # Field by field: a row two fields share (a hash collision) starts from the first one's
            # mean, deterministically. On a GPU each field's selection reads the device once a block.
            for j in range(ids.shape[1]):
                col = ids[:, j]
                rows = col[~self.seen.index_select(0, col)]
                self.seen.index_fill_(0, rows, True)
                # sharded (trainers.sharding): this rank writes the rows it holds, by their local index
                if isinstance(self.table, ShardedRows):
                    rows = self.table.owned(rows)
                # a value repeated in the block is written the same row each time
                weight.index_put_((rows,), weight.index_select(0, rows) + self.field_mean[j].to(weight.dtype))

    @torch.no_grad()
    def refresh(self, ids: torch.Tensor) -> None:
        """After learning a block: each field's mean row over the newest :data:`_MEAN_ROWS` of its
        ``(n, fields)`` ids (traffic-weighted; the learner passes a block in event-time order)."""
        if self.warm_start and ids.numel():
            self.field_mean.copy_(self.table(ids[-_MEAN_ROWS:, : self.n_fields]).float().mean(0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``(n, fields)`` ids -> ``(n, fields, dim)`` vectors."""
        if self.min_count > 0:
            seen = self.counts.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            ids = torch.where(seen >= self.min_count, ids, self.rare.expand_as(ids))
        out: torch.Tensor = self.table(ids)
        if self.warm_start and not self.training:  # learning admits every id it reads first
            unseen = ~self.seen.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            out = out + unseen.unsqueeze(-1).to(out.dtype) * self.field_mean.to(out.dtype)
        return out

    def field_vectors(self, ids: torch.Tensor, field: int) -> torch.Tensor:
        """``(n, k)`` values of field ``field`` (-1: none) -> ``(n, k, dim)``, read as :meth:`forward`
        reads that field's column, and 0 where there is no value (a behaviour sequence's end)."""
        present = ids >= 0
        ids = ids.clamp(min=0)
        if self.min_count > 0:
            seen = self.counts.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            ids = torch.where(seen >= self.min_count, ids, self.rare[field].expand_as(ids))
        out: torch.Tensor = self.table(ids)
        if self.warm_start and not self.training:
            unseen = ~self.seen.index_select(0, ids.reshape(-1)).reshape(ids.shape)
            out = out + unseen.unsqueeze(-1).to(out.dtype) * self.field_mean[field].to(out.dtype)
        return out * present.unsqueeze(-1).to(out.dtype)


def _dense_range(spec: Mapping[str, Any]) -> DenseRange | None:
    """The dense inputs' clamp (:mod:`trainers.dense_range`) where ``spec`` asks for it; absent from
    specs saved before it existed (those read their inputs as they come)."""
    return DenseRange(int(spec["n_dense"])) if spec.get("dense_range") else None


def _clamped(model: nn.Module, dense: torch.Tensor) -> torch.Tensor:
    r = getattr(model, "dense_range", None)
    return dense if r is None else r(dense)


def _warm(spec: Mapping[str, Any]) -> bool:
    return spec.get("new_values", "fresh") == "field_mean"


def _embedding(spec: Mapping[str, Any]) -> HashedEmbedding:
    """The vectors' table of DeepFM and DCN-V2 as ``spec`` asks for it."""
    return HashedEmbedding(
        int(spec["hash_buckets"]),
        int(spec["embedding_dim"]),
        min_count=int(spec.get("min_count", 0)),
        n_fields=int(spec["n_fields"]),
        warm_start=_warm(spec),
    )


class _WithLinearPart(nn.Module):
    """What DeepFM and LR share: ``wide`` (first-order table), ``dense_linear`` and ``bias``, which
    subclasses create (in their own order: the seeded initial weights depend on it)."""

    wide: HashedEmbedding
    dense_linear: nn.Linear | None
    bias: nn.Parameter

    @property
    def output_bias(self) -> torch.Tensor:
        return self.bias

    def linear_parameters(self) -> list[nn.Parameter]:
        """The wide part's dense weights: the dense inputs' linear layer and the output bias."""
        extra = list(self.dense_linear.parameters()) if self.dense_linear is not None else []
        return [*extra, self.bias]

    def linear_logit(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        logit: torch.Tensor = self.wide(ids).squeeze(2).sum(1) + self.bias
        if self.dense_linear is not None:
            logit = logit + self.dense_linear(dense).squeeze(1)
        return logit


class DeepFM(_WithLinearPart):
    """DeepFM (Guo et al. 2017): first-order (wide) + FM pairwise interactions + an MLP, summed.

    Two hashed tables: ``wide`` holds each field value's first-order weight (one column, starting
    at 0) and ``embedding`` its vector. They are separate so that each gets the optimizer its role
    needs (the learner gives ``wide`` per-coordinate AdaGrad, FTRL's rates, and the vectors Adam;
    Wide & Deep does the same, with FTRL on the wide part).
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_fields, n_dense = int(spec["n_fields"]), int(spec["n_dense"])
        dim = int(spec["embedding_dim"])
        self.wide = _zero_table(int(spec["hash_buckets"]), n_fields, warm_start=_warm(spec))
        self.embedding = _embedding(spec)
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.mlp = _mlp(n_fields * dim + n_dense, spec["hidden"], _zero_linear)
        self.dense_range = _dense_range(spec)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self._logit(ids, _clamped(self, dense), self.embedding(ids))[0]

    def _logit(
        self, ids: torch.Tensor, dense: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The logit from the fields' vectors ``v``, and the MLP's input (``v`` flat + dense).

        The ops' order is kept as it always was: autograd sums ``v``'s gradients in reverse
        creation order, and another order changes the weights in their last bits."""
        logit = self.linear_logit(ids, dense)
        # FM identity: sum_{i<j} <v_i, v_j> = ((sum v)^2 - sum v^2) / 2, O(fields * dim).
        s = v.sum(1)
        fm = 0.5 * (s * s - (v * v).sum(1)).sum(1)
        x = torch.cat([v.flatten(1), dense], dim=1)
        deep = self.mlp(x).squeeze(1)
        out: torch.Tensor = logit + fm + deep.float()
        return out, x

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Versions saved before the wide table was split off kept it as column 0 of ``embedding``.
        old = state_dict.get(prefix + "embedding.table.weight")
        if prefix + "wide.table.weight" not in state_dict and old is not None:
            state_dict[prefix + "wide.table.weight"] = old[:, :1]
            state_dict[prefix + "embedding.table.weight"] = old[:, 1:]
        super()._load_from_state_dict(state_dict, prefix, *args)


class ESMM(DeepFM):
    """ESMM (Ma et al. 2018): a click tower and a conversion-after-click tower over one embedding.

    The click (CTR) tower is :class:`DeepFM`, built first, so that for a seed it starts with
    DeepFM's exact weights; ``forward`` is its logit. The conversion (CVR) tower reads the same
    fields' vectors: its own first-order table ``cvr_wide`` (an item's or a campaign's conversion
    rate is memorised there, as clicks are in ``wide``), its own bias ``cvr_bias`` and its own MLP
    (``spec["hidden"]``, last layer at 0). It is trained through pCTCVR = pCTR x pCVR on every
    impression whose conversion is known (:mod:`trainers.multitask`): the whole impression space,
    not only the clicked impressions pCVR is served for (the paper's sample-selection-bias fix).
    ``cvr_bias`` starts at 0 and is set by the learner to the first known conversions-per-click
    rate (``cvr_started`` records that it was, saved with the weights).
    """

    cvr_started: torch.Tensor

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)
        n_fields, n_dense = int(spec["n_fields"]), int(spec["n_dense"])
        dim = int(spec["embedding_dim"])
        self.cvr_wide = _zero_table(int(spec["hash_buckets"]), n_fields, warm_start=_warm(spec))
        self.cvr_bias = nn.Parameter(torch.zeros(1))
        self.cvr_mlp = _mlp(n_fields * dim + n_dense, spec["hidden"], _zero_linear)
        self.register_buffer("cvr_started", torch.zeros((), dtype=torch.bool))

    @property
    def cvr_output_bias(self) -> torch.Tensor:
        return self.cvr_bias

    def linear_parameters(self) -> list[nn.Parameter]:
        """DeepFM's linear part and the conversion tower's bias (per-coordinate rates, as the click bias)."""
        return [*super().linear_parameters(), self.cvr_bias]

    def task_logits(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """``(n, 2)``: the click logit (``forward``'s, bit for bit) and the conversion-after-click logit."""
        ctr, x = self._logit(ids, _clamped(self, dense), self.embedding(ids))
        cvr = self.cvr_wide(ids).squeeze(2).sum(1) + self.cvr_bias + self.cvr_mlp(x).squeeze(1).float()
        return torch.stack([ctr, cvr.float()], dim=1)


class DIN(_WithLinearPart):
    """DIN (Zhou et al. 2018) on the shared hashed embedding, with DeepFM's wide and FM parts.

    The candidate item's vector attends over the vectors of the user's last clicked items (the
    ``item_id`` rows of the same table): an MLP over ``[q, k, q*k, q-k]`` scores each behaviour,
    the scores weight the behaviours' vectors (unnormalised, as in the paper, so the interest's size
    says how much the user did; entries past the sequence's end are masked to 0) and their sum is
    the user's interest in this candidate. The interest joins the fields' vectors: in the FM term
    (its dot product with the candidate is the "is like what the user clicked" signal) and in the
    MLP. Like DeepFM it starts as its linear part (the MLP's last layer at 0); an empty sequence
    gives a zero interest, i.e. DeepFM.
    """

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_fields, n_dense = int(spec["n_fields"]), int(spec["n_dense"])
        dim = int(spec["embedding_dim"])
        self.n_fields, self.item_field = n_fields, int(spec.get("item_field", 1))
        self.wide = _zero_table(int(spec["hash_buckets"]), n_fields, warm_start=_warm(spec))
        self.embedding = _embedding(spec)
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.attention = _mlp(4 * dim, spec.get("attention_hidden", [32]), nn.Linear)
        self.mlp = _mlp((n_fields + 1) * dim + n_dense, spec["hidden"], _zero_linear)
        self.dense_range = _dense_range(spec)

    def interest(self, ids: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``(n, dim)``: the behaviours' vectors weighted by their attention to the candidate."""
        seq = ids[:, self.n_fields :]
        k = self.embedding.field_vectors(seq, self.item_field)  # (n, L, dim), 0 past the end
        q = v[:, self.item_field]  # (n, dim)
        scores = self.attention[1:](self._first_attention_layer(q, k)).squeeze(2)
        weights = scores * (seq >= 0).to(scores.dtype)
        out: torch.Tensor = (weights.unsqueeze(2) * k).sum(1)
        return out

    def _first_attention_layer(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``(n, L, hidden)``: the attention MLP's first layer over ``[q, k, q*k, q-k]``, without
        building that ``(n, L, 4 dim)`` input. Split by blocks, ``W [q, k, q*k, q-k] = (Wq + Wd) q +
        (Wk - Wd + diag(q) Wp) k``: the candidate's part once per row, then one batched product
        per row over its behaviours (a quarter of the multiply-adds; the same layer and weights)."""
        first = self.attention[0]
        assert isinstance(first, nn.Linear)
        w_q, w_k, w_p, w_d = first.weight.split(k.shape[2], dim=1)  # each (hidden, dim)
        per_row = torch.addmm(first.bias, q, (w_q + w_d).t())  # (n, hidden)
        per_pair = (w_k - w_d).t().unsqueeze(0) + q.unsqueeze(2) * w_p.t().unsqueeze(0)  # (n, dim, hidden)
        out: torch.Tensor = torch.bmm(k, per_pair.to(k.dtype)) + per_row.unsqueeze(1)
        return out

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        fields, dense = ids[:, : self.n_fields], _clamped(self, dense)
        v = self.embedding(fields)
        logit = self.linear_logit(fields, dense)
        vs = torch.cat([v, self.interest(ids, v).unsqueeze(1)], dim=1)
        s = vs.sum(1)
        fm = 0.5 * (s * s - (vs * vs).sum(1)).sum(1)
        deep = self.mlp(torch.cat([vs.flatten(1), dense], dim=1)).squeeze(1)
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
        self.embedding = _embedding(spec)
        width = n_fields * dim + n_dense
        self.cross = nn.ModuleList(CrossLayer(width) for _ in range(int(spec.get("cross_layers", 3))))
        layers: list[nn.Module] = []
        deep = width
        for h in spec["hidden"]:
            layers += [nn.Linear(deep, int(h)), nn.ReLU()]
            deep = int(h)
        self.mlp = nn.Sequential(*layers)
        self.head = nn.Linear(width + deep, 1)
        self.dense_range = _dense_range(spec)

    @property
    def output_bias(self) -> torch.Tensor:
        return self.head.bias

    def linear_parameters(self) -> list[nn.Parameter]:
        return [self.head.bias]

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([self.embedding(ids).flatten(1), _clamped(self, dense)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        out: torch.Tensor = self.head(torch.cat([x, self.mlp(x0)], dim=1)).squeeze(1).float()
        return out


class LogisticRegression(_WithLinearPart):
    """Hashed logistic regression: one weight per hashed token, a linear term on the dense inputs."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.spec = dict(spec)
        n_dense = int(spec["n_dense"])
        self.wide = _zero_table(int(spec["hash_buckets"]), int(spec["n_fields"]), warm_start=_warm(spec))
        self.dense_linear = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.dense_range = _dense_range(spec)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        old = state_dict.pop(prefix + "embedding.table.weight", None)  # its name before "wide"
        if old is not None:
            state_dict.setdefault(prefix + "wide.table.weight", old)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear_logit(ids, _clamped(self, dense)).float()
        return out


MODELS: dict[str, Callable[[Mapping[str, Any]], nn.Module]] = {
    "dcnv2": DCNv2,
    "deepfm": DeepFM,
    "din": DIN,
    "esmm": ESMM,  # multi-task: clicks and conversions (needs joiner.conversion_window_s > 0)
    "lr": LogisticRegression,
}


def is_multi_task(kind: str) -> bool:
    """Does model ``kind`` learn conversions too (a ``task_logits`` method)?

    >>> is_multi_task("esmm"), is_multi_task("deepfm")
    (True, False)
    """
    return callable(getattr(MODELS.get(kind), "task_logits", None))


def model_spec(
    kind: str,
    *,
    n_fields: int,
    n_dense: int,
    hash_buckets: int,
    embedding_dim: int = 16,
    hidden: Sequence[int] = (128, 64),
    cross_layers: int = 3,
    min_count: int = 0,
    new_values: str = "fresh",
    sequence_length: int = 0,
    dense_range: bool = False,
) -> dict[str, Any]:
    """The JSON-able spec a model is rebuilt from (``cross_layers``: DCN-V2 only; ``min_count``:
    frequency admission of the embedding vectors, 0 = off; ``new_values``: how values training never
    saw are scored, ``"field_mean"`` or ``"fresh"``; both: see :class:`HashedEmbedding`;
    ``sequence_length``: DIN only, the behaviour-sequence columns after the fields, at least 1)."""
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
    if min_count > 0 and kind != "lr":
        spec["min_count"] = int(min_count)
    elif new_values != "fresh":  # absent from specs saved before it existed: those are "fresh"
        spec["new_values"] = new_values
    if dense_range:  # absent from specs saved before it existed: those do not clamp
        spec["dense_range"] = True
    if kind == "dcnv2":
        spec["cross_layers"] = int(cross_layers)
    if kind == "din":
        if sequence_length < 1:
            raise ValueError("model_spec: din needs sequence_length >= 1 (the behaviour-sequence columns)")
        spec |= {"sequence_length": int(sequence_length), "item_field": 1, "attention_hidden": [32]}
    return spec


def build_model(spec: Mapping[str, Any]) -> nn.Module:
    """Instantiate ``MODELS[spec["type"]]`` (fresh weights from torch's current RNG)."""
    kind = spec.get("type")
    if kind not in MODELS:
        raise ValueError(f"build_model: unknown model {kind!r}; known: {sorted(MODELS)}")
    return MODELS[str(kind)](spec)
