"""`ctr rollback` / `ctr versions` on an embedded MLflow (sqlite): refusals, tags, the listing.

The versions here are registry entries without artifacts (a rollback never loads a model); the
end-to-end tests with real versions and replicas are in tests/integration/test_rollback.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pipeline.core.config import RegistryConfig
from pipeline.ops.cli import main as ctr_main
from serving_bridge.rollback import RollbackError, rollback
from serving_bridge.versions_view import format_table, model_rollback_tags, version_rows
from trainers.registry import MlflowModelStore


@pytest.fixture(scope="module")
def registry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sqlite registry per module (creating one runs MLflow's migrations: seconds)."""
    return tmp_path_factory.mktemp("registry")


@pytest.fixture
def store(registry_dir: Path) -> MlflowModelStore:
    """A fresh model with versions 1..3, champion -> 3."""
    s = MlflowModelStore.embedded(RegistryConfig(model_name=f"m-{uuid.uuid4().hex[:10]}"), registry_dir)
    s.client.create_registered_model(s.name)
    for i in range(3):
        s.client.create_model_version(s.name, source=f"s3://nowhere/v{i}", tags={"block": str(i + 1)})
    s.set_alias("champion", "3")
    return s


def test_rollback_refuses_unknown_versions_empty_reasons_and_no_ops(store: MlflowModelStore) -> None:
    with pytest.raises(RollbackError, match=r"has no version '7'; its versions are 1, 2, 3"):
        rollback(store, "7", "why not")
    with pytest.raises(RollbackError, match="needs a reason"):
        rollback(store, "1", " ")
    with pytest.raises(RollbackError, match="already points at version 3"):
        rollback(store, "3", "again")
    assert store.resolve("champion") == "3" and "rollback.by" not in store.lineage("1")
    assert model_rollback_tags(store) == {}


def test_rollback_moves_the_alias_and_records_who_when_why(store: MlflowModelStore) -> None:
    record = rollback(store, " 1 ", "v3 overpredicts", by="alice")
    assert store.resolve("champion") == "1" and record.previous == "3" and not record.announced
    tags = store.lineage("1")
    assert {k: v for k, v in tags.items() if k.startswith("rollback.")} == record.tags()
    assert (
        tags["rollback.by"] == "alice" and tags["rollback.from"] == "3" and tags["rollback.at"].endswith("Z")
    )
    assert model_rollback_tags(store) == {
        "last_rollback.by": "alice",
        "last_rollback.at": record.at,
        "last_rollback.reason": "v3 overpredicts",
        "last_rollback.from": "3",
        "last_rollback.to": "1",
    }
    rows = version_rows(store)
    assert [(r["version"], r["aliases"], r["block"]) for r in rows] == [
        ("3", "", "3"),
        ("2", "", "2"),
        ("1", "champion", "1"),
    ]
    assert rows[2]["rollback_reason"] == "v3 overpredicts" and rows[0]["rollback_reason"] is None
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["version", "aliases", "created"] and table[3].split()[:2] == [
        "1",
        "champion",
    ]


def test_the_commands_exit_codes_and_messages(
    store: MlflowModelStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CTR_REGISTRY_TRACKING_URI", raising=False)
    assert ctr_main(["rollback", "--to", "1", "--reason", "x"]) == 2
    assert "CTR_REGISTRY_TRACKING_URI" in capsys.readouterr().err
    monkeypatch.setenv("CTR_REGISTRY_TRACKING_URI", store.tracking_uri)
    monkeypatch.setenv("CTR_REGISTRY_MODEL_NAME", store.name)
    monkeypatch.setenv("CTR_DAEMON_REDIS_URL", "")  # no push: nothing listens here
    assert ctr_main(["rollback", "--to", "12", "--reason", "x"]) == 1
    assert f"ctr rollback: model '{store.name}' has no version '12'" in capsys.readouterr().err
    assert ctr_main(["rollback", "--to", "2"]) == 1
    assert "--reason TEXT are required" in capsys.readouterr().err
    assert ctr_main(["rollback", "--to", "2", "--reason", "drift", "--by", "bob"]) == 0
    assert "version 3 -> 2 by bob" in capsys.readouterr().out and store.resolve("champion") == "2"
    assert ctr_main(["rollback", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "last_rollback.reason: drift" in listing and "champion" in listing
