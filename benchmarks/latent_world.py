"""A stream from a generator unlike the project's, to check the default learner on a world it never saw.

The suite's worlds (``benchmarks/quality.py``) come from four generators written here; the defaults
were chosen on them. This one was written on 2026-12-07, after every default, on a mechanism none
of them has: the click logit is a **latent-factor affinity** between user and item (a dot product
of 6-dimensional vectors), plus

- user and item biases; users Zipf(0.9)-active over 40,000 (one impression in seven from a uniform
  user), items launched over the stream (a quarter before it starts), the newest ~800 live and the
  younger the more shown (cold start all along);
- a device x category interaction, a slot (position) effect, a U-shaped price effect (``-0.5
  log(price)^2``), a high-cardinality ``page`` field (Zipf over 20,000, five pages with an effect);
- daily seasonality (a sine over the hour) over 48 hours;
- click delays log-normal around 30 s with sigma 1.5, so some land past the attribution window.

It writes JSONL in ``ctr simulate``'s format; ``ctr backtest`` reads it as an outside user's log.

    python benchmarks/latent_world.py --seed 11 --impressions 300000 --out /tmp/latent.jsonl
    ctr backtest --source /tmp/latent.jsonl --train-every 50000 --out /tmp/bt
    python benchmarks/latent_world.py --seed 12 --impressions 300000 --base -5.6 --out /tmp/low.jsonl
    ctr backtest --source /tmp/low.jsonl --out /tmp/bt-low

Measured on 2026-12-07 (commit ce2fde7's learner, default config; progressive metrics over blocks 2+):

- seed 11, 3.4 % CTR, blocks of 50,000: default AUC **0.7245 vs FTRL 0.6900** (+0.0345, 95 % CI
  +0.0306..+0.0383), NE 0.923 vs 0.948, calibration 1.007 vs 1.117; static 0.6850;
- seed 12, ``--base -5.6`` (0.6 % CTR, 1,800 clicks), the default blocks of 100,000: default
  **0.6908 vs FTRL 0.6425** (+0.0482, CI +0.0340..+0.0610), NE 0.962 vs 0.989, calibration 0.985
  vs 1.359.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

__all__ = ["write"]

START_MS = 1_767_225_600_000  # 2026-01-01
SPAN_MS = 48 * 3_600_000
USERS, ITEMS, DIM, LIVE = 40_000, 3_000, 6, 800
DEVICES = ("mobile", "desktop", "tablet")


def write(path: Path, seed: int, impressions: int, base: float = -3.6) -> tuple[int, int]:
    """Write the stream (impressions and their clicks in arrival order); ``(impressions, clicks)``."""
    rng = np.random.default_rng(seed)
    user_vec, item_vec = rng.normal(0, 1, (USERS, DIM)), rng.normal(0, 1, (ITEMS, DIM))
    user_bias, item_bias = rng.normal(0, 0.5, USERS), rng.normal(0, 0.7, ITEMS)
    launch = np.sort(rng.uniform(-0.5, 1.0, ITEMS))  # share of the stream at which each item appears
    activity = 1 / np.arange(1, USERS + 1) ** 0.9
    activity /= activity.sum()
    users = rng.permutation(USERS)
    device_category = rng.normal(0, 0.6, (len(DEVICES), 12))
    slot_effect = np.array([0.0, -0.4, -0.8, -1.2])
    times = np.sort(rng.uniform(0, SPAN_MS, impressions)).astype(np.int64) + START_MS
    events: list[tuple[int, int, dict[str, object]]] = []
    clicks = 0
    for k in range(impressions):
        t = int(times[k])
        live = int(np.searchsorted(launch, (t - START_MS) / SPAN_MS))  # items launched so far
        lo = max(0, live - LIVE)
        age = np.arange(live - lo)[::-1]
        weight = 1 / (1 + age / 100.0) ** 1.2
        item = lo + int(rng.choice(live - lo, p=weight / weight.sum())) if live > lo else 0
        user = int(users[rng.choice(USERS, p=activity)]) if k % 7 else int(rng.integers(USERS))
        device, category, slot = int(rng.integers(3)), item % 12, int(rng.integers(4))
        price, page = float(rng.lognormal(0, 0.6)), int(rng.zipf(1.3)) % 20_000
        hour = (t - START_MS) // 3_600_000 % 24
        logit = (
            base
            + user_bias[user]
            + item_bias[item]
            + 0.45 * float(user_vec[user] @ item_vec[item])
            + device_category[device, category]
            + slot_effect[slot]
            - 0.5 * math.log(price) ** 2
            + 0.35 * math.sin(2 * math.pi * hour / 24)
            + (0.3 if page < 5 else 0.0)
        )
        impression = {
            "type": "impression",
            "impression_id": f"imp-{k}",
            "ts": t,
            "user_id": f"u{user}",
            "item_id": f"it{item}",
            "features": {
                "device": DEVICES[device],
                "category": f"c{category}",
                "slot": str(slot),
                "hour": f"{hour:02d}",
                "page": f"p{page}",
            },
            "dense": {"price": round(price, 4)},
        }
        events.append((t, 0, impression))
        if rng.random() < 1 / (1 + math.exp(-logit)):
            at = t + int(rng.lognormal(math.log(30_000), 1.5))
            click = {
                "type": "click",
                "click_id": f"c-{k}",
                "impression_id": f"imp-{k}",
                "ts": at,
                "user_id": f"u{user}",
            }
            events.append((at, 1, click))
            clicks += 1
    events.sort(key=lambda e: (e[0], e[1]))
    with path.open("w") as f:
        for _, _, event in events:
            f.write(json.dumps(event) + "\n")
    return impressions, clicks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--impressions", type=int, default=300_000)
    ap.add_argument("--base", type=float, default=-3.6, help="the logit's intercept (-3.6: ~3.4%% CTR)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    n, clicks = write(args.out, args.seed, args.impressions, args.base)
    print(f"wrote {args.out}: {n:,} impressions, {clicks:,} clicks ({clicks / n:.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
