"""The Kafka benchmarks run end to end (small sizes) against the real services and write every key.

Figures come from full runs (benchmarks/README.md); these only prove the scripts work and that
their counts add up. No wall-clock assertion.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout: int) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / name), *args]
    done = subprocess.run(
        cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"


def test_ingest_benchmark_counts_every_event_on_every_path(services, tmp_path):
    out = tmp_path / "ingest.json"
    run_benchmark("ingest.py", "--impressions", "3000", "--out", str(out), timeout=600)
    r = json.loads(out.read_text())
    events = r["events"]
    assert events > 3000 and r["raw_consumer"]["events"] == events == r["joiner"]["events"]
    examples = r["joiner"]["examples"]  # the windows that closed: the same on every path
    assert examples > 1000 and r["in_process"]["examples"] == examples == r["raw_producer"]["records"]
    assert r["ratio_to_raw_consumer"] == pytest.approx(r["events_per_s"] / r["raw_consumer_events_per_s"])
    runs = r["raw_consumer_runs_events_per_s"]  # three reads; the reference is their median
    assert len(runs) == 3 and r["raw_consumer_events_per_s"] == sorted(runs)[1]
    assert r["ratio_to_fastest_raw_consumer"] == pytest.approx(r["events_per_s"] / max(runs))
    defaults = r["default_raw_consumer_runs_events_per_s"]  # kafka-python's fetch wait, kept beside
    assert len(defaults) == 3 and r["default_raw_consumer_events_per_s"] == sorted(defaults)[1]
    assert r["ratio_to_default_raw_consumer"] == pytest.approx(r["events_per_s"] / sorted(defaults)[1])
    per_event_s = 1 / r["raw_consumer_events_per_s"] + examples / events / r["raw_producer_records_per_s"]
    assert r["kafka_python_bound_events_per_s"] == pytest.approx(1 / per_event_s)
    phases = r["joiner"]["checkpoint_phase_seconds"]  # each step of the checkpoints, within their total
    assert set(phases) == {"flush", "features", "state"} and min(phases.values()) >= 0
    assert 0 < sum(phases.values()) <= r["joiner"]["checkpoint_seconds_total"]


def test_scaleout_benchmark_splits_the_stream_among_joiner_processes(services, tmp_path):
    out = tmp_path / "scaleout.json"
    args = ("--parts", "joiner", "--processes", "1,2", "--impressions", "4000", "--out", str(out))
    run_benchmark("scaleout.py", *args, timeout=600)
    r = json.loads(out.read_text())["joiner"]
    for n in ("1", "2"):
        assert len(r[n]["per_process"]) == int(n)
        # each event read once by one process (the group was stable before the stream came)
        assert sum(p["events"] for p in r[n]["per_process"]) == r["events"]
        assert sum(r[n]["examples_per_partition"].values()) == r[n]["examples"] == r["1"]["examples"] > 1000
    assert all(p["events"] > 0 for p in r["2"]["per_process"])


def test_scaleout_benchmark_measures_checkpoints_and_restores_against_state_size(services, tmp_path):
    out = tmp_path / "scaleout.json"
    run_benchmark("scaleout.py", "--quick", "--parts", "state", "--out", str(out), timeout=600)
    row = json.loads(out.read_text())["state"]["sizes"]["2000"]
    assert row["after"]["restore_records"] == 2_000 + 1  # every user, the header (no items: the trainer's)
    assert 0 < row["after"]["checkpoint_records"] <= 2_000 + 1 == row["after"]["first_checkpoint_records"]
    assert row["before"]["file_mb"] > 0 and row["before"]["checkpoint_s"] > 0


@pytest.mark.slow
def test_freshness_benchmark_measures_every_block(services, tmp_path, monkeypatch):
    # every block published: a refused one would leave fewer than 5 versions (the script then fails)
    monkeypatch.setenv("CTR_TRAINER_GATE_TOLERANCE", "1.0")
    monkeypatch.setenv("CTR_TRAINER_MIN_CHAMPION_AUC", "0")
    out = tmp_path / "freshness.json"
    sizes = ["--impressions", "12000", "--train-every", "2000", "--rate", "2000", "--blocks", "5"]
    run_benchmark("freshness.py", *sizes, "--replicas", "1", "--out", str(out), timeout=900)
    r = json.loads(out.read_text())
    blocks = r["per_block"]
    assert r["blocks"] == len(blocks) >= 5  # the script fails with fewer
    assert [b["version"] for b in blocks] == sorted({b["version"] for b in blocks})
    fresh = [b["freshness_s"] for b in blocks]
    assert r["max_s"] == max(fresh) and r["p50_s"] == pytest.approx(statistics.median(fresh))
    for b in blocks:  # causality: each moment after the one before it
        assert b["emit_s"] >= 0, f"an example on Kafka before the event that closed its window: {b}"
        assert b["register_s"] >= 0 and b["swap_s"] >= 0, f"served before registered: {b}"
        assert b["from_last_impression_s"] > b["freshness_s"] > 0, b


def test_restart_benchmark_times_every_kill(services, tmp_path):
    out = tmp_path / "restart.json"
    sizes = ["--modes", "static", "--trials", "2", "--work-s", "3", "--rate", "4000"]
    run_benchmark("restart.py", *sizes, "--out", str(out), timeout=600)
    r = json.loads(out.read_text())["modes"]["static"]
    assert len(r["resume_s"]) == 2 and None not in r["resume_s"]  # the script fails otherwise
    assert r["resume_max_s"] == max(r["resume_s"]) and r["resume_p50_s"] == statistics.median(r["resume_s"])
