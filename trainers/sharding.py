"""Hashed tables sharded by rows across the ranks of a ``torch.distributed`` group (data parallel).

Under ``torchrun`` (or any launcher that sets up the default process group: gloo on the CPU, NCCL on
GPUs), a :class:`~trainers.learner.TorchLearner` shards every hashed table of its model: rank ``r``
of ``W`` holds the rows ``g`` with ``g % W == r``, at local row ``g // W`` (row-wise sharding, as
TorchRec's ``ROW_WISE`` plan does), so a table of ``R`` rows costs ``R / W`` rows of memory per
rank, weights and optimizer state alike. Everything else (MLP, cross layers, the linear part's
dense weights and bias) is replicated.

Every rank runs the same program on the same block (SPMD: each replays or reads the same examples,
in the same seeded order) and, in :meth:`TorchLearner.learn`, takes its own contiguous part of
each optimizer step's batch. So a step of ``W`` ranks is the step one process makes on the whole
batch:

- a lookup (:class:`ShardedRows`) sends each distinct id to the rank that owns its row and gets the
  row back (``all_to_all``); the backward pass sums each distinct id's gradients and sends the sum
  to its owner the same way, whose row-wise optimizer (:mod:`trainers.rowwise`) adds up the ranks'
  sums: the single process's update, but for the order of the additions;
- the replicated weights' gradients are summed over ranks (:func:`sum_replicated_grads`, one
  ``all_reduce`` of one flat buffer): the loss is a per-example sum, so the sum is the whole batch's
  gradient. Only the order of additions differs from one process (float rounding: scores agree to
  ~1e-8 after a few blocks, tests/test_sharding.py).

Written on torch's collectives rather than ``DistributedDataParallel`` or TorchRec: DDP replicates
every parameter (the point here is not to) and would need its private ignore-list API to leave the
shards alone, and broadcasts buffers that differ per rank; TorchRec's sharded tables need its
``fbgemm_gpu`` kernels built for the installed torch, which PyPI does not carry for torch 2.15
here. The replicated part is small (an MLP over a few hundred inputs), so DDP's bucketed overlap of
communication with the backward pass would buy little.

:func:`full_state_dict` gathers the shards into the unsharded layout on rank 0, which saves: a saved
model is an ordinary one, which a single process (a serving replica) loads as it is. A new model's
tables are initialised shard by shard (:meth:`ShardedRows.initialised`, the same values one process
draws), so no rank ever holds a whole table but rank 0 while it saves, and a rank loading a saved
model while it cuts its rows out.

>>> owner_and_row(torch.tensor([0, 5, 6, 7]), world=2)
(tensor([0, 1, 0, 1]), tensor([0, 2, 3, 3]))
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "RowSharding",
    "ShardedRows",
    "building",
    "built_for",
    "full_state_dict",
    "join_launched_group",
    "leave_group",
    "map_optimizer_state",
    "owner_and_row",
    "shard_tables",
    "sum_replicated_grads",
]


_INIT_CHUNK = 1 << 16  # rows drawn at a time when a sharded table is initialised


def owner_and_row(ids: Tensor, world: int) -> tuple[Tensor, Tensor]:
    """The rank that holds each global row id and the row's index there."""
    return ids % world, ids // world


@dataclass(frozen=True)
class RowSharding:
    """The process group the tables are sharded over, with this process's rank in it."""

    group: Any  # torch.distributed.ProcessGroup (or None: the default group)
    world: int
    rank: int

    @classmethod
    def of_default_group(cls) -> RowSharding | None:
        """The default group's sharding when ``torch.distributed`` is set up with several ranks."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return cls(None, dist.get_world_size(), dist.get_rank())

    def part(self, idx: Tensor) -> Tensor:
        """This rank's contiguous part of one step's rows (``ceil(n / world)`` rows; the last
        ranks get fewer, possibly none, and still take part in every collective)."""
        k = -(-idx.numel() // self.world)
        return idx[self.rank * k : (self.rank + 1) * k]

    def all_reduce_(self, t: Tensor) -> Tensor:
        """Sum ``t`` over ranks, in place."""
        dist.all_reduce(t, group=self.group)
        return t

    def all_to_all(self, values: Tensor, send: list[int], recv: list[int]) -> Tensor:
        """Send ``values[send-split k]`` to rank ``k``; returns what the ranks sent here, in rank order."""
        out = values.new_empty((sum(recv), *values.shape[1:]))
        dist.all_to_all_single(out, values.contiguous(), recv, send, group=self.group)
        return out

    def counts(self, send: Tensor) -> list[int]:
        """Each rank's count of ids for this one, given this one's ``send`` counts per rank."""
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.tolist()


def join_launched_group(device: str, timeout: timedelta | None = None) -> RowSharding | None:
    """Under a launcher that started several ranks (``torchrun``: ``WORLD_SIZE`` > 1), join their
    default process group (gloo for CPU tensors, NCCL for CUDA ones, each rank on GPU
    ``LOCAL_RANK``) and return the sharding learners will use; None in a single process.
    ``timeout``: how long a collective may wait for the other ranks (torch's default: 30 min for
    gloo; a daemon waiting for its next block passes more)."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    if not dist.is_initialized():
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=timeout)
    return RowSharding.of_default_group()


