"""benchmarks/replay_memory.py: the peak memory it reads is the child's own, and it runs end to end
(two short Criteo-layout logs through ``ctr backtest``; the click-less log it can write)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.replay_memory import describe, growth_per_100k, main, peak_rss_run, write_clickless
from pipeline.core.partitioning import partition_of


def test_the_peak_is_the_childs_own() -> None:
    env, here = dict(os.environ), Path.cwd()
    touch = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    big = peak_rss_run(touch, [], env, here)
    small = peak_rss_run("pass", [], env, here)
    assert small[0] == big[0] == 0
    assert big[2] >= 300  # MB: the 300 MiB the child touched
    # its own address space's: neither the largest child's so far (RUSAGE_CHILDREN) nor this
    # process's peak, which wait4's ru_maxrss carries into a child it spawned
    assert small[2] < 100 < big[2] - small[2]


def test_growth_is_the_least_squares_slope_per_100k_rows() -> None:
    assert growth_per_100k([100_000, 300_000, 1_000_000], [1_000, 1_200, 1_900]) == pytest.approx(
        100.0, abs=0.5
    )
    assert growth_per_100k([100_000], [1_000]) is None


def test_it_replays_each_length_and_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "replay-memory.json"
    assert main(["--rows", "3000,1500", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [run["rows"] for run in r["runs"]] == [1_500, 3_000]
    for run in r["runs"]:
        assert run["examples"] == run["rows"] and run["peak_rss_mb"] > 100 and run["blocks"] >= 1
    assert r["growth_mb_per_100k_rows"] is not None and r["meta"]["commit"]


def test_the_clickless_log_has_no_click_of_one_partitions_users(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_clickless(path, seed=9, impressions=3_000)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    clicks = {partition_of(e["user_id"], 3) for e in events if e["type"] == "click"}
    users = {partition_of(e["user_id"], 3) for e in events if e["type"] == "impression"}
    assert clicks == {1, 2} and users == {0, 1, 2}
    assert sum(e["type"] == "impression" for e in events) >= 3_000 and "partition 0" in describe(
        "clickless", 9
    )
