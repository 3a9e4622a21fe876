"""Data-parallel training with row-sharded tables (trainers/sharding.py), two ranks on gloo.

The ranks are real processes started by torchrun, as a user would run them; the reference is
the same program in one process. Two ranks hold half of each table's rows each and must learn
what one process learns: the same scores and losses up to the summation order of the replicated
weights' gradients (float rounding, far below any metric's resolution).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainers.learner import TorchLearner
from trainers.sharding import RowSharding, ShardedRows

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("sharded_worker.py")
TOL = 1e-6
# An AUC moves by 1 / (positives x negatives), ~2e-6 here, when a pair of scores 1e-8 apart swaps:
# 1e-4 is some fifty swaps, where rounding makes a fraction of one.
AUC_TOL = 1e-4


def _torchrun(*args: str | Path, ranks: int = 2, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    done = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _alone(*args: str | Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _result(out: Path) -> dict[str, list[object]]:
    return json.loads((out / "result.json").read_text())


def _close(a: dict[str, list[object]], b: dict[str, list[object]]) -> None:
    np.testing.assert_allclose(np.array(a["loss"], float), np.array(b["loss"], float), rtol=0, atol=TOL)
    for pa, pb in zip(a["predictions"], b["predictions"], strict=True):
        np.testing.assert_allclose(np.array(pa, float), np.array(pb, float), rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("model", "min_count", "tables"),
    [
        ("deepfm", "0", {"wide.table": 4096, "embedding.table": 4096}),
        ("dcnv2", "0", {"embedding.table": 4096}),
        ("deepfm", "3", {"wide.table": 4096, "embedding.table": 4096 + 4}),  # + a rare row per field
    ],
)
def test_two_ranks_hold_half_the_rows_each_and_learn_what_one_process_learns(
    tmp_path: Path, model: str, min_count: str, tables: dict[str, int]
) -> None:
    env = {**os.environ, "WORKER_MODEL": model, "WORKER_MIN_COUNT": min_count}
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    _alone(WORKER, one, env=env)
    _torchrun(WORKER, two, env=env)
    _close(_result(one), _result(two))
    rows = [json.loads((two / f"rows-{r}.json").read_text()) for r in (0, 1)]
    assert {k: rows[0][k] + rows[1][k] for k in rows[0]} == tables
    assert all(abs(rows[0][k] - rows[1][k]) <= 1 for k in tables)  # half each
    assert json.loads((one / "rows-0.json").read_text()) == {}  # one process: nothing sharded

    # What the ranks saved is an ordinary whole learner, optimizer state included.
    a = torch.load(one / "model" / "weights.pt", weights_only=True)
    b = torch.load(two / "model" / "weights.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=TOL)
    assert a.keys() == b.keys()
    for key in a.keys() - {"model"}:  # the optimizers the model has
        for i, state in a[key]["state"].items():
            for name, value in state.items():
                assert b[key]["state"][i][name].shape == value.shape, (key, name)
                torch.testing.assert_close(b[key]["state"][i][name], value, rtol=1e-5, atol=TOL)
    # One process loads it and scores as the ranks would have.
    learner = TorchLearner.load(two / "model")
    again = TorchLearner.load(one / "model")
    assert {k: v.shape[0] for k, v in b["model"].items() if k.endswith("table.weight")} == {
        f"{k}.weight": n for k, n in tables.items()
    }
    from trainers.testing import synthetic_examples

    block = synthetic_examples(5000, seed=5)[3000:4000]
    np.testing.assert_allclose(learner.predict(block), again.predict(block), rtol=0, atol=TOL)


def test_two_ranks_resume_a_saved_learner_as_one_process_does(tmp_path: Path) -> None:
    start, one, two = tmp_path / "start", tmp_path / "one", tmp_path / "two"
    for d in (start, one, two):
        d.mkdir()
    _alone(WORKER, start)  # three blocks learned in one process, saved with optimizer state
    _alone(WORKER, one, start / "model")
    _torchrun(WORKER, two, start / "model")  # each rank takes its rows of the saved state
    _close(_result(one), _result(two))


def _metrics(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_ctr_backtest_on_two_ranks_reports_what_one_process_reports(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "pipeline.ops.cli", "backtest", "--format", "simulator"]
    args += ["--impressions", "12000", "--train-every", "3000", "--out"]
    # side by side (most of each is start-up); trainer.ranks = 2: the command starts itself again
    # under torchrun, two ranks
    runs = [
        subprocess.Popen([*args, str(tmp_path / "one")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
        subprocess.Popen(
            [*args, str(tmp_path / "two")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "CTR_TRAINER_RANKS": "2"},
        ),
    ]
    try:
        for run in runs:
            _, err = run.communicate(timeout=300)
            assert run.returncode == 0, err[-3000:].decode(errors="replace")
    finally:
        for run in runs:
            run.kill()
    one, two = _metrics(tmp_path / "one" / "metrics.csv"), _metrics(tmp_path / "two" / "metrics.csv")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two, strict=True):
        assert a["version"] == b["version"] and a["gate_accepted"] == b["gate_accepted"]
        for col in ("online_auc", "online_logloss", "online_calibration", "static_auc", "static_logloss"):
            tol = AUC_TOL if col.endswith("auc") else TOL
            if a[col] != "nan":
                assert abs(float(a[col]) - float(b[col])) <= tol, (a["block"], col, a[col], b[col])
        assert a["ftrl_auc"] == b["ftrl_auc"]  # FTRL is not sharded: every rank computes it whole
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["ranks"] == 2
    assert not list(tmp_path.glob("two/rank*"))  # the other rank wrote nowhere in the report's folder


def test_scaleout_benchmark_measures_one_and_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "scaleout.json"
    _alone(
        Path(__file__).parents[1] / "benchmarks" / "scaleout.py",
        "--quick",
        "--parts",
        "trainer",
        "--out",
        out,
    )
    trainer = json.loads(out.read_text())["trainer"][str(1 << 16)]
    assert trainer["1"]["rows_per_rank"] == {"wide.table": 1 << 16, "embedding.table": 1 << 16}
    assert trainer["2"]["rows_per_rank"] == {"wide.table": 1 << 15, "embedding.table": 1 << 15}
    assert len(trainer["2"]["peak_rss_mb_per_rank"]) == 2
    assert all(r["examples_per_s"] > 0 for r in trainer.values())


def test_a_shard_initialised_alone_holds_exactly_its_rows_of_the_whole_table() -> None:
    """No rank ever draws the whole table: each draws the same numbers chunk by chunk and keeps its
    rows (row g on rank g mod W), and torch's generator ends where the whole table leaves it."""
    rows, dim = 3 * 65_536 + 5, 4  # several chunks, the last one short
    torch.manual_seed(11)
    whole = torch.nn.Embedding(rows, dim, sparse=True)
    torch.nn.init.normal_(whole.weight, std=0.01)
    after = torch.rand(3)
    for rank in range(3):
        torch.manual_seed(11)
        shard = ShardedRows.initialised(rows, dim, 0.01, RowSharding(None, 3, rank))
        assert torch.equal(shard.weight.detach(), whole.weight.detach()[rank::3])
        assert torch.equal(torch.rand(3), after)
        assert shard.global_rows == rows
        owned = shard.owned(torch.tensor([0, 1, 2, 3, 7, 8])).tolist()  # local rows of the ids it holds
        assert owned == {0: [0, 1], 1: [0, 2], 2: [0, 2]}[rank]
