"""benchmarks/thin_logs.py: the chance a perfect predictor passes the calibration check, the
prequential Bayes references, and one real log replayed through them."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from thin_logs import analyse, calibration_chance, calibration_range, prequential

DATASETS = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"


def test_calibration_chance_matches_a_simulated_perfect_predictor() -> None:
    rng = np.random.default_rng(0)
    for expected in (12.0, 40.0, 178.0):
        observed = rng.poisson(expected, 200_000)
        with np.errstate(divide="ignore"):
            ratio = expected / observed
        simulated = float(np.mean((ratio >= 0.9) & (ratio <= 1.1)))
        assert calibration_chance(expected) == pytest.approx(simulated, abs=0.005)
    assert calibration_chance(0.0) == 0.0
    assert calibration_chance(40.0) < 0.5 < calibration_chance(178.0) < calibration_chance(1_377.0)


def test_calibration_range_covers_95_percent_of_a_perfect_predictors_ratios() -> None:
    rng = np.random.default_rng(1)
    expected = 50.0
    lo, hi = calibration_range(expected)
    ratio = expected / np.maximum(rng.poisson(expected, 100_000), 1)
    inside = float(np.mean((ratio >= lo) & (ratio <= hi)))
    assert 0.94 <= inside <= 0.97
    assert lo < 1.0 < hi


def test_prequential_predicts_from_earlier_rows_only() -> None:
    y = np.array([1.0, 0.0, 0.0, 1.0])
    p = prequential(y, None, start=0.5, base_rows=2, key_rows=0)
    # (1 + clicks) / (2 + rows) before each row
    assert p.tolist() == pytest.approx([1 / 2, 2 / 3, 2 / 4, 2 / 5])
    keys = ["a", "b", "a", "a"]
    q = prequential(y, keys, start=0.5, base_rows=2, key_rows=1)
    # row 3 (key a, seen once with a click): (1 + 1 * base) / (1 + 1), base = 2 / 4
    assert q[2] == pytest.approx((1 + 0.5) / 2)
    assert q[0] == pytest.approx(0.5) and q[1] == pytest.approx(2 / 3)  # an unseen key: the base rate


def test_a_huge_prior_is_the_constant_start_rate() -> None:
    y = (np.arange(1_000) % 50 == 0).astype(float)
    p = prequential(y, None, start=0.02, base_rows=1e12, key_rows=0)
    assert np.allclose(p, 0.02)
    assert not math.isnan(float(p.sum()))


@pytest.mark.skipif(
    not (DATASETS / "open_bandit_obd" / "random" / "men").exists(), reason="needs ../shared/datasets"
)
def test_an_open_bandit_log_is_too_thin_for_ne_below_1() -> None:
    """The suite's rows of OBD random/men: few clicks after block 1, no block with 100, and the
    base rate known in hindsight and learned online cannot go below NE 1."""
    r = analyse("obd-random-men", DATASETS)
    assert r["rows"] == 10_000 and r["judged_rows"] == 8_000 and r["block"] == 2_000
    assert 20 <= r["clicks_blocks2"] <= 60 and r["blocks_with_100_clicks"] == 0
    assert r["position_field"] == "position" and set(r["position_rates"]) == {"1", "2", "3"}
    assert r["prequential_base_rate"]["ne"] > 1.0  # even starting from the log's own rate
    assert r["hindsight_position_ne"] < 1.0  # a model fitted on the judged rows themselves can
    assert r["perfect_calibration_pass_chance"] < 0.6
