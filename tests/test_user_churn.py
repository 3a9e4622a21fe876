"""benchmarks/user_churn.py runs end to end and finds the examples of both runs identical."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.user_churn import main


def test_user_churn_runs_and_compares_the_examples(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    assert main(["--days", "2", "--new-users", "300", "--regulars", "30", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["examples_identical"]
    forgetting, reference = got["runs"]["forgetting"], got["runs"]["reference"]
    assert forgetting["forget_idle_s"] == 15 * 86_400 and reference["forget_idle_s"] == 0
    assert [d["users_held"] for d in forgetting["days"]] == [d["users_held"] for d in reference["days"]]
    assert 300 < forgetting["days"][-1]["users_held"] <= 2 * 300 + 30  # nobody is 15 days idle yet
