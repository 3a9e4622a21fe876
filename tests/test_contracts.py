"""Every in-process implementation through its contract check (:mod:`pipeline.checks`).

Inputs are tiny: a few hundred simulated events, or the first few hundred rows of the shared
dataset samples copied into ``tmp_path`` (read-only originals, never copied into the repo).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.checks import (
    ContractError,
    check_feature_reader,
    check_learner,
    check_model_store,
    check_source,
)
from pipeline.core.config import FeatureConfig, SimulatorConfig, TrainerConfig
from pipeline.daemons.idempotent_store import IdempotentStore
from pipeline.replay.backtest import LocalVersions
from pipeline.sources.avazu import AvazuCsvSource
from pipeline.sources.jsonl_mapping import JsonlMapping, write_jsonl
from pipeline.sources.parquet import ParquetSource, write_parquet
from pipeline.sources.readers import CriteoTsvSource, ObdCsvSource
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import JsonlSource, MergedJsonlSource, SimulatorSource
from tests.test_readers import criteo_rows
from tests.test_trainer_daemon import FakeDaemon
from trainers.encoding import Encoder
from trainers.ftrl import FtrlLearner
from trainers.learner import TorchLearner
from trainers.models import MODELS
from trainers.testing import InMemoryModelStore, tiny_learner

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
AVAZU = DATASETS / "avazu_first_hour" / "avazu_train_first_9999.csv"
OBD = DATASETS / "open_bandit_obd"
SIM = SimulatorConfig(duplicate_rate=0.01, early_click_rate=0.02)
SPLIT = SimulatorConfig(duplicate_rate=0.0, early_click_rate=0.0)  # each kind in ts order
Factory = Callable[[dict[str, Any] | None], Any]


def head(src: Path, dst: Path, lines: int) -> Path:
    """The first ``lines`` lines of ``src`` (header included) as ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open(encoding="utf-8") as f:
        dst.write_text("".join(line for _, line in zip(range(lines), f, strict=False)))
    return dst


def source_factory(kind: str, tmp: Path) -> Factory:
    rows = list(Simulator(SIM, 21).stream(600))
    if kind == "simulator":
        sim = Simulator(SIM, 20)
        return lambda r: SimulatorSource(sim, 400, batch_size=90, resume=r)
    if kind in ("jsonl", "jsonl-mapped"):
        paths = [tmp / "a.jsonl", tmp / "b.jsonl"]  # a resume crosses a file boundary
        write_jsonl(rows[:250], paths[0])
        write_jsonl(rows[250:], paths[1])
        if kind == "jsonl":
            return lambda r: JsonlSource(paths, batch_size=110, resume=r)
        mapping = JsonlMapping.parse(["user_id=uid", "impression=imp"])
        text = [p.read_text().replace('"user_id"', '"uid"').replace('"impression"', '"imp"') for p in paths]
        for p, t in zip(paths, text, strict=True):
            p.write_text(t)
        return lambda r: JsonlSource(paths, batch_size=110, resume=r, mapping=mapping)
    if kind == "jsonl-merged":
        split = list(Simulator(SPLIT, 23).stream(500))
        imps, clicks = tmp / "impressions.jsonl", tmp / "clicks.jsonl"
        write_jsonl([e for e in split if e[0] == "impression"], imps)
        write_jsonl([e for e in split if e[0] == "click"], clicks)
        return lambda r: MergedJsonlSource(
            [JsonlSource([imps], kind="impression"), JsonlSource([clicks], kind="click")],
            batch_size=90,
            resume=r,
        )
    if kind == "parquet":
        paths = [tmp / "a.parquet", tmp / "b.parquet"]
        write_parquet(rows[:250], paths[0])
        write_parquet(rows[250:], paths[1])
        return lambda r: ParquetSource(paths, batch_size=110, resume=r)
    if kind == "criteo":
        path = tmp / "day_0.txt"
        path.write_text("\n".join(criteo_rows(300)) + "\n")
        return lambda r: CriteoTsvSource([path], seed=1, batch_size=80, resume=r)
    if kind == "avazu":
        path = head(AVAZU, tmp / "avazu.csv", 301)
        return lambda r: AvazuCsvSource(path, batch_size=80, resume=r)
    if kind == "obd":
        for campaign in ("men", "women"):
            folder = OBD / "bts" / campaign
            head(folder / f"{campaign}.csv", tmp / "bts" / campaign / f"{campaign}.csv", 151)
            head(folder / "item_context.csv", tmp / "bts" / campaign / "item_context.csv", 10_000)
        return lambda r: ObdCsvSource(tmp / "bts", seed=1, batch_size=80, resume=r)
    raise ValueError(kind)


needs_avazu = pytest.mark.skipif(not AVAZU.is_file(), reason=f"{AVAZU} is absent")
needs_obd = pytest.mark.skipif(not OBD.is_dir(), reason=f"{OBD} is absent")


