"""benchmarks/quality_report.py: the quality suite's metrics and Must-show checks on made-up blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from quality_report import checks, conversion_summary, markdown, score_world


def blocks(n_blocks: int = 4, n: int = 5_000, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(1, n_blocks + 1):
        p = rng.uniform(0.01, 0.2, n)
        y = (rng.random(n) < p).astype(np.float32)
        scores = {"good": p, "ftrl": np.clip(p + rng.normal(0, 0.05, n), 0.001, 0.999), "high": 2 * p}
        if i > 1:
            scores["static"] = np.full(n, 0.1)
        out.append({"index": i, "labels": y, "scores": scores})
    return out


def test_checks_tell_a_calibrated_learner_from_an_overconfident_one() -> None:
    world = score_world(blocks(), ["good", "ftrl", "high", "static"], resamples=50, seed=1)
    world["checks"] = {n: checks(world, n) for n in world["learners"]}
    good, high = world["checks"]["good"], world["checks"]["high"]
    assert good["pass"] and good["auc_beyond_ci"] and good["ne_blocks_judged"] == [2, 3, 4]
    assert not high["calibration_ok"] and not high["pass"]  # same ranking, twice the rate
    assert world["checks"]["ftrl"]["auc_ge_ftrl"] is None  # the reference is not judged against itself
    static = world["learners"]["static"]
    assert static["overall"] == static["blocks2"] and static["blocks2"]["auc"] == 0.5
    assert world["learners"]["good"]["overall"]["examples"] == 20_000
    assert world["learners"]["good"]["blocks2"]["examples"] == 15_000
    table = markdown({"w": world}, ["good", "ftrl", "high", "static"])
    assert table.count("\n") == 5 and "| w | high |" in table and "FAIL" in table


def test_on_a_thin_world_ne_is_judged_against_the_running_base_rate() -> None:
    """Where no block has 100 clicks, NE < 1 is out of reach even for the click rate known in
    hindsight: there a learner must do at least as well as ``baserate`` (quality.add_base_rate)."""
    from quality import add_base_rate

    rng = np.random.default_rng(3)
    rows = {}
    for i in range(1, 6):
        y = (rng.random(2_000) < 0.005).astype(np.float32)  # ~10 clicks a block, no signal
        noisy = np.clip(0.005 * np.exp(rng.normal(0, 1.0, y.size)), 1e-4, 0.5)  # learned noise
        rows[i] = {"index": i, "labels": y, "scores": {"ftrl": noisy, "noisy": noisy[::-1].copy()}}
    add_base_rate(rows)
    assert "baserate" not in rows[1]["scores"]
    first_rate = float(rows[1]["labels"].sum()) / 2_000  # block 2 is scored with block 1's rate
    assert (rows[2]["scores"]["baserate"] == first_rate).all() and rows[2]["scores"]["baserate"].size == 2_000
    seen = np.concatenate([rows[i]["labels"] for i in (1, 2, 3, 4)])
    assert rows[5]["scores"]["baserate"][0] == float(seen.sum()) / seen.size
    learners = ["noisy", "ftrl", "baserate"]
    world = score_world(list(rows.values()), learners, resamples=20, seed=1)
    world["checks"] = {n: checks(world, n) for n in learners}
    noisy, base = world["checks"]["noisy"], world["checks"]["baserate"]
    assert noisy["ne_blocks_judged"] == [] and not noisy["ne_le_baserate"] and not noisy["ne_ok"]
    assert base["ne_ok"] and not base["ne_blocks2_lt_1"]  # the base rate itself: NE just above 1
    assert "(<= baserate)" in markdown({"w": world}, learners)


def test_din_gets_its_paired_margin_over_the_default_model() -> None:
    rows = blocks()
    for b in rows:  # din: the true rates; default: the noisy reference's scores
        good, noisy = b["scores"]["good"], b["scores"]["ftrl"]
        b["scores"] = {"din": good, "default": noisy, "ftrl": noisy}
    world = score_world(rows, ["default", "din", "ftrl"], resamples=50, seed=1)
    margin = world["margins"]["din_vs_default"]
    assert margin["auc"] > 0 and margin["auc_ci95"][0] > 0
    assert world["margins"]["default_vs_ftrl"]["auc"] == 0


def test_conversion_summary_pools_the_started_blocks_by_their_rows(tmp_path: Path) -> None:
    """Two started blocks of 1,000 rows and a flushed tail of 10: pooled, the tail counts for its
    rows (a block mean would give it a third of every figure); the block before the start is out."""
    cols = "block,corrections,online_cvr_started,online_cvr_examples,online_cvr_positives"
    cols += ",online_cvr_mean_prediction,online_cvr_logloss,online_cvr_auc,online_cvr_clicked_auc"
    cols += ",online_cvr_auc_by_ctr,online_cvr_clicked_auc_by_ctr,online_cvr_clicked_calibration"
    path = tmp_path / "metrics.csv"
    path.write_text(
        cols
        + "\n0,5,0,1000,1,0.5,0.7,0.5,0.5,0.5,0.5,5"
        + "\n1,50,1,1000,10,0.01,0.05,0.8,0.6,0.7,0.5,1"
        + "\n2,50,1,1000,10,0.01,0.06,0.6,0.6,0.7,0.5,1"
        + "\n3,10,1,10,2,0.01,1.0,0.4,0.4,0.4,0.4,0.5\n"
    )
    c = conversion_summary(path)
    assert c["block_indexes"] == [1, 2, 3] and c["positives"] == 22 and c["corrections"] == 110
    assert c["calibration"] == pytest.approx((10 + 10 + 0.1) / 22)
    rate = 22 / 2010
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log1p(-rate))
    assert c["ne"] == pytest.approx((50 + 60 + 10) / 2010 / entropy)
    assert c["auc"] == pytest.approx((0.8 * 10 + 0.6 * 10 + 0.4 * 2) / 22)
    assert c["clicked_calibration"] == pytest.approx((10 + 10 + 1) / 22)
