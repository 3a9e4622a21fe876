"""The fast trainer path: row-wise Adam, the device decisions, no host reads in the hot loop.

Everything here runs on the CPU; the CUDA choices are pure functions of a ``torch.device`` and are
checked with ``torch.device("cuda")`` objects, which need no GPU.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.core.config import TrainerConfig
from trainers.encoding import EncodedBatch, Encoder
from trainers.learner import TorchLearner, autocast_dtype, pins_host_memory, step_batch_size
from trainers.rowwise import RowwiseAdagrad, RowwiseAdam, merge_rows

ROOT = Path(__file__).resolve().parent.parent


def _tables(rows: int = 200, dim: int = 5) -> tuple[torch.nn.Embedding, torch.nn.Embedding]:
    torch.manual_seed(0)
    a = torch.nn.Embedding(rows, dim, sparse=True)
    b = torch.nn.Embedding(rows, dim, sparse=True)
    b.load_state_dict(a.state_dict())
    return a, b


def _step(table: torch.nn.Embedding, opt: torch.optim.Optimizer, ids: torch.Tensor, w: torch.Tensor) -> None:
    opt.zero_grad()
    (table(ids) * w).sum().backward()
    opt.step()


def test_merge_rows_sums_repeats_into_fixed_slots():
    ids = torch.tensor([7, 3, 7, 7, 1, 3])
    grads = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    rows, summed = merge_rows(ids, grads)
    assert rows.shape == (6,) and summed.shape == (6, 2)  # sizes never depend on the data
    assert rows[:3].tolist() == [1, 3, 7]
    assert summed[:3].tolist() == [[8.0, 9.0], [12.0, 14.0], [10.0, 13.0]]
    # the unused slots repeat the last distinct row exactly, so duplicate writes agree
    assert rows[3:].tolist() == [7, 7, 7]
    assert all(s.tolist() == [10.0, 13.0] for s in summed[3:])
    rows, summed = merge_rows(ids, grads, compact=True)
    assert rows.tolist() == [1, 3, 7] and summed.tolist() == [[8.0, 9.0], [12.0, 14.0], [10.0, 13.0]]


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "fixed-size"])
def test_rowwise_adam_matches_sparse_adam_over_steps(compact):
    a, b = _tables()
    sparse_adam = torch.optim.SparseAdam(a.parameters(), lr=0.05)
    rowwise = RowwiseAdam(b.parameters(), lr=0.05)
    rowwise.compact = compact
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        ids = torch.randint(0, 40, (32, 4), generator=gen)  # many repeats within a batch
        w = torch.randn(32, 4, 5, generator=gen)
        _step(a, sparse_adam, ids, w)
        _step(b, rowwise, ids, w)
    torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=1e-6)
    untouched = torch.ones(200, dtype=torch.bool)
    untouched[:40] = False
    assert torch.equal(rowwise.state[b.weight]["exp_avg"][untouched], torch.zeros(160, 5))


def test_rowwise_adam_resumes_from_a_sparse_adam_state_dict():
    a, b = _tables()
    sparse_adam = torch.optim.SparseAdam(a.parameters(), lr=0.05)
    ids, w = torch.tensor([[1, 2, 2]]), torch.ones(1, 3, 5)
    _step(a, sparse_adam, ids, w)
    b.load_state_dict(a.state_dict())
    rowwise = RowwiseAdam(b.parameters(), lr=0.05)
    # a checkpoint written before this optimizer (deep-copied: load_state_dict keeps the tensors)
    rowwise.load_state_dict(copy.deepcopy(sparse_adam.state_dict()))
    _step(a, sparse_adam, ids, w)
    _step(b, rowwise, ids, w)
    torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=1e-6)
    assert rowwise.state[b.weight]["step"] == 2


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_a_cloned_learner_keeps_the_optimizer_mode_and_learns(kind):
    """TorchLearner.clone deep-copies the optimizers; Optimizer pickles only its own fields."""
    learner = _learner(kind)
    learner._sparse_opt.compact = False  # type: ignore[union-attr]
    learner.learn(_block(256))
    twin = learner.clone()
    expected = RowwiseAdagrad if kind == "adagrad" else RowwiseAdam
    assert isinstance(twin._sparse_opt, expected) and twin._sparse_opt.compact is False
    table = twin.model.embedding.table.weight
    before = table.detach().clone()
    sum_sq = twin._sparse_opt.state[table]["sum_sq"].clone() if kind == "adagrad" else None
    twin.learn(_block(256))
    assert not torch.equal(table, before)
    if kind == "adam":
        assert twin._sparse_opt.state[table]["step"] == 8
    else:  # the accumulators were copied, then grew on the rows the block used
        assert sum_sq is not None and bool((twin._sparse_opt.state[table]["sum_sq"] >= sum_sq).all())
        assert not torch.equal(twin._sparse_opt.state[table]["sum_sq"], sum_sq)


def test_fixed_slots_and_compact_rows_give_the_same_adagrad_step():
    """On a GPU the optimizer writes n fixed slots (repeats included), on the CPU the distinct rows."""
    a, b = _tables()
    ids = torch.tensor([[3, 7, 3, 3], [1, 7, 9, 3]])
    w = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(1))
    fixed, compact = RowwiseAdagrad(a.parameters(), lr=0.1), RowwiseAdagrad(b.parameters(), lr=0.1)
    fixed.compact, compact.compact = False, True
    for _ in range(3):
        _step(a, fixed, ids, w)
        _step(b, compact, ids, w)
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=1e-6)
    untouched = [r for r in range(a.weight.shape[0]) if r not in (1, 3, 7, 9)]
    torch.testing.assert_close(a.weight[untouched], _tables()[0].weight[untouched], rtol=0, atol=0)


@pytest.mark.parametrize("kind", [RowwiseAdam, RowwiseAdagrad])
def test_rowwise_optimizers_refuse_dense_gradients(kind):
    p = torch.nn.Parameter(torch.zeros(3, 2))
    opt = kind([p])
    p.sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()


def test_device_decisions_for_cuda_and_cpu():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert autocast_dtype(cuda) is torch.bfloat16 and autocast_dtype(cpu) is None
    assert pins_host_memory(cuda) and not pins_host_memory(cpu)
    cfg = TrainerConfig(batch_size=512, batch_size_cuda=8192)
    assert step_batch_size(cfg, cuda) == 8192 and step_batch_size(cfg, cpu) == 512
    assert step_batch_size(TrainerConfig(batch_size=512, batch_size_cuda=0), cuda) == 512


def _block(n: int, fields: int = 4, rows: int = 1 << 12) -> EncodedBatch:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, (n, fields)).astype(np.int64)
    dense = rng.random((n, 2), dtype=np.float32)
    return EncodedBatch(ids, dense, (rng.random(n) < 0.3).astype(np.float32))


def _learner(sparse_optimizer: str = "adam", **config: Any) -> TorchLearner:
    enc = Encoder.from_spec(
        {
            "version": 1,
            "hash": "blake2b64",
            "hash_buckets": 1 << 12,
            "fields": ["a", "b", "c", "d"],
            "dense_keys": ["x", "y"],
            "stream_keys": [],
        }
    )
    cfg = TrainerConfig(
        hash_buckets=1 << 12,
        embedding_dim=4,
        hidden=(8,),
        batch_size=64,
        min_steps=0,  # steps of batch_size whatever the block's size: the optimizers' mechanics
        device="cpu",
        sparse_optimizer=sparse_optimizer,  # type: ignore[arg-type]
        **config,
    )
    return TorchLearner(cfg, enc)


@pytest.mark.parametrize("kind", ["adagrad", "adam"])
def test_learn_reads_the_device_once_per_block(monkeypatch, kind):
    """No ``.item()``/``.cpu()``/``float()`` per step: on a GPU each would stall the stream."""
    learner = _learner(kind)
    assert isinstance(learner._sparse_opt, RowwiseAdagrad if kind == "adagrad" else RowwiseAdam)
    for opt in (learner._sparse_opt, learner._wide_opt):  # what they do on a GPU (on the CPU they
        opt.compact = False  # type: ignore[union-attr]  # read a row count)
    reads: list[str] = []
    for name in ("item", "cpu", "tolist", "numpy", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _name=name, _original=original, **kw):
            reads.append(_name)
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, spy)
    loss = learner.learn(_block(64 * 10))
    monkeypatch.undo()
    assert learner.steps == 10
    assert reads == ["__float__"]  # the block's summed loss, once
    assert np.isfinite(loss)


@pytest.mark.slow
def test_train_benchmark_quick_run_writes_its_json(tmp_path):
    out = tmp_path / "train.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "train.py"), "--quick", "--rows", "4096"]
    cmd += ["--batch-sizes", "256", "--threads", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    data = json.loads(out.read_text())
    assert data["meta"]["rows"] == 4096
    for model in ("deepfm", "dcnv2"):
        r = data["results"]["cpu"][model]["256"]
        assert r["examples_per_s"] > 0 and r["reference_examples_per_s"] > 0
        ratio = r["examples_per_s"] / r["reference_examples_per_s"]
        assert r["speedup_vs_reference"] == pytest.approx(ratio, rel=0.02, abs=0.01)


def test_ftrl_wide_part_keeps_values_seen_too_little_at_zero():
    """wide_optimizer="ftrl": FTRL-Proximal's L1 leaves a value's first-order weight at exactly 0
    until its gradients add up past l1, and the learner still learns the frequent values."""
    learner = _learner("adagrad", wide_optimizer="ftrl")
    block = _block(2048, rows=64)  # frequent values: each of 64 rows ~128 times
    block.ids[0, 0] = 4000  # one value seen once
    learner.learn(block)
    wide = learner.model.wide.table.weight.detach()[:, 0]
    assert float(wide[4000]) == 0.0
    assert int((wide[:64] != 0).sum()) > 0


def test_adagrad_decay_keeps_a_frequent_rows_rate_from_vanishing():
    """decay < 1: the sum of squared gradients forgets, so after many steps the same gradient
    still moves the row by more than undecayed AdaGrad would (an always-on stream keeps learning)."""
    steps = []
    for decay in (1.0, 0.9):
        table = torch.nn.Embedding(2, 1, sparse=True)
        torch.nn.init.zeros_(table.weight)
        opt = RowwiseAdagrad(table.parameters(), lr=0.1, beta=1.0, decay=decay)
        for _ in range(200):
            _step(table, opt, torch.tensor([[1]]), torch.ones(1, 1, 1))
        before = float(table.weight.detach()[1, 0])
        _step(table, opt, torch.tensor([[1]]), torch.ones(1, 1, 1))
        steps.append(before - float(table.weight.detach()[1, 0]))
    undecayed, decayed = steps
    assert decayed > 2 * undecayed > 0
    with pytest.raises(ValueError, match="decay"):
        RowwiseAdagrad(torch.nn.Embedding(2, 1, sparse=True).parameters(), decay=0.0)
