"""A row-wise (lazy) Adam for the hashed embedding table: O(batch) per step, no host sync.

:class:`RowwiseAdam` does the same arithmetic as ``torch.optim.SparseAdam`` (moments and weights
change only on the rows a batch used; bias correction counts optimizer steps) and keeps the same
state layout (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter), so a state dict saved by one
loads into the other. What differs is how repeated ids are merged. SparseAdam calls
``grad.coalesce()``, whose output size depends on the data: on CPU the profile of a 4,096-row DeepFM
step showed it (a sort plus sparse additions) as the largest cost, and on CUDA it makes the host
wait for the device every step. Here :func:`merge_rows` sorts the ``n`` looked-up ids once and sums
their gradients into ``n`` fixed slots; slots past the last distinct id repeat the last distinct
row, so every tensor has a size known in advance and the duplicate writes carry identical values.

>>> table = torch.nn.Embedding(10, 2, sparse=True)
>>> opt = RowwiseAdam([table.weight], lr=0.1)
>>> before = table.weight.detach().clone()
>>> table(torch.tensor([[3, 3, 5]])).sum().backward()
>>> opt.step()
>>> changed = (table.weight != before).any(1).nonzero().flatten().tolist()
>>> changed
[3, 5]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["LinearAdagrad", "LinearFtrl", "RowwiseAdagrad", "RowwiseAdam", "RowwiseFtrl", "merge_rows"]


def merge_rows(ids: Tensor, grads: Tensor, *, compact: bool = False) -> tuple[Tensor, Tensor]:
    """Sum ``grads`` (``(n, dim)``) of repeated ``ids`` (``(n,)``) into ``n`` fixed-size slots.

    Returns ``(rows, summed)``, both with ``n`` entries: slot ``k < d`` (``d`` distinct ids, in
    ascending order) holds a distinct id and the sum of its gradients; slots ``k >= d`` repeat
    slot ``d - 1`` exactly. No output size depends on the data, so nothing waits for the device.
    ``compact=True`` returns the ``d`` distinct slots only: it reads ``d`` back, which costs
    nothing on the CPU and saves the gathers and writes of repeated slots.
    The sort is stable: on CPU the sums are added in lookup order, and a seed gives the same result.

    >>> rows, summed = merge_rows(torch.tensor([5, 2, 5]), torch.tensor([[1.0], [2.0], [3.0]]))
    >>> rows.tolist(), summed.flatten().tolist()
    ([2, 5, 5], [2.0, 4.0, 4.0])
    """
    n = ids.numel()
    sorted_ids, order = torch.sort(ids, stable=True)
    starts = torch.ones(n, dtype=torch.bool, device=ids.device)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    slot = torch.cumsum(starts, 0) - 1  # the slot of each sorted lookup
    summed = torch.zeros_like(grads).index_add_(0, slot, grads.index_select(0, order))
    rows = torch.empty_like(ids).scatter_(0, slot, sorted_ids)
    if compact:
        distinct = int(slot[-1]) + 1
        return rows[:distinct], summed[:distinct]
    # Slots past the last distinct id were never written: point them at the last real slot.
    # (index_select, not ``t[index]``: on CPU advanced indexing was 3x slower for these gathers.)
    fill = torch.minimum(torch.arange(n, device=ids.device), slot[-1])
    return rows.index_select(0, fill), summed.index_select(0, fill)


class _PerParameter(torch.optim.Optimizer):
    """The step every optimizer here shares: :meth:`_update` once per parameter with a gradient."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad, group, self.state[p])
        return loss

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        raise NotImplementedError


