"""benchmarks/row_refresh.py runs end to end: pushed before every impression, refreshed rows are
what training attaches, and rows as of each entity's last event are not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.row_refresh import main


def test_row_refresh_benchmark_measures_both_ways_of_pushing(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    # 0.5 impressions a second: 4,000 impressions span 2.2 hours, so windows lose events
    args = ["--impressions", "4000", "--events-per-s", "0.5", "--push-every-s", "0", "--out", str(out)]
    assert main(args) == 0
    got = json.loads(out.read_text())
    refresh, reference = got["refresh"], got["reference"]
    assert refresh["user_impressions_known"] == reference["user_impressions_known"] > 1_000
    assert refresh["user_share_differing"] < 0.001 and reference["user_share_differing"] > 0.05
    assert refresh["item_share_differing"] < 0.001 and reference["item_share_differing"] > 0.05
    assert refresh["rows_pushed"] > reference["rows_pushed"]
