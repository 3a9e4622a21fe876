"""The simulator: determinism, click model, delays, drift, faults and ground truth."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from pipeline.core.config import SimulatorConfig
from pipeline.sources.simulator import CATEGORIES, DEVICES, SLOTS, Simulator

CFG = SimulatorConfig()


def events(sim: Simulator, n: int) -> list[tuple[str, dict[str, Any]]]:
    return list(sim.stream(n))


def impressions(evs: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {e["impression_id"]: e for k, e in evs if k == "impression"}


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    assert events(Simulator(CFG, 1), 12_000) == events(Simulator(CFG, 1), 12_000)
    assert events(Simulator(CFG, 1), 2_000) != events(Simulator(CFG, 2), 2_000)


def test_first_n_impressions_do_not_depend_on_n() -> None:
    short, long = (
        impressions(events(Simulator(CFG, 3), 15_000)),
        impressions(events(Simulator(CFG, 3), 30_000)),
    )
    assert all(long[i] == e for i, e in short.items())


def test_impression_wire_format_and_poisson_clock() -> None:
    evs = events(Simulator(CFG, 4), 10_000)
    imps = sorted(impressions(evs).values(), key=lambda e: int(e["impression_id"][4:]))
    assert len(imps) == 10_000 and imps[0]["impression_id"] == "imp-0"
    assert set(imps[0]) == {"impression_id", "ts", "user_id", "item_id", "features", "dense"}
    assert set(imps[0]["features"]) == {"device", "site_category", "slot", "hour"}
    ts = np.array([e["ts"] for e in imps])
    assert ts[0] >= CFG.start_ms and np.all(np.diff(ts) >= 0)
    assert (ts[-1] - ts[0]) / 1000 == pytest.approx(10_000 / CFG.events_per_s, rel=0.05)


@pytest.mark.parametrize("base_ctr", [0.06, 0.02])
def test_click_rate_is_near_base_ctr(base_ctr: float) -> None:
    evs = events(Simulator(dataclasses.replace(CFG, base_ctr=base_ctr), 5), 60_000)
    clicked = {e["impression_id"] for k, e in evs if k == "click"}
    assert len(clicked) / 60_000 == pytest.approx(base_ctr, rel=0.2)


def test_click_delay_is_minutes_with_a_tail_past_the_window() -> None:
    evs = events(Simulator(CFG, 6), 60_000)
    imp_ts = {i: e["ts"] for i, e in impressions(evs).items()}
    delays = np.array([e["ts"] - imp_ts[e["impression_id"]] for k, e in evs if k == "click"]) / 1000
    assert 30 < np.median(delays) < 120
    assert 0.02 < np.mean(delays > 900) < 0.07
    assert delays.min() >= 0 and delays.max() <= CFG.click_delay_max_s


def test_true_probability_of_a_fixed_pair_drifts() -> None:
    def logit_change(sim: Simulator) -> np.ndarray:
        pairs = list(zip(range(0, 500, 10), range(0, 1000, 20), strict=True))
        p0 = np.array([sim.click_probability(u, i, CFG.start_ms) for u, i in pairs])
        p1 = np.array([sim.click_probability(u, i, CFG.start_ms + 3 * 3_600_000) for u, i in pairs])
        return np.log(p1 / (1 - p1)) - np.log(p0 / (1 - p0))

    moved = logit_change(Simulator(CFG, 7))
    assert np.mean(np.abs(moved - moved.mean())) > 0.5  # pairs move differently: not just the hour
    frozen = logit_change(Simulator(dataclasses.replace(CFG, drift_half_life_s=1e15, shift_every_s=0.0), 7))
    assert np.ptp(frozen) < 1e-3  # without drift only the (shared) hour-of-day effect changes


def test_click_probability_matches_the_stream_oracle() -> None:
    sim = Simulator(CFG, 8)
    oracle = sim.true_probabilities(20_000)
    for imp in list(impressions(events(sim, 20_000)).values())[::2_000]:
        f = imp["features"]
        p = sim.click_probability(
            int(imp["user_id"][5:]), int(imp["item_id"][5:]), imp["ts"], DEVICES.index(f["device"]),
            CATEGORIES.index(f["site_category"]), SLOTS.index(f["slot"]),
        )  # fmt: skip
        assert p == pytest.approx(oracle[imp["impression_id"]])


def fault_counts(cfg: SimulatorConfig, n: int) -> tuple[int, int, int, int]:
    """(duplicate impressions, duplicate clicks, clicks before their impression, distinct clicks)."""
    seen_imps: set[str] = set()
    seen_clicks: set[str] = set()
    dup_imps = dup_clicks = early = 0
    for kind, e in Simulator(cfg, 9).stream(n):
        if kind == "impression":
            dup_imps += e["impression_id"] in seen_imps
            seen_imps.add(e["impression_id"])
        else:
            dup_clicks += e["click_id"] in seen_clicks
            early += e["click_id"] not in seen_clicks and e["impression_id"] not in seen_imps
            seen_clicks.add(e["click_id"])
    return dup_imps, dup_clicks, early, len(seen_clicks)


def test_duplicates_and_early_clicks_at_the_configured_rates() -> None:
    cfg = dataclasses.replace(CFG, duplicate_rate=0.02, early_click_rate=0.05)
    dup_imps, dup_clicks, early, clicks = fault_counts(cfg, 50_000)
    assert dup_imps / 50_000 == pytest.approx(0.02, rel=0.2)
    assert dup_clicks / clicks == pytest.approx(0.02, rel=0.5)
    assert early / clicks == pytest.approx(0.05, rel=0.3)


def test_no_faults_when_rates_are_zero() -> None:
    cfg = dataclasses.replace(CFG, duplicate_rate=0.0, early_click_rate=0.0)
    assert fault_counts(cfg, 30_000)[:3] == (0, 0, 0)


def test_arrival_disorder_is_bounded_below_the_watermark_lag() -> None:
    newest, worst = 0, 0
    for _, e in Simulator(dataclasses.replace(CFG, duplicate_rate=0.02, early_click_rate=0.05), 10).stream(
        30_000
    ):
        worst = max(worst, newest - e["ts"])
        newest = max(newest, e["ts"])
    assert 0 < worst <= (CFG.early_click_max_delay_s + 11) * 1000  # skewed impressions, re-sends


def test_ground_truth_matches_the_stream() -> None:
    sim = Simulator(CFG, 11)
    evs = events(sim, 40_000)
    imp_ts = {i: e["ts"] for i, e in impressions(evs).items()}
    expected = dict.fromkeys(imp_ts, 0)
    for kind, e in evs:
        if kind == "click" and 0 <= e["ts"] - imp_ts[e["impression_id"]] <= 900_000:
            expected[e["impression_id"]] = 1
    truth = sim.ground_truth(40_000, 900)
    assert truth == expected
    late = {e["impression_id"] for k, e in evs if k == "click"} - {i for i, y in truth.items() if y}
    assert late  # clicks past the window exist and are negatives


def test_bad_config_fails_loudly() -> None:
    with pytest.raises(ValueError, match="base_ctr"):
        Simulator(dataclasses.replace(CFG, base_ctr=0.0), 1)
