"""Prometheus text rendering and the /metrics endpoint of pipeline.core.metrics; JSON log lines."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.core.logs import JsonFormatter, set_context
from pipeline.core.metrics import Registry, serve_metrics
from serving_bridge.worker_metrics import WorkerStates


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


def test_every_workers_scrape_time_series_whichever_worker_answers(tmp_path: Path) -> None:
    """Two workers' states in one folder: either worker's scrape shows both, one family per name,
    each series labelled with its worker; a worker's value is the one of its last publish."""
    swaps = {"0": 0, "1": 0}
    states = {}
    for w in ("0", "1"):
        reg = Registry({"worker": w})
        reg.on_scrape(lambda w=w, reg=reg: reg.counter("swaps_total", "swaps", arm="a").set(swaps[w]))
        states[w] = WorkerStates(reg, tmp_path, w)
    swaps.update({"0": 3, "1": 5})
    states["1"].publish_due()  # worker 1's event loop ticked; worker 0 answers the scrape
    swaps["1"] = 6  # not published yet: worker 0's scrape still shows 5
    exposition = CollectorRegistry()
    exposition.register(states["0"])
    text = generate_latest(exposition).decode()
    assert text.count("# TYPE swaps_total counter") == 1
    samples = {s.labels["worker"]: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples == {"0": 3.0, "1": 5.0}
    assert 'swaps_total{arm="a",worker="1"} 5.0' in text
    states["1"].publish_due()  # less than a second since its last publish: not due
    assert 'swaps_total{arm="a",worker="1"} 5.0' in generate_latest(exposition).decode()
    states["1"].publish()
    assert 'swaps_total{arm="a",worker="1"} 6.0' in generate_latest(exposition).decode()


def test_json_logs_carry_the_daemon_context() -> None:
    set_context(daemon="joiner", offsets={"imps:0": 5})
    rec = logging.LogRecord("pipeline.join.joiner", logging.WARNING, __file__, 1, "lag %d", (3,), None)
    line = json.loads(JsonFormatter().format(rec))
    assert line["msg"] == "lag 3" and line["daemon"] == "joiner" and line["offsets"] == {"imps:0": 5}
    set_context(daemon=None, offsets=None)


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on() -> None:
    code = (
        "import sys, threading, time\n"
        "from pipeline.core.logs import dump_stacks_on_sigusr1\n"
        "dump_stacks_on_sigusr1()\n"
        "threading.Thread(target=time.sleep, args=(30,), name='waiter', daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('still running', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"still running" in out  # dumped, not stopped
    assert err.count(b"most recent call first") >= 2  # the main thread and the waiter