class _Rowwise(_PerParameter):
    """What the row-wise optimizers share: :attr:`compact` (see :func:`merge_rows`), kept by pickling,
    and :meth:`_update_rows` on the distinct rows a sparse gradient names."""

    compact: bool | None = None  # None: compact when the parameter is on the CPU

    # Optimizer pickles (and deep-copies: TorchLearner.clone) only defaults, state and groups.
    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "compact": self.compact}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        compact = state.pop("compact", None)
        super().__setstate__(state)
        self.compact = compact

    def _rows(self, p: Tensor) -> tuple[Tensor, Tensor] | None:
        """The distinct rows of ``p``'s sparse gradient and their summed gradients; None if none."""
        grad = p.grad
        if grad is None:
            return None
        if not grad.is_sparse:
            raise RuntimeError(f"{type(self).__name__}: expects sparse gradients (nn.Embedding(sparse=True))")
        # The embedding backward leaves one (id, gradient row) per lookup: not coalesced.
        ids = grad._indices()[0]
        if ids.numel() == 0:
            return None
        compact = p.device.type == "cpu" if self.compact is None else self.compact
        return merge_rows(ids, grad._values().reshape(ids.numel(), -1), compact=compact)

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        merged = self._rows(p)
        if merged is not None:
            self._update_rows(p, *merged, group, state)

    def _update_rows(
        self, p: Tensor, rows: Tensor, g: Tensor, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        raise NotImplementedError


class RowwiseAdam(_Rowwise):
    """Lazy Adam on sparse-gradient parameters (``nn.Embedding(sparse=True)`` tables), row by row.

    A drop-in for ``torch.optim.SparseAdam`` (same defaults, same update, same state layout).
    :attr:`compact` (default: parameters on the CPU) updates only the distinct rows of a batch,
    at the price of reading their count back; off, every tensor has a fixed size (no host sync).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if lr <= 0.0 or eps <= 0.0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"RowwiseAdam: invalid lr={lr}, betas={betas} or eps={eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        self.compact = None

    def _update_rows(
        self, p: Tensor, rows: Tensor, g: Tensor, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        beta1, beta2 = group["betas"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = state["step"]
        m = state["exp_avg"].index_select(0, rows).lerp_(g, 1.0 - beta1)
        v = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)
        step_size = group["lr"] * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
        new = p.index_select(0, rows).addcdiv_(m, v.sqrt_().add_(group["eps"]), value=-step_size)
        p.index_copy_(0, rows, new)


class RowwiseAdagrad(_Rowwise):
    """Per-coordinate AdaGrad on sparse-gradient tables, in FTRL's rate form, row by row.

    Each coordinate keeps ``n``, the sum of its squared gradients, and moves by
    ``-lr * g / (beta + sqrt(n))`` (``n`` counting this step's ``g``): the per-coordinate rate of
    FTRL-Proximal (McMahan et al. 2013) and of the wide part of Wide & Deep. A row seen once moves by
    at most ``lr * |g| / (beta + |g|)``, a frequent row's rate decays as ``1 / sqrt(n)``: rare hashed
    ids cannot overfit one click and popular ones settle, which is what per-coordinate rates buy on
    sparse CTR data (He et al. 2014). Gradients should be per-example sums (the learner scales the
    batch's mean loss by the batch size), as in FTRL. Only the rows a batch used are touched
    (:func:`merge_rows`), so a step costs O(batch) whatever the table's size.

    >>> table = torch.nn.Embedding(4, 1, sparse=True)
    >>> torch.nn.init.zeros_(table.weight)
    Parameter containing:
    tensor([[0.],
            [0.],
            [0.],
            [0.]], requires_grad=True)
    >>> opt = RowwiseAdagrad([table.weight], lr=0.1, beta=1.0)
    >>> table(torch.tensor([1])).sum().backward()  # g = 1: n = 1, step = 0.1 * 1 / (1 + 1)
    >>> opt.step()
    >>> [round(x, 4) for x in table.weight.detach()[:2, 0].tolist()]
    [0.0, -0.05]
    """

    def __init__(
        self, params: Iterable[Tensor], lr: float = 0.05, beta: float = 1.0, decay: float = 1.0
    ) -> None:
        if lr <= 0.0 or beta <= 0.0 or not 0.0 < decay <= 1.0:
            raise ValueError(f"RowwiseAdagrad: need lr, beta > 0 and 0 < decay <= 1: {lr}, {beta}, {decay}")
        super().__init__(params, {"lr": lr, "beta": beta, "decay": decay})
        self.compact = None

    def _update_rows(
        self, p: Tensor, rows: Tensor, g: Tensor, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        if not state:
            state["sum_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        # decay < 1: a row's sum forgets (once per step that touches it), so the rate of a
        # frequent row settles instead of going to 0 on an always-on stream
        n = state["sum_sq"].index_select(0, rows).mul_(group.get("decay", 1.0)).addcmul_(g, g)
        state["sum_sq"].index_copy_(0, rows, n)
        new = p.index_select(0, rows).addcdiv_(g, n.sqrt_().add_(group["beta"]), value=-group["lr"])
        p.index_copy_(0, rows, new)


class LinearAdagrad(_PerParameter):
    """:class:`RowwiseAdagrad`'s rates for dense parameters: the wide part's dense-input weights and
    the output bias, so every coordinate of the linear part learns at FTRL's per-coordinate rates.

    ``p -= lr * g / (beta + sqrt(n))`` with ``n`` the sum of ``g**2``. Written here rather than
    ``torch.optim.Adagrad`` because that one's step reads its step counter back to the host
    (``.item()``), a device sync per step on a GPU, and has no ``beta`` smoothing.

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> opt = LinearAdagrad([w], lr=0.1, beta=1.0)
    >>> w.grad = torch.tensor([1.0, -3.0])
    >>> opt.step()
    >>> [round(x, 4) for x in w.detach().tolist()]
    [-0.05, 0.075]
    """

    def __init__(
        self, params: Iterable[Tensor], lr: float = 0.05, beta: float = 1.0, decay: float = 1.0
    ) -> None:
        if lr <= 0.0 or beta <= 0.0 or not 0.0 < decay <= 1.0:
            raise ValueError(f"LinearAdagrad: need lr, beta > 0 and 0 < decay <= 1: {lr}, {beta}, {decay}")
        super().__init__(params, {"lr": lr, "beta": beta, "decay": decay})

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        if not state:
            state["sum_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        n = state["sum_sq"].mul_(group.get("decay", 1.0)).addcmul_(grad, grad)
        p.addcdiv_(grad, n.sqrt().add_(group["beta"]), value=-group["lr"])


def _ftrl_weights(z: Tensor, n: Tensor, group: dict[str, Any]) -> Tensor:
    """FTRL-Proximal's closed-form weight: 0 while ``|z| <= l1``, else the proximal step."""
    alpha, beta, l1, l2 = group["lr"], group["beta"], group["l1"], group["l2"]
    shrunk = z - z.sign() * l1
    w = -shrunk / ((n.sqrt() + beta) / alpha + l2)
    return torch.where(z.abs() <= l1, torch.zeros_like(w), w)


def _ftrl_start(p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
    """``n = 0`` and the ``z`` whose closed-form weight is ``p`` (0 for a fresh table; the base
    rate for a bias set before the first step): ``z = -w (beta / lr + l2) - sign(w) l1``."""
    w = p.detach()
    z = -w * (group["beta"] / group["lr"] + group["l2"]) - w.sign() * group["l1"]
    return {"n": torch.zeros_like(p, memory_format=torch.preserve_format), "z": z.clone()}


class RowwiseFtrl(_Rowwise):
    """FTRL-Proximal (McMahan et al. 2013) on sparse-gradient tables: online logistic regression's
    optimizer for the model's first-order weights, with its L1 (a value keeps weight 0 until its
    gradients add up to more than ``l1``: rare values stay neutral) and L2.

    Per coordinate: ``sigma = (sqrt(n + g^2) - sqrt(n)) / lr``, ``z += g - sigma * w``,
    ``n += g^2``, then ``w`` from the closed form. Only the rows a batch used are touched.

    >>> table = torch.nn.Embedding(3, 1, sparse=True)
    >>> _ = torch.nn.init.zeros_(table.weight)
    >>> opt = RowwiseFtrl([table.weight], lr=0.1, beta=1.0, l1=1.0, l2=1.0)
    >>> (table(torch.tensor([1])) * 0.5).sum().backward()  # |z| = 0.5 <= l1: still 0
    >>> opt.step()
    >>> float(table.weight.detach()[1, 0])
    0.0
    >>> opt.zero_grad(); (table(torch.tensor([1])) * 2.0).sum().backward(); opt.step()
    >>> round(float(table.weight.detach()[1, 0]), 3)  # z = 2.5, n = 4.25: -1.5 / (30.6 + 1)
    -0.047
    """

    def __init__(
        self, params: Iterable[Tensor], lr: float = 0.1, beta: float = 1.0, l1: float = 1.0, l2: float = 1.0
    ) -> None:
        if lr <= 0.0 or beta < 0.0 or l1 < 0.0 or l2 < 0.0:
            raise ValueError(f"RowwiseFtrl: invalid lr={lr}, beta={beta}, l1={l1} or l2={l2}")
        super().__init__(params, {"lr": lr, "beta": beta, "l1": l1, "l2": l2})
        self.compact = None

    def _update_rows(
        self, p: Tensor, rows: Tensor, g: Tensor, group: dict[str, Any], state: dict[str, Any]
    ) -> None:
        if not state:
            state.update(_ftrl_start(p, group))
        n, z = state["n"].index_select(0, rows), state["z"].index_select(0, rows)
        n_new = n + g * g
        z += g - (n_new.sqrt() - n.sqrt()) / group["lr"] * p.index_select(0, rows)
        state["n"].index_copy_(0, rows, n_new)
        state["z"].index_copy_(0, rows, z)
        p.index_copy_(0, rows, _ftrl_weights(z, n_new, group))


class LinearFtrl(_PerParameter):
    """:class:`RowwiseFtrl` for dense parameters (the dense inputs' weights and the output bias),
    each element a coordinate, as the FTRL baseline treats its dense inputs and its bias."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.1,
        beta: float = 1.0,
        l1: float = 1.0,
        l2: float = 1.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "beta": beta, "l1": l1, "l2": l2})

    def _update(self, p: Tensor, grad: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        if not state:
            state.update(_ftrl_start(p, group))
        g, n = grad, state["n"]
        n_new = n + g * g
        state["z"] += g - (n_new.sqrt() - n.sqrt()) / group["lr"] * p
        state["n"] = n_new
        p.copy_(_ftrl_weights(state["z"], n_new, group))
