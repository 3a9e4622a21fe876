"""What serving reads against what training attached: online rows with and without refreshes.

The simulator's stream is fed to the streaming counters as the joiner feeds them (each impression
looked up, then recorded; each click recorded at its time), and every ``--push-every-s`` seconds
of event time the changed rows are drained into a store that keeps, per entity, the row with the
newest stamp (what Feast's Redis store keeps). Before each impression, the rows stored for its
user and its item are compared with the lookup the joiner attaches to it: what a replica scoring
that impression then would read against what the model is trained on.

Two runs over the same stream:

- **refresh** (the pipeline): rows drained at the writer's clock, the newest event time, and the
  entities whose windows lost an event since their last row refreshed (``drain_dirty(at_ms)``);
- **reference**: rows as of each entity's newest event (``drain_dirty()``), the pipeline before.

Per run: the share of impressions of a known user (item) whose stored row differs from the
lookup, the mean absolute difference of the 1 h and 24 h impression counts, the rows pushed, and
the run time. An impression between two pushes sees the row of the last one, in both runs, so
the events of that period are missing from it (the push period's freshness, not the refresh's
concern); ``--push-every-s 0`` pushes before every impression, as of its time (or of the newest
event before it, if that is later: the simulator delivers a few impressions after a later click),
which leaves only what time did to the rows. With refreshes, the only rows that then differ are
those of impressions that came in behind the clock (a few in 100,000).

    python benchmarks/row_refresh.py [--impressions 1000000] [--events-per-s 5] [--push-every-s 5]

Prints a table and writes ``benchmarks/results/row-refresh.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from features.aggregations import FeatureRow, StreamingFeatures
from pipeline.core.config import Config
from pipeline.sources.simulator import Simulator

RESULTS = Path(__file__).parent / "results"


def run(args: argparse.Namespace, refresh: bool) -> dict[str, Any]:
    """One pass over the stream; see the module docstring."""
    cfg = Config()
    cfg.simulator.events_per_s = args.events_per_s
    sf = StreamingFeatures(cfg.features)
    names = {"user": sf.user_names, "item": sf.item_names}
    stored: dict[str, dict[str, FeatureRow]] = {"user": {}, "item": {}}
    known = {"user": 0, "item": 0}
    differ = {"user": 0, "item": 0}
    abs_diff = {f"{e}_{w}": 0.0 for e in ("user", "item") for w in ("1h", "24h")}
    item_of: dict[str, str] = {}
    pushed, drains, next_push, newest = 0, 0, 0, 0
    started = time.perf_counter()
    for kind, ev in Simulator(cfg.simulator, args.seed).stream(args.impressions):
        ts = ev["ts"]
        if ts >= next_push or (not args.push_every_s and kind == "impression"):
            clock = max(ts, newest) if not args.push_every_s else newest  # 0: up to this impression
            users, items = sf.drain_dirty(clock) if refresh else sf.drain_dirty()
            for entity, rows in (("user", users), ("item", items)):
                for row in rows:
                    stored[entity][row[f"{entity}_id"]] = row
            pushed += len(users) + len(items)
            drains += 1
            period = max(args.push_every_s, 1) * 1000
            next_push = ts - ts % period + period
        newest = max(newest, ts)
        if kind == "impression":
            user, item = ev["user_id"], ev["item_id"]
            item_of[ev["impression_id"]] = item
            looked = sf.lookup(user, item, ts)
            for entity, ident in (("user", user), ("item", item)):
                row = stored[entity].get(ident)
                if row is None:
                    continue
                known[entity] += 1
                if any(float(row[n]) != looked[n] for n in names[entity]):
                    differ[entity] += 1
                for w in ("1h", "24h"):
                    abs_diff[f"{entity}_{w}"] += abs(
                        row[f"{entity}_impressions_{w}"] - looked[f"{entity}_impressions_{w}"]
                    )
            sf.record_impression(user, item, ts)
        elif kind == "click" and ev["impression_id"] in item_of:
            sf.record_click(ev["user_id"], item_of[ev["impression_id"]], ts)
    return {
        "refresh": refresh,
        "seconds": round(time.perf_counter() - started, 2),
        "event_hours": round((newest - cfg.simulator.start_ms) / 3_600_000, 1),
        "drains": drains,
        "rows_pushed": pushed,
        **{f"{e}_impressions_known": known[e] for e in known},
        **{f"{e}_share_differing": differ[e] / max(known[e], 1) for e in known},
        **{f"mean_abs_diff_{k}": v / max(known[k.split("_")[0]], 1) for k, v in abs_diff.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impressions", type=int, default=1_000_000)
    ap.add_argument("--events-per-s", type=float, default=5.0, help="simulated impressions per second")
    ap.add_argument(
        "--push-every-s", type=int, default=5, help="event-time seconds between pushes (0: every impression)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS / "row-refresh.json")
    args = ap.parse_args(argv)
    runs = {}
    for name, refresh in (("refresh", True), ("reference", False)):
        print(f"{name} ...", file=sys.stderr, flush=True)
        runs[name] = run(args, refresh)
    print(f"{'':<32} {'refresh':>12} {'reference':>12}")
    for key in runs["refresh"]:
        a, b = runs["refresh"][key], runs["reference"][key]
        if isinstance(a, float):
            print(f"{key:<32} {a:>12.4f} {b:>12.4f}")
        elif not isinstance(a, bool):
            print(f"{key:<32} {a:>12,} {b:>12,}")
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **runs,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
