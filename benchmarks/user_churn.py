"""The joiner's state over weeks of a stream whose users come and go: forgetting on and off.

A partition task (the joiner daemon's unit: joiner + user counters, changes tracked for the
changelog) is fed a synthetic stream of ``--days`` days: ``--new-users`` users a day who are never
seen again after their day (``--per-user`` impressions each) and ``--regulars`` users active every
day; 5 % of impressions clicked within 10 minutes. Every hour of event time it checkpoints as the
daemon does (examples drained, feature rows drained, :func:`pipeline.join.task_records.changes`
applied to an in-memory compacted changelog: the latest value of every key, tombstones removed).

Two runs, each in a child process of its own so that its peak memory is its own:

- **forgetting**: the default ``features.forget_idle_s`` (15 days);
- **reference**: ``forget_idle_s = 0``, the joiner before forgetting: every user ever seen is kept.

Per day: users held, the child's resident memory (``VmRSS``; the changelog is kept in SQLite on
disk, so that is the task's), keys and bytes of the compacted changelog (what a restore reads),
records written by that day's checkpoints; at the end the time to rebuild the task from the
changelog (what a moved task does, Kafka's read aside) and the run time.
The two runs' examples are compared (their SHA-256): forgetting must change none.

    python benchmarks/user_churn.py [--days 40] [--new-users 10000] [--per-user 4] [--regulars 1000]

Prints a table and writes ``benchmarks/results/user-churn.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.joiner_state import restored_in
from pipeline.core.config import Config
from pipeline.core.events import Click, Impression
from pipeline.join.partition_task import PartitionTask
from pipeline.join.task_records import changes, track

RESULTS = Path(__file__).parent / "results"
T0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
HOUR = 3_600_000


def hour_of_events(args: argparse.Namespace, day: int, hour: int) -> tuple[list[Impression], list[Click]]:
    """One hour of the stream: its impressions in time order, and their clicks (by click time)."""
    rng = random.Random(day * 24 + hour)
    n = (args.new_users * args.per_user + args.regulars * args.per_user) // 24
    start = T0 + day * 24 * HOUR + hour * HOUR
    times = sorted(start + rng.randrange(HOUR) for _ in range(n))
    imps, clicks = [], []
    share_new = args.new_users / (args.new_users + args.regulars)
    for k, ts in enumerate(times):
        user = (
            f"d{day}-{rng.randrange(args.new_users)}"
            if rng.random() < share_new
            else f"r{rng.randrange(args.regulars)}"
        )
        iid = f"{day}-{hour}-{k}"
        imps.append(Impression(iid, ts, user, f"ad{rng.randrange(2_000)}", {"s": "x"}))
        if rng.random() < 0.05:
            clicks.append(Click(f"c{iid}", iid, ts + rng.randrange(1_000, 600_000), user))
    return imps, clicks


def run(args: argparse.Namespace, forget_idle_s: int) -> dict[str, Any]:
    cfg = Config()
    cfg.features.forget_idle_s = forget_idle_s
    task = PartitionTask(cfg, 0)
    track(task)
    # the compacted changelog (latest value per key), on disk: the child's memory is the task's
    folder = Path(tempfile.mkdtemp(prefix="churn-"))
    log = sqlite3.connect(folder / "changelog.db", isolation_level=None)
    log.execute("CREATE TABLE log (key BLOB PRIMARY KEY, value BLOB NOT NULL)")
    digest = hashlib.sha256()
    offsets = {"impression": 0, "click": 0}
    late_clicks: list[Click] = []  # clicks whose time falls in a later hour
    days: list[dict[str, Any]] = []
    started = time.monotonic()
    written = tombstones = 0

    def checkpoint() -> None:
        nonlocal written, tombstones
        for ex in task.drain():
            digest.update(ex.to_json())
        task.joiner.drain_rejected()
        task.user_rows()
        records = changes(task)
        written += len(records)
        deleted = [(key,) for key, value in records if value is None]
        tombstones += len(deleted)
        log.execute("BEGIN")
        log.executemany("DELETE FROM log WHERE key = ?", deleted)
        log.executemany("REPLACE INTO log VALUES (?, ?)", [r for r in records if r[1] is not None])
        log.execute("COMMIT")

    for day in range(args.days):
        for hour in range(24):
            imps, clicks = hour_of_events(args, day, hour)
            end = T0 + day * 24 * HOUR + (hour + 1) * HOUR
            late_clicks += clicks
            due = sorted((c for c in late_clicks if c.ts < end), key=lambda c: c.ts)
            late_clicks = [c for c in late_clicks if c.ts >= end]
            for kind, events in (("impression", imps), ("click", due)):
                for ev in events:
                    task.offer(kind, offsets[kind], ev)
                    offsets[kind] += 1
            task.run(now=0.0)  # never idle: the merge alone decides, as in a backlog
            checkpoint()
        days.append(
            {
                "day": day + 1,
                "users_held": task.features.users_held,
                "changelog_keys": log.execute("SELECT count(*) FROM log").fetchone()[0],
                "changelog_mb": log.execute("SELECT sum(length(key) + length(value)) FROM log").fetchone()[0]
                / 1e6,
                "rss_mb": _vm("VmRSS"),
                "records_written": written,
                "tombstones": tombstones,
                "seconds": time.monotonic() - started,
            }
        )
        written = tombstones = 0
        print(json.dumps(days[-1]), file=sys.stderr, flush=True)
    for click in sorted(late_clicks, key=lambda c: c.ts):  # past the last hour
        task.offer("click", offsets["click"], click)
        offsets["click"] += 1
    task.run(now=1e12)
    task.joiner.flush()
    checkpoint()
    seconds = time.monotonic() - started
    rss_mb = _vm("VmRSS")
    # a moved task: its state rebuilt from the compacted changelog, read whole as the daemon reads it
    restore_s = restored_in(dict(log.execute("SELECT key, value FROM log")), cfg)
    log.close()
    shutil.rmtree(folder)
    return {
        "forget_idle_s": forget_idle_s,
        "days": days,
        "examples_sha256": digest.hexdigest(),
        "users_forgotten": task.features.forgotten,
        "lookups_past_forget": task.features.past_forget,
        "seconds": seconds,
        "restore_s": restore_s,
        "rss_mb": rss_mb,  # at the end of the stream, before the restore
        "peak_rss_mb": _vm("VmHWM"),  # the restore's copy of the changelog included
    }


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=40)
    ap.add_argument("--new-users", type=int, default=10_000, help="users a day, never seen again")
    ap.add_argument("--per-user", type=int, default=4, help="impressions per user a day")
    ap.add_argument("--regulars", type=int, default=1_000, help="users active every day")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # forget_idle_s
    ap.add_argument("--out", type=Path, default=RESULTS / "user-churn.json")
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(run(args, args.child)))
        return 0
    settings = ["--days", str(args.days), "--new-users", str(args.new_users)]
    settings += ["--per-user", str(args.per_user), "--regulars", str(args.regulars)]
    runs = {}
    for name, forget in (("forgetting", Config().features.forget_idle_s), ("reference", 0)):
        print(f"{name} (forget_idle_s={forget}) ...", file=sys.stderr, flush=True)
        child = subprocess.run(
            [sys.executable, __file__, *settings, "--child", str(forget)],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        runs[name] = json.loads(child.stdout)
    f, r = runs["forgetting"], runs["reference"]
    print(f"\n{'day':>4} {'users held':>22} {'RSS MB':>14} {'changelog MB':>16} {'records written':>18}")
    pair = f"{'forget':>7} {'keep all':>8}"
    print(f"{'':>4} {'forget':>10} {'keep all':>11} {pair} {pair} {'forget':>8} {'keep all':>9}")
    for a, b in zip(f["days"], r["days"], strict=True):
        if a["day"] % 5 == 0 or a["day"] == 1:
            print(
                f"{a['day']:>4} {a['users_held']:>10,} {b['users_held']:>11,} {a['rss_mb']:>7.0f} "
                f"{b['rss_mb']:>8.0f} {a['changelog_mb']:>7.1f} {b['changelog_mb']:>8.1f} "
                f"{a['records_written']:>8,} {b['records_written']:>9,}"
            )
    same = f["examples_sha256"] == r["examples_sha256"]
    print(
        f"RSS at the end: {f['rss_mb']:,.0f} MB forgetting, {r['rss_mb']:,.0f} MB keeping all; "
        f"run {f['seconds']:.0f} s vs {r['seconds']:.0f} s; restore from the changelog "
        f"{f['restore_s']:.1f} s vs {r['restore_s']:.1f} s; examples identical: {same}"
    )
    out = {
        "meta": {
            "days": args.days,
            "new_users_per_day": args.new_users,
            "impressions_per_user": args.per_user,
            "regulars": args.regulars,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "examples_identical": same,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