@pytest.mark.parametrize(
    "kind",
    [
        "simulator",
        "jsonl",
        "jsonl-mapped",
        "jsonl-merged",
        "parquet",
        "criteo",
        pytest.param("avazu", marks=needs_avazu),
        pytest.param("obd", marks=needs_obd),
    ],
)
def test_source_contract(kind: str, tmp_path: Path) -> None:
    check_source(source_factory(kind, tmp_path), name=kind)


def test_a_source_that_repeats_an_event_on_resume_fails_the_check(tmp_path: Path) -> None:
    make = source_factory("simulator", tmp_path)

    def off_by_one(resume: dict[str, Any] | None) -> Any:  # resumes at the last event, not the next
        return make(None if resume is None else {**resume, "offset": max(0, resume["offset"] - 1)})

    with pytest.raises(ContractError, match=r"breaks 'resume delivers exactly the rest'.*1 repeated"):
        check_source(off_by_one, name="off-by-one")


# -- model stores ----------------------------------------------------------------------------------
def idempotent_in_memory() -> IdempotentStore:
    inner = InMemoryModelStore()
    return IdempotentStore(inner, FakeDaemon(inner))  # type: ignore[arg-type]


def make_model(seed: int) -> TorchLearner:
    return tiny_learner(seed, n=200)


@pytest.mark.parametrize(
    "make_store,keeps_weights",
    [
        pytest.param(InMemoryModelStore, True, id="in-memory"),
        pytest.param(idempotent_in_memory, True, id="idempotent-in-memory"),
        pytest.param(LocalVersions, False, id="backtest-local-versions"),
    ],
)
def test_model_store_contract(make_store: Callable[[], Any], keeps_weights: bool) -> None:
    check_model_store(make_store(), make_model, keeps_weights=keeps_weights)


# -- learners --------------------------------------------------------------------------------------
def torch_learner(model: str) -> Callable[[Any, int], TorchLearner]:
    """A learner as the incremental trainer builds one (its encoder fitted on the first block)."""

    def make(train: Any, seed: int) -> TorchLearner:
        cfg = TrainerConfig(
            model=model,
            hash_buckets=1 << 10,
            embedding_dim=4,
            hidden=(8,),
            batch_size=64,
            device="cpu",
            seed=seed,
        )
        return TorchLearner(cfg, Encoder.for_trainer(cfg).fit(train))

    return make


def ftrl_learner(train: Any, seed: int) -> FtrlLearner:
    """The backtest's FTRL baseline (no seed: deterministic by construction), reading examples."""
    return FtrlLearner(1 << 10, batch_size=16, encoder=Encoder(1 << 10).fit(train))


@pytest.mark.parametrize(
    "make",
    [
        *(pytest.param(torch_learner(m), id=f"torch-{m}") for m in sorted(MODELS)),
        pytest.param(ftrl_learner, id="ftrl"),
    ],
)
def test_learner_contract(make: Callable[[Any, int], Any]) -> None:
    check_learner(make)


def test_a_learner_that_returns_logits_fails_the_check() -> None:
    class Logits(FtrlLearner):
        def predict(self, examples: Any) -> Any:
            return super().predict(examples) * 4 - 2

    with pytest.raises(ContractError, match=r"Logits breaks 'predict returns one probability in \[0, 1\]"):
        check_learner(lambda train, seed: Logits(1 << 10, encoder=Encoder(1 << 10).fit(train)))


# -- feature readers -------------------------------------------------------------------------------
def test_feature_reader_contract_embedded_feast(tmp_path: Path) -> None:
    """The Feast SDK path (:class:`OnlineFeatureReader`) on the embedded profile's SQLite online store."""
    from features.store import FeatureWriter, OnlineFeatureReader, open_store
    from serving_bridge.feature_fallback import FallbackFeatures

    store = open_store(tmp_path / "feast", "embedded")
    reader = OnlineFeatureReader(store)
    check_feature_reader(reader, FeatureWriter(store))
    check_feature_reader(FallbackFeatures(reader), FeatureWriter(store))  # serving's wrapper of it
    cfg = FeatureConfig(sequence_length=3)  # with the behaviour sequence's list features
    seq_store = open_store(tmp_path / "feast-seq", "embedded", cfg=cfg)
    check_feature_reader(OnlineFeatureReader(seq_store, cfg), FeatureWriter(seq_store, cfg), cfg=cfg)


def test_the_trainer_daemon_store_raises_an_unknown_version_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the contract found: MLflow's RESOURCE_DOES_NOT_EXIST was retried as an outage, forever."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    store = idempotent_in_memory()

    def missing(alias: str, version: str) -> None:
        raise MlflowException(
            f"Model Version (version={version}) not found", error_code=RESOURCE_DOES_NOT_EXIST
        )

    monkeypatch.setattr(store.inner, "set_alias", missing)
    monkeypatch.setattr("pipeline.daemons.trainer.time.sleep", lambda s: pytest.fail("retried"))
    with pytest.raises(MlflowException, match="version=9"):
        store.set_alias("champion", "9")
