"""``ctr status``'s screen: the human view of :func:`pipeline.ops.status.collect`'s dict."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["render"]


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render(s: dict[str, Any]) -> str:
    """The human view of :func:`collect`'s dict."""
    lines = [f"ctr status at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s['at']))}", "", "services"]
    for name, svc in s["services"].items():
        state = "up" if svc["up"] else "DOWN"
        lines.append(f"  {name:<8} {state:<5} {svc['url']}  {svc.get('error', svc.get('note', ''))}".rstrip())
    lines += ["", "consumer lag (committed offsets)"]
    consumers = s["consumers"]
    if "error" in consumers:
        lines.append(f"  unavailable: {consumers['error']}")
    else:
        for name, c in consumers.items():
            total = "nothing committed yet" if c["total"] < 0 else f"{c['total']:,}"
            parts = ", ".join(
                f"{tp.rsplit(':', 1)[1] if ':' in tp else tp}={n:,}" for tp, n in c["lag"].items()
            )
            lines.append(f"  {name:<8} {total:<22} {parts}  (group {c['group']})")
    lines += ["", "daemons"]
    for name, d in s["daemons"].items():
        if d["up"] is None:
            lines.append(f"  {name:<8} -     {d['note']}")
        elif not d["up"]:
            lines.append(f"  {name:<8} DOWN  {d['url']}  {d['error']}")
        elif name == "joiner":
            lines.append(
                f"  joiner   up    {_fmt(d.get('events_per_second'), ',.0f')} events/s in, "
                f"{_fmt(d.get('examples_per_second'), ',.0f')} examples/s out, join rate "
                f"{_fmt(d.get('join_rate'), '.3f')}, {_fmt(d.get('events_total'), ',.0f')} events, "
                f"{d['dead_letters']:,.0f} dead letters"
            )
            if d.get("clicks"):
                lines.append(
                    "           clicks: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(d["clicks"].items()))
                )
        else:
            lines.append(
                f"  trainer  up    {_fmt(d.get('examples_per_second'), ',.0f')} examples/s (last block), "
                f"{_fmt(d.get('examples_total'), ',.0f')} examples, progressive AUC "
                f"{_fmt(d.get('progressive_auc'), '.4f')}"
            )
    models = s["models"]
    lines += ["", "models"]
    if "error" in models:
        lines.append(f"  unavailable: {models['error']}")
    else:
        lines.append(
            f"  {models['name']}: champion {_fmt(models['champion'])}, challenger "
            f"{_fmt(models['challenger'])}, {models['versions']} versions"
        )
        lines.append(
            f"  {'version':>7} {'block':>5} {'examples':>9} {'online AUC':>10} {'logloss':>8}"
            f" {'model w':>7}  gate"
        )
        for b in models["last_blocks"]:
            lines.append(
                f"  {b['version']:>7} {_fmt(b['block'], '.0f'):>5} {_fmt(b['examples'], ',.0f'):>9} "
                f"{_fmt(b['online_auc'], '.4f'):>10} {_fmt(b['online_logloss'], '.4f'):>8} "
                f"{_fmt(b.get('model_weight'), '.3f'):>7}  {b['gate']}"
            )
    lines += ["", "replicas"]
    if not s["replicas"]:
        lines.append("  none configured: set daemon.replica_urls (CTR_DAEMON_REPLICA_URLS) or pass --replica")
    for r in s["replicas"]:
        if r["up"]:
            fresh = _fmt(r["freshness_s"], ".1f")
            ab = f", challenger {r['challenger']}" if r.get("challenger") else ""
            lines.append(f"  {r['url']:<28} version {_fmt(r['version']):<6} freshness {fresh} s{ab}")
        else:
            lines.append(f"  {r['url']:<28} DOWN  {r['error']}")
    return "\n".join(lines)
