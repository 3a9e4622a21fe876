"""`ctr ab`: the live A/B readout of the champion and the challenger, from MLflow.

The trainer daemon aggregates the joined examples per served ``model_version``
(:mod:`trainers.ab_readout`) and logs each version's readout on it every block
(:mod:`trainers.ab_publish`); this command reads the versions the ``champion`` and ``challenger``
aliases point at (and any ``--version``), prints CTR, AUC, NE and calibration with their 95%
intervals and, when both arms have a readout, challenger minus champion with a verdict.

Exit codes: 0 shown; 1 no readout for any version shown yet; 2 no MLflow server configured, or it
does not answer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from pipeline.core.config import Config

__all__ = ["add_arguments", "collect", "render", "run"]


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("ab", help="live A/B readout per served version: CTR, AUC, NE, calibration, CIs")
    a.add_argument("--version", action="append", default=[], help="also show this version (repeatable)")
    a.add_argument("--json", action="store_true", help="machine-readable output")


def collect(cfg: Config, versions: list[str]) -> dict[str, Any]:
    """Arms (alias or ``version``, the version, its readout) and the comparison, as plain data."""
    from trainers.ab_publish import read
    from trainers.ab_readout import compare
    from trainers.model_registry import ModelRegistry

    store = ModelRegistry(cfg.registry)
    arms = []
    for alias in (cfg.registry.champion_alias, cfg.serving.challenger_alias):
        version = store.resolve(alias)
        if version is not None:
            arms.append({"arm": alias, "version": version, "readout": read(store, version)})
    for version in versions:
        arms.append({"arm": "version", "version": version, "readout": read(store, version)})
    by_arm = {a["arm"]: a["readout"] for a in arms if a["readout"]}
    champion, challenger = by_arm.get(cfg.registry.champion_alias), by_arm.get(cfg.serving.challenger_alias)
    both = champion is not None and challenger is not None and arms[0]["version"] != arms[1]["version"]
    return {
        "model": store.name,
        "tracking_uri": store.tracking_uri,
        "arms": arms,
        "challenger_vs_champion": compare(champion, challenger) if both else None,  # type: ignore[arg-type]
    }


def _ci(s: dict[str, float], key: str, scale: float = 1.0, spec: str = ".3f") -> str:
    if math.isnan(s.get(key, math.nan)):
        return "-"
    lo, hi = s.get(f"{key}_lo", math.nan), s.get(f"{key}_hi", math.nan)
    return f"{scale * s[key]:{spec}} [{scale * lo:{spec}}, {scale * hi:{spec}}]"


def render(d: dict[str, Any]) -> str:
    """The readout as a table, then the comparison and what is missing."""
    lines = [f"model {d['model']} at {d['tracking_uri']}: online readout per served version (95% CIs)"]
    head = ("arm", "version", "examples", "clicks", "CTR %", "AUC", "NE", "calibration")
    rows = [head]
    notes = []
    for a in d["arms"]:
        s = a["readout"]
        if not s:
            notes.append(f"{a['arm']} v{a['version']}: no readout yet (no joined example named it)")
            continue
        rows.append(
            (
                a["arm"],
                a["version"],
                f"{s['examples']:,.0f}",
                f"{s['clicks']:,.0f}",
                _ci(s, "ctr", 100, ".2f"),
                _ci(s, "auc"),
                _ci(s, "ne"),
                _ci(s, "calibration", spec=".2f"),
            )
        )
        if not s.get("scored"):
            notes.append(
                f"{a['arm']} v{a['version']}: CTR only, its impressions carried no served score "
                "(replicas must log `score` on each impression for AUC, NE and calibration)"
            )
        elif not math.isnan(s.get("auc_bin_error", math.nan)):
            notes.append(f"{a['arm']} v{a['version']}: AUC within {s['auc_bin_error']:.4f} of exact (binned)")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    cmp = d["challenger_vs_champion"]
    if cmp is not None:
        parts = []
        for key, scale, unit in (("ctr", 100, " pp"), ("auc", 1, ""), ("ne", 1, "")):
            diff, lo, hi = cmp["diff"][key]
            if math.isnan(diff):
                parts.append(f"{key.upper()} undefined")
                continue
            parts.append(
                f"{key.upper()} {scale * diff:+.3f}{unit} [{scale * lo:+.3f}, {scale * hi:+.3f}]: "
                f"{cmp['verdict'][key]}"
            )
        lines.append("challenger - champion: " + "; ".join(parts))
    elif len(rows) < 3:
        notes.append("no comparison: the champion and the challenger need a readout each")
    return "\n".join(lines + notes)


def run(cfg: Config, args: argparse.Namespace) -> int:
    if not cfg.registry.tracking_uri:
        print(
            "ctr ab: set CTR_REGISTRY_TRACKING_URI (e.g. http://127.0.0.1:15000, or "
            "sqlite:///runs/demo/mlflow.db)",
            file=sys.stderr,
        )
        return 2
    d = collect(cfg, args.version)
    print(json.dumps(d, indent=2) if args.json else render(d))
    return 0 if any(a["readout"] for a in d["arms"]) else 1
