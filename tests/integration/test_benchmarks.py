"""The Kafka benchmarks run end to end (small sizes) against the real services and write every key.

Figures come from full runs (benchmarks/README.md); these only prove the scripts work and that
their counts add up. No wall-clock assertion.
"""

from __future__ import annotations

import json
import os
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
    per_event_s = 1 / r["raw_consumer_events_per_s"] + examples / events / r["raw_producer_records_per_s"]
    assert r["kafka_python_bound_events_per_s"] == pytest.approx(1 / per_event_s)


@pytest.mark.slow
def test_freshness_benchmark_measures_every_block(services, tmp_path):
    out = tmp_path / "freshness.json"
    args = ["--impressions", "12000", "--train-every", "2000", "--rate", "2000", "--replicas", "1"]
    run_benchmark("freshness.py", *args, "--out", str(out), timeout=900)
    r = json.loads(out.read_text())
    assert r["blocks"] == len(r["per_block"]) >= 5  # the script fails with fewer
    fresh = sorted(b["freshness_s"] for b in r["per_block"])
    assert r["max_s"] == fresh[-1] and fresh[0] > 0
    for b in r["per_block"]:
        parts = b["emit_s"] + b["queue_s"] + b["train_s"] + b["register_s"] + b["swap_s"]
        assert parts == pytest.approx(b["freshness_s"], abs=0.5), b
