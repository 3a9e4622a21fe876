"""Open-loop load and profiling helpers of ``benchmarks/serving.py``.

- :func:`open_loop`: request *k* is due at ``t0 + k / rate``; latency runs from that due time, so a
  stall shows in the tail instead of slowing the load (no coordinated omission). The load comes
  from vegeta (``deploy/vegeta.sh`` installs it) when it is there: a Go client sends and times the
  requests, so the Python client's own GIL waits (its threads, the alias flips of the swap phase in
  the same process) do not count as server latency. Without it, Python threads send them
  (:func:`open_loop_python`), and the results say which client measured;
- :func:`start_py_spy` / :func:`top_costs`: sample a process with py-spy and summarize the request
  threads' self and inclusive costs.
"""

from __future__ import annotations

import argparse
import base64
import csv
import http.client
import io
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["load_client", "open_loop", "open_loop_python", "percentiles", "start_py_spy", "top_costs"]

VEGETA_HOME = Path.home() / ".cache" / "ctr-online" / "bin" / "vegeta"  # where deploy/vegeta.sh puts it


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


def vegeta() -> str | None:
    """The vegeta binary: ``$CTR_VEGETA``, the one deploy/vegeta.sh installed, or on the PATH."""
    for candidate in (os.environ.get("CTR_VEGETA"), str(VEGETA_HOME), shutil.which("vegeta")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def load_client() -> str:
    """Which client :func:`open_loop` uses (recorded with the results)."""
    return "vegeta" if vegeta() else "python-threads"


def open_loop(
    port: int, bodies: list[bytes], rate: float, seconds: float, threads: int
) -> tuple[list[float], int, float, dict[str, int]]:
    """Send ``rate * seconds`` requests due at fixed times over ``threads`` keep-alive connections;
    (latencies ms from each request's due time, errors, achieved qps, answers per version)."""
    binary = vegeta()
    if binary is None:
        return open_loop_python(port, bodies, rate, seconds, threads)
    return open_loop_vegeta(binary, port, bodies, rate, seconds, threads)


def open_loop_vegeta(
    binary: str, port: int, bodies: list[bytes], rate: float, seconds: float, connections: int
) -> tuple[list[float], int, float, dict[str, int]]:
    """:func:`open_loop` by ``vegeta attack``: ``connections`` connections and as many workers, so a
    request due while all are busy waits for one; its latency still counts from its due time
    (``seq / rate`` after the first), as :func:`open_loop_python` counts it."""
    url = f"http://127.0.0.1:{port}/score"
    header = {"Content-Type": ["application/json"]}
    with tempfile.TemporaryDirectory(prefix="ctr-vegeta-") as tmp:
        targets = Path(tmp) / "targets.jsonl"
        lines = [
            json.dumps({"method": "POST", "url": url, "header": header, "body": base64.b64encode(b).decode()})
            for b in bodies
        ]
        targets.write_text("\n".join(lines) + "\n")
        n = str(connections)
        attack = [binary, "attack", "-format=json", f"-targets={targets}", f"-rate={rate:g}/s"]
        attack += [f"-duration={seconds:g}s", "-connections", n, "-max-connections", n, "-workers", n]
        results = Path(tmp) / "results.bin"
        attack += ["-max-workers", n, "-timeout=30s", "-keepalive=true", f"-output={results}"]
        subprocess.run(attack, check=True, stdout=subprocess.DEVNULL)
        encoded = subprocess.run(
            [binary, "encode", "--to", "csv", str(results)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    # columns: unix ns sent, status, latency ns, bytes out, bytes in, error, base64 body, name, seq
    rows = sorted(csv.reader(io.StringIO(encoded)), key=lambda row: int(row[8]))
    if not rows:
        return [], 0, 0.0, {}
    # request k was due at t0 + k / rate; vegeta's own start is not in its results, so t0 is the
    # latest start every send agrees with (a send can be late, never early)
    t0 = min(int(row[0]) - int(row[8]) * 1e9 / rate for row in rows)
    latencies: list[float] = []
    versions: dict[str, int] = {}
    errors, first, last = 0, int(rows[0][0]), int(rows[0][0])
    for sent, code, latency, _, _, error, body, _, seq, *_ in rows:
        done = int(sent) + int(latency)
        last = max(last, done)
        if code != "200" or error:
            errors += 1
            continue
        latencies.append((done - t0 - int(seq) * 1e9 / rate) / 1e6)
        version = json.loads(base64.b64decode(body))["version"]
        versions[version] = versions.get(version, 0) + 1
    return latencies, errors, len(rows) / max((last - first) / 1e9, 1e-9), versions


def open_loop_python(
    port: int, bodies: list[bytes], rate: float, seconds: float, threads: int
) -> tuple[list[float], int, float, dict[str, int]]:
    """:func:`open_loop` by ``threads`` Python client threads (no vegeta installed)."""
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
    """Sample the replica and its worker processes for one phase (collapsed stacks; idle threads
    left out)."""
    cmd = [args.py_spy, "record", "--pid", str(pid), "--duration", str(int(args.seconds))]
    cmd += [
        "--rate",
        "250",
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
        "--threads",
        "--subprocesses",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out.with_suffix(".log").open("wb"))
    time.sleep(1.0)  # attached before the load starts
    return proc


def top_costs(collapsed: Path, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Shares of the replica's samples from py-spy's collapsed stacks (``--threads``): per thread
    (``threads``), and the functions where the time is spent (``self``) or below (``inclusive``)."""
    if not collapsed.is_file():
        return {}
    self_t: dict[str, int] = {}
    incl: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        k = int(count)
        total += k
        threads[frames[0]] = threads.get(frames[0], 0) + k
        self_t[frames[-1]] = self_t.get(frames[-1], 0) + k
        for f in set(frames[1:]):
            incl[f] = incl.get(f, 0) + k
    if not total:
        return {}

    def top(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(f, c / total) for f, c in sorted(d.items(), key=lambda x: -x[1])[:n]]

    skip = ("<module>", "run (threading", "_bootstrap", "run_forever", "run_until_complete")
    inclusive = {f: c for f, c in incl.items() if not any(s in f for s in skip) and c < total}
    return {"threads": top(threads), "self": top(self_t), "inclusive": top(inclusive)}
