"""The A/B readout (trainers/ab_readout.py) against exact metrics and published interval values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from trainers import metrics
from trainers.ab_readout import BINS, ABReadout, ArmStats, compare, hanley_mcneil_se, wilson


def _feed(r: ABReadout, version: str, y: np.ndarray, p: np.ndarray) -> None:
    for label, score in zip(y, p, strict=True):
        r.add(version, int(label), float(score))


def _stream(seed: int, n: int, ctr: float, skill: float) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores whose AUC grows with ``skill`` (0: chance)."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < ctr).astype(np.int64)
    logit = math.log(ctr / (1 - ctr)) + skill * (y - ctr) + rng.normal(0, 1, n)
    return y, 1 / (1 + np.exp(-logit))


def test_wilson_known_values() -> None:
    # Newcombe (1998), Table I: 81/263 -> 0.2553-0.3662; 0/10 -> 0-0.2775
    lo, hi = wilson(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and round(hi, 4) == 0.2775
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_hanley_mcneil_against_the_formula_by_hand() -> None:
    # A = 0.8, 50 + 50: Q1 = 2/3, Q2 = 32/45; var = (0.16 + 49 (2/3 - .64) + 49 (32/45 - .64)) / 2500
    by_hand = math.sqrt((0.16 + 49 * (2 / 3 - 0.64) + 49 * (32 / 45 - 0.64)) / 2500)
    assert hanley_mcneil_se(0.8, 50, 50) == pytest.approx(by_hand, rel=1e-12)
    assert round(by_hand, 4) == 0.0445  # Hanley & McNeil (1982), Table 1: 0.044 at A = 0.8, n = 50
    assert math.isnan(hanley_mcneil_se(0.8, 0, 50))


def test_metrics_match_the_exact_ones_within_the_bin_bound() -> None:
    y, p = _stream(seed=1, n=20_000, ctr=0.05, skill=2.0)
    r = ABReadout()
    _feed(r, "3", y, p)
    s = r.summary()["3"]
    assert (s["examples"], s["clicks"], s["scored"]) == (y.size, int(y.sum()), y.size)
    assert s["ctr"] == pytest.approx(y.mean())
    assert s["logloss"] == pytest.approx(metrics.logloss(y, p), rel=1e-9)
    assert s["ne"] == pytest.approx(metrics.normalized_entropy(y, p), rel=1e-9)
    assert s["calibration"] == pytest.approx(metrics.calibration(y, p), rel=1e-9)
    exact = metrics.auc(y, p)
    assert abs(s["auc"] - exact) <= s["auc_bin_error"] + 1e-12
    assert s["auc_bin_error"] < 0.01  # 1,000 logit bins: few pairs share a bin
    assert s["auc_lo"] < exact < s["auc_hi"]
    assert s["ctr_lo"] < s["ctr"] < s["ctr_hi"]
    assert s["ne_lo"] < s["ne"] < s["ne_hi"]
    assert s["calibration_lo"] < s["calibration"] < s["calibration_hi"]


def test_distinct_bins_give_the_exact_auc() -> None:
    centres = 1 / (1 + np.exp(-(np.arange(BINS) + 0.5) / BINS * 20 + 10))  # one score per bin
    rng = np.random.default_rng(0)
    idx = rng.choice(BINS, 300, replace=False)
    y = (rng.random(300) < 0.3).astype(np.int64)
    arm = ArmStats()
    arm.add_many(y, centres[idx])
    auc, err = arm.auc()
    assert err == 0.0
    assert auc == pytest.approx(metrics.auc(y, centres[idx]), abs=1e-12)


def test_auc_interval_covers_the_true_auc() -> None:
    # binormal scores: true AUC = Phi(d / sqrt(2)); the 95% interval should cover it ~95% of the time
    d, n, covered = 0.8, 400, 0
    true_auc = float(norm.cdf(d / math.sqrt(2)))
    for seed in range(200):
        rng = np.random.default_rng(seed)
        y = (rng.random(n) < 0.3).astype(np.int64)
        z = rng.normal(0, 1, n) + d * y
        arm = ArmStats()
        arm.add_many(y, 1 / (1 + np.exp(-z)))
        s = arm.summary()
        covered += s["auc_lo"] <= true_auc <= s["auc_hi"]
    assert 0.90 <= covered / 200 <= 0.99


def test_without_scores_only_the_ctr() -> None:
    r = ABReadout()
    for i in range(100):
        r.add("5", int(i < 10), None)
    r.add(None, 1, 0.5)
    s = r.summary()["5"]
    assert (s["examples"], s["clicks"], s["scored"], s["ctr"]) == (100, 10, 0, 0.1)
    assert all(math.isnan(s[k]) for k in ("auc", "ne", "calibration", "logloss"))
    assert r.unattributed == 1


def test_state_round_trips_and_arms_are_bounded() -> None:
    y, p = _stream(seed=2, n=3_000, ctr=0.1, skill=1.5)
    r = ABReadout(max_versions=2)
    for version in ("1", "2", "3"):  # version 1 is updated least recently: dropped
        _feed(r, version, y, p)
    assert list(r.summary()) == ["2", "3"]
    back = ABReadout.from_dict(json.loads(json.dumps(r.to_dict())), max_versions=2)
    assert back.summary() == r.summary()
    _feed(back, "2", y[:10], p[:10])
    assert list(back.summary()) == ["3", "2"]


def test_compare_names_the_better_arm() -> None:
    y, weak = _stream(seed=3, n=30_000, ctr=0.05, skill=0.5)
    y2, strong = _stream(seed=4, n=30_000, ctr=0.05, skill=3.0)
    r = ABReadout()
    _feed(r, "champ", y, weak)
    _feed(r, "chal", y2, strong)
    s = r.summary()
    out = compare(s["champ"], s["chal"])
    assert out["verdict"]["auc"] == "challenger better"
    assert out["verdict"]["ne"] == "challenger better"
    assert compare(s["chal"], s["champ"])["verdict"]["auc"] == "champion better"
    d, lo, hi = out["diff"]["ctr"]
    assert lo < d < hi and out["verdict"]["ctr"] == "no clear difference"  # same world, same CTR
    same = compare(s["champ"], s["champ"])
    assert same["verdict"] == dict.fromkeys(("ctr", "auc", "ne"), "no clear difference")


def test_compare_ctr_interval_is_newcombes() -> None:
    # Newcombe (1998), Table II example (a): 56/70 vs 48/80, difference 0.2000, 95% CI 0.0524 to 0.3339
    a = {"ctr": 48 / 80, **dict(zip(("ctr_lo", "ctr_hi"), wilson(48, 80), strict=True))}
    b = {"ctr": 56 / 70, **dict(zip(("ctr_lo", "ctr_hi"), wilson(56, 70), strict=True))}
    nan = {k: math.nan for k in ("auc", "auc_se", "ne", "ne_lo", "ne_hi")}
    out = compare(a | nan, b | nan)
    d, lo, hi = out["diff"]["ctr"]
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (0.2, 0.0524, 0.3339)
    assert out["verdict"]["ctr"] == "challenger better" and out["verdict"]["auc"] == "undefined"


def test_the_joiner_carries_version_and_score_through_a_checkpoint() -> None:
    from pipeline.core.config import JoinerConfig
    from pipeline.core.events import Click, Impression
    from pipeline.join.joiner import Joiner

    cfg = JoinerConfig(attribution_window_s=60, watermark_lag_s=0)
    first = Joiner(cfg)
    first.process(Impression("i1", 1_000, "u", "a", model_version="4", score=0.125))
    first.process(Impression("i2", 2_000, "u", "b", model_version="5"))
    second = Joiner(cfg)
    second.load_state(json.loads(json.dumps(first.to_state())))
    second.process(Click("c1", "i1", 5_000, "u"))
    second.process(Impression("i3", 70_000, "u", "c"))
    second.advance()
    out = [(e.example_id, e.label, e.impression.model_version, e.impression.score) for e in second.drain()]
    assert out == [("i1", 1, "4", 0.125), ("i2", 0, "5", None)]