def leave_group() -> None:
    """Tear the process group down before the interpreter exits: left to exit, gloo's threads can
    die with ``terminate called without an active exception`` (status 134) after a clean stop."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_BUILDING: ContextVar[RowSharding | None] = ContextVar("sharded_build", default=None)


@contextmanager
def building(sharding: RowSharding | None) -> Iterator[None]:
    """Models built inside get this rank's rows of their hashed tables (see :func:`built_for`)."""
    token = _BUILDING.set(sharding)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def built_for() -> RowSharding | None:
    """The sharding a model is being built for (:func:`building`), or None: whole tables."""
    return _BUILDING.get()


class _Lookup(torch.autograd.Function):
    """Rows of a sharded table for global ids. Each distinct id is sent once (``all_to_all``) to
    the rank that holds it, which sends its row back; in the backward pass the gradients of a
    distinct id's lookups are summed here (in lookup order) and sent to the owner as one sparse
    gradient row. Sending distinct ids only is what TorchRec's input dedup does: on heavy-tailed
    ids a batch repeats most of its values."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, ids: Tensor, sharding: RowSharding) -> Tensor:
        distinct, inverse = torch.unique(ids, return_inverse=True)
        owner, local = owner_and_row(distinct, sharding.world)
        order = torch.argsort(owner, stable=True)  # by owner, ascending ids within each
        send_t = torch.bincount(owner, minlength=sharding.world)
        send = send_t.tolist()
        recv = sharding.counts(send_t)
        asked = sharding.all_to_all(local.index_select(0, order), send, recv)
        rows = sharding.all_to_all(weight.detach().index_select(0, asked), recv, send)
        mine = torch.empty_like(rows).index_copy_(0, order, rows)  # the distinct ids' rows
        ctx.sharding, ctx.send, ctx.recv, ctx.shape = sharding, send, recv, weight.shape
        ctx.save_for_backward(order, asked, inverse)
        return mine.index_select(0, inverse)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        order, asked, inverse = ctx.saved_tensors
        summed = grad.new_zeros((order.numel(), grad.shape[1])).index_add_(0, inverse, grad)
        g = ctx.sharding.all_to_all(summed.index_select(0, order), ctx.send, ctx.recv)
        # One (row, gradient) per rank that looked the row up: the sparse form nn.Embedding leaves.
        sparse = torch.sparse_coo_tensor(asked.unsqueeze(0), g, ctx.shape, check_invariants=False)
        return sparse, None, None


class ShardedRows(nn.Embedding):
    """This rank's rows of a hashed table (global row ``g`` at local ``g // world`` on rank
    ``g % world``); its forward takes global ids and returns their rows from whichever rank holds
    them. Every rank must call it at the same points (it is a collective)."""

    def __init__(self, rows: Tensor, sharding: RowSharding, global_rows: int) -> None:
        """``rows``: this rank's rows of a ``global_rows``-row table (:meth:`of`, :meth:`initialised`)."""
        super().__init__(rows.shape[0], rows.shape[1], sparse=True, _weight=rows)
        self.sharding = sharding
        self.global_rows = global_rows

    @classmethod
    def of(cls, full: nn.Embedding, sharding: RowSharding) -> ShardedRows:
        """This rank's rows of a whole table."""
        rows = full.weight.detach()[sharding.rank :: sharding.world].clone()
        return cls(rows, sharding, full.num_embeddings)

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1)
        out: Tensor = _Lookup.apply(self.weight, flat, self.sharding)
        return out.reshape(*ids.shape, self.embedding_dim)

    def owned(self, ids: Tensor) -> Tensor:
        """The local rows of those of ``ids`` (global) that this rank holds, in their order."""
        owner, local = owner_and_row(ids, self.sharding.world)
        return local[owner == self.sharding.rank]

    @classmethod
    def initialised(cls, rows: int, dim: int, std: float, sharding: RowSharding) -> ShardedRows:
        """This rank's rows of ``nn.Embedding(rows, dim)`` re-initialised ``normal_(std=std)``,
        without the whole table: the same draws from torch's generator, made :data:`_INIT_CHUNK`
        rows at a time (CPU ``normal_`` fills in runs of 16 values, so chunks of a multiple of 16
        values draw exactly what one call would), keeping every ``world``-th row. The generator
        ends where building the whole table leaves it: the rest of the model initialises alike."""
        local = torch.empty((len(range(sharding.rank, rows, sharding.world)), dim))
        chunk = torch.empty((_INIT_CHUNK, dim))
        for scale in (1.0, std):  # nn.Embedding's own initialisation, then the table's
            for start in range(0, rows, _INIT_CHUNK):
                part = chunk[: min(_INIT_CHUNK, rows - start)]
                nn.init.normal_(part, std=scale)
                mine = part[(sharding.rank - start) % sharding.world :: sharding.world]  # rows g % W == r
                at = (start + (sharding.rank - start) % sharding.world) // sharding.world
                local[at : at + len(mine)] = mine
        return cls(local, sharding, rows)

    def gather(self, rows: Tensor) -> Tensor | None:
        """``rows`` laid out as this rank's shard (its weight, or an optimizer's state of it), whole
        and in global order on rank 0 (``gather``), None on the others."""
        s = self.sharding
        per = -(-self.global_rows // s.world)
        mine = rows.new_zeros((per, *rows.shape[1:]))
        mine[: rows.shape[0]] = rows
        parts = [torch.empty_like(mine) for _ in range(s.world)] if s.rank == 0 else None
        dist.gather(mine, parts, dst=0, group=s.group)
        if parts is None:
            return None
        full = torch.stack(parts, 1).reshape(per * s.world, *rows.shape[1:])
        return full[: self.global_rows]

    def local(self, rows: Tensor) -> Tensor:
        """This rank's shard of ``rows`` laid out as the whole table (a saved weight or state)."""
        return rows[self.sharding.rank :: self.sharding.world].clone()


def shard_tables(model: nn.Module, sharding: RowSharding) -> nn.Module:
    """Replace, in place, every hashed table's rows (``HashedEmbedding.table``) by this rank's
    :class:`ShardedRows` of them; returns ``model``."""
    from trainers.models import HashedEmbedding  # trainers.models imports this module

    for m in model.modules():
        if isinstance(m, HashedEmbedding) and not isinstance(m.table, ShardedRows):
            m.table = ShardedRows.of(m.table, sharding)
    return model


def sharded_tables(model: nn.Module) -> Iterator[tuple[str, ShardedRows]]:
    """``(state-dict key of the weight, table)`` for each sharded table of ``model``."""
    for name, m in model.named_modules():
        if isinstance(m, ShardedRows):
            yield f"{name}.weight", m


def full_state_dict(model: nn.Module) -> dict[str, Tensor | None]:
    """``model.state_dict()`` with each sharded table gathered whole on rank 0 (None elsewhere): an
    unsharded model's state there."""
    state: dict[str, Tensor | None] = dict(model.state_dict())
    for key, table in sharded_tables(model):
        state[key] = table.gather(table.weight.detach())
    return state


def map_optimizer_state(
    opt: torch.optim.Optimizer, state: dict[str, Any], model: nn.Module, *, gather: bool
) -> dict[str, Any]:
    """``opt``'s state dict with the per-row state of sharded tables (row-wise AdaGrad's sums,
    Adam's moments) gathered whole on rank 0 (``gather=True``, for saving; None elsewhere) or cut
    to this rank's shard (for loading a saved whole one). Collective when gathering."""
    tables = {id(t.weight): t for _, t in sharded_tables(model)}
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {**state, "state": dict(state["state"])}
    for i, p in enumerate(params):
        table = tables.get(id(p))
        if table is None or i not in out["state"]:
            continue
        rows = table.num_embeddings if gather else table.global_rows
        move = table.gather if gather else table.local
        out["state"][i] = {
            k: move(v) if isinstance(v, Tensor) and v.dim() and v.shape[0] == rows else v
            for k, v in out["state"][i].items()
        }
    return out


def sum_replicated_grads(model: nn.Module, sharding: RowSharding) -> None:
    """Sum the gradients of every replicated (not sharded) parameter over the ranks: one flat
    ``all_reduce``. A parameter without a gradient on this rank counts as 0 there."""
    shards = {id(t.weight) for _, t in sharded_tables(model)}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in shards]
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = sharding.all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
    for p, chunk in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad = chunk.view_as(p).clone()
