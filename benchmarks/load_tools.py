"""Open-loop load and profiling helpers of ``benchmarks/serving.py``.

- :func:`open_loop`: request *k* is due at ``t0 + k / rate``; latency runs from that due time, so a
  stall shows in the tail instead of slowing the load (no coordinated omission);
- :func:`start_py_spy` / :func:`top_costs`: sample a process with py-spy and summarize the request
  threads' self and inclusive costs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["open_loop", "percentiles", "start_py_spy", "top_costs"]


def percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {
            "p50_ms": float("nan"),
            "p99_ms": float("nan"),
            "p999_ms": float("nan"),
            "max_ms": float("nan"),
        }
    a = np.asarray(ms)
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "p999_ms": round(float(np.percentile(a, 99.9)), 3),
        "max_ms": round(float(a.max()), 3),
    }


def open_loop(
    port: int, bodies: list[bytes], rate: float, seconds: float, threads: int
) -> tuple[list[float], int, float, dict[str, int]]:
    """Send ``rate * seconds`` requests due at fixed times; (latencies ms, errors, achieved qps, versions)."""
    due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
    latencies: list[float] = []
    versions: dict[str, int] = {}
    errors = [0]
    lock = threading.Lock()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while (job := due.get()) is not None:
            at, body = job
            try:
                conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                done = time.perf_counter()
                ok = resp.status == 200
                version = json.loads(data)["version"] if ok else None
            except (OSError, http.client.HTTPException, ValueError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                ok, done, version = False, time.perf_counter(), None
            with lock:
                if ok:
                    latencies.append((done - at) * 1000.0)
                    versions[version] = versions.get(version, 0) + 1
                else:
                    errors[0] += 1
        conn.close()

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    n = int(rate * seconds)
    t0 = time.perf_counter() + 0.05
    for k in range(n):
        at = t0 + k / rate
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        due.put((at, bodies[k % len(bodies)]))
    for _ in pool:
        due.put(None)
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - t0
    return latencies, errors[0], (len(latencies) + errors[0]) / elapsed, versions


def start_py_spy(args: argparse.Namespace, pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample the replica for one phase (collapsed stacks; idle threads left out)."""
    cmd = [args.py_spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds))]
    cmd += ["--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out.with_suffix(".log").open("wb"))
    time.sleep(1.0)  # attached before the load starts
    return proc


def top_costs(collapsed: Path, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Self and inclusive shares of the request threads' samples, from py-spy's collapsed stacks."""
    if not collapsed.is_file():
        return {}
    self_t: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "process_request_thread" not in stack:  # only the HTTP request threads
            continue
        frames = stack.split(";")
        k = int(count)
        total += k
        self_t[frames[-1]] = self_t.get(frames[-1], 0) + k
        for f in set(frames):
            incl[f] = incl.get(f, 0) + k
    if not total:
        return {}

    def top(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(f, c / total) for f, c in sorted(d.items(), key=lambda x: -x[1])[:n]]

    skip = ("process_request_thread", "finish_request", "__init__ (socketserver", "handle (", "<module>")
    inclusive = {f: c for f, c in incl.items() if not any(s in f for s in skip) and c < total}
    return {"self": top(self_t), "inclusive": top(inclusive)}
