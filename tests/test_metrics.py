"""Prometheus text rendering and the /metrics endpoint of pipeline.core.metrics; JSON log lines."""

from __future__ import annotations

import json
import logging
import urllib.request

from pipeline.core.logs import JsonFormatter, set_context
from pipeline.core.metrics import Registry, serve_metrics


def test_histogram_buckets_are_cumulative_and_labels_escaped() -> None:
    reg = Registry()
    h = reg.histogram("lat_seconds", "latency", (0.01, 0.1), route='/a"b')
    for v in (0.005, 0.05, 0.05, 3.0):
        h.observe(v)
    text = reg.render()
    assert 'lat_seconds_bucket{le="0.01",route="/a\\"b"} 1.0' in text
    assert 'lat_seconds_bucket{le="0.1",route="/a\\"b"} 3.0' in text
    assert 'lat_seconds_bucket{le="+Inf",route="/a\\"b"} 4.0' in text
    assert 'lat_seconds_count{route="/a\\"b"} 4.0' in text
    assert "# TYPE lat_seconds histogram" in text


def test_collectors_run_at_scrape_and_a_failing_one_does_not_break_it() -> None:
    reg, state = Registry(), {"n": 0}
    reg.on_scrape(lambda: reg.gauge("depth", "queue depth").set(state["n"]))
    reg.on_scrape(lambda: 1 / 0)  # type: ignore[func-returns-value]
    state["n"] = 7
    server = serve_metrics(reg, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "depth 7.0" in r.read().decode()
    finally:
        server.shutdown()


def test_json_logs_carry_the_daemon_context() -> None:
    set_context(daemon="joiner", offsets={"imps:0": 5})
    rec = logging.LogRecord("pipeline.join.joiner", logging.WARNING, __file__, 1, "lag %d", (3,), None)
    line = json.loads(JsonFormatter().format(rec))
    assert line["msg"] == "lag 3" and line["daemon"] == "joiner" and line["offsets"] == {"imps:0": 5}
    set_context(daemon=None, offsets=None)
