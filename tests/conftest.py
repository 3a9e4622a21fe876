"""Shared fixtures. Integration fixtures (real Kafka, Redis, MLflow server) live in tests/integration."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("FEAST_USAGE", "False")


# -- the fault report (`make faults`) -------------------------------------------------------------
# Fault tests record one row per fault: what was injected, how many trials, how many recovered, and
# what was lost or duplicated (as they measured it). The rows are printed as a table at the end of
# the session and saved to runs/faults.json.
_FAULT_ROWS: list[dict[str, object]] = []


@pytest.fixture
def fault_report() -> Callable[..., None]:
    def record(fault: str, trials: int, recovered: int, lost: int, duplicated: int, note: str = "") -> None:
        _FAULT_ROWS.append(
            {"fault": fault, "trials": trials, "recovered": recovered, "lost": lost, "duplicated": duplicated}
            | ({"note": note} if note else {})
        )

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FAULT_ROWS:
        return
    tr = terminalreporter
    tr.section("fault report")
    columns = (("fault", "<52"), ("trials", ">6"), ("recovered", ">9"), ("lost", ">6"), ("duplicated", ">10"))
    tr.write_line(" ".join(format(name, spec) for name, spec in columns))
    for r in _FAULT_ROWS:
        tr.write_line(" ".join(format(str(r[name]), spec) for name, spec in columns))
    out = Path("runs") / "faults.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_FAULT_ROWS, indent=2))
    tr.write_line(f"saved to {out}")
