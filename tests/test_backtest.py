"""`ctr backtest`: the live loop replayed with baselines, its report, determinism, real OBD logs."""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from pipeline.core.config import Config
from pipeline.core.config_loader import load_config
from pipeline.ops.cli import main
from pipeline.replay.backtest import BacktestResult, run_backtest
from pipeline.replay.bootstrap import paired_bootstrap_auc, percentile_ci, weighted_auc
from pipeline.sources.open import open_source
from pipeline.sources.simulator import Simulator
from trainers.metrics import auc

OBD = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "open_bandit_obd"
LEARNERS = ("online", "static", "ftrl")


def drifting_config() -> Config:
    """The drifting simulator at a test's scale: 100 users and 40 items (so a 10k block holds ~100
    impressions per user, as 100k blocks do for the heaviest users of the default 5,000), interests
    with a 1 h half-life, the default shifts (10% of users every 30 min), and a trainer sized for
    a 2-core CPU. The small blocks get a smaller batch and a higher learning rate for the embedding
    vectors (each id is seen ~100 times a block); FTRL keeps its defaults."""
    cfg = Config()
    s = cfg.simulator
    s.users, s.items, s.events_per_s, s.drift_half_life_s = 100, 40, 10.0, 3_600.0
    t = cfg.trainer
    t.train_every, t.hash_buckets, t.batch_size, t.embedding_dim, t.hidden = 10_000, 1 << 14, 256, 8, (32, 16)
    # frequent ids drifting fast: the embedding vectors need larger AdaGrad steps than the defaults
    t.lr_sparse, t.sparse_beta, t.device = 0.1, 0.1, "cpu"
    cfg.backtest.bootstrap_resamples = 100
    return cfg


def simulate(cfg: Config, out: Path, impressions: int, seed: int) -> BacktestResult:
    source = open_source(cfg, "simulator", None, seed=seed, impressions=impressions)
    return run_backtest(cfg, source, out, title="test", seed=seed, quiet=True, mlflow_run=False)


@pytest.fixture(scope="module")
def drifting_run(tmp_path_factory: pytest.TempPathFactory) -> BacktestResult:
    return simulate(drifting_config(), tmp_path_factory.mktemp("drift"), 100_000, seed=11)


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[BacktestResult, BacktestResult]:
    base = tmp_path_factory.mktemp("twins")
    cfg = drifting_config()
    cfg.trainer.train_every = 3_000
    return simulate(cfg, base / "a", 12_000, seed=5), simulate(cfg, base / "b", 12_000, seed=5)


def test_online_beats_static_and_ftrl_on_the_drifting_simulator(drifting_run: BacktestResult) -> None:
    s = drifting_run.summary
    assert s["blocks"] == 10 and s["examples"] == 100_000 and s["evaluated_blocks"] == list(range(2, 11))
    for other in ("static", "ftrl"):
        m = s["margins"][f"online_vs_{other}"]
        assert m["auc"] > 0.01 and m["auc_ci95"][0] > 0, (other, m)  # the paired CI excludes 0
        assert m["logloss"] > 0, (other, m)
    for name in LEARNERS:
        lo, hi = s["learners"][name]["auc_ci95"]
        assert lo < s["learners"][name]["auc"] < hi


def test_the_same_inputs_and_seed_give_an_identical_metrics_csv(
    twin_runs: tuple[BacktestResult, ...],
) -> None:
    a, b = ((r.out / "metrics.csv").read_bytes() for r in twin_runs)
    assert a == b
    rows = list(csv.DictReader(a.decode().splitlines()))
    assert [int(r["block"]) for r in rows] == [1, 2, 3, 4]
    assert {f"{n}_{m}" for n in LEARNERS for m in ("auc", "logloss", "ne", "calibration")} <= set(rows[0])
    assert rows[0]["static_auc"] == "nan" and rows[1]["scored_by_version"] == rows[0]["version"] == "1"
    assert int(rows[1]["event_time_min"]) >= int(rows[0]["event_time_min"])
    assert twin_runs[0].summary["learners"] == twin_runs[1].summary["learners"]


def test_report_files(twin_runs: tuple[BacktestResult, ...]) -> None:
    out = twin_runs[0].out
    summary = json.loads((out / "summary.json").read_text())
    assert {"blocks", "examples", "learners", "margins", "examples_per_s"} <= set(summary)
    assert all({"auc", "logloss", "ne", "auc_ci95"} <= set(summary["learners"][n]) for n in LEARNERS)
    for name in ("auc", "logloss", "ne", "calibration"):
        assert (out / f"{name}.png").stat().st_size > 5_000
    assert "auc.png" in (out / "index.html").read_text()


def test_paired_bootstrap_matches_the_exact_auc_and_brackets_it() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(3_000) < 0.1).astype(float)
    p = np.round(0.3 * y + rng.random(3_000), 2)  # ties on purpose
    assert weighted_auc(y, p) == pytest.approx(auc(y, p), abs=1e-12)
    w = rng.integers(0, 3, 3_000).astype(float)
    assert weighted_auc(y, p, w) == pytest.approx(
        auc(np.repeat(y, w.astype(int)), np.repeat(p, w.astype(int)))
    )
    boot = paired_bootstrap_auc(y, {"a": p, "b": p}, resamples=200, seed=1)
    lo, hi = percentile_ci(boot["a"])
    assert lo < auc(y, p) < hi and np.array_equal(boot["a"], boot["b"])  # paired: same resamples
    assert math.isnan(percentile_ci(np.full(3, math.nan))[0])


def test_a_stream_shorter_than_two_blocks_says_which_block_size_would_judge_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = drifting_config()  # blocks of 10,000
    source = open_source(cfg, "simulator", None, seed=3, impressions=4_000)
    result = run_backtest(cfg, source, tmp_path, title="short", seed=3, mlflow_run=False)
    s = result.summary
    assert s["blocks"] == 1 and math.isnan(s["learners"]["online"]["auc"])  # nothing judged
    (hint,) = s["hints"]
    n = s["examples"]
    suggested = int(hint.rsplit("--train-every ", 1)[1].rstrip("."))
    assert "no block is judged" in hint and n // 6 < suggested <= n // 5, hint
    assert f"note: {hint}" in capsys.readouterr().out
    assert hint in (tmp_path / "index.html").read_text()
    from pipeline.replay.backtest import _block_hints

    assert _block_hints(0, 100_000) == [  # no block size would help: no --train-every offered
        "0 examples: too few to judge a model by (is --source the log you meant? any dead letters "
        "are counted below)"
    ]


def test_a_last_block_served_mostly_by_the_base_rate_is_pointed_out() -> None:
    from pipeline.replay.backtest import _blend_hints

    assert _blend_hints([]) == [] and _blend_hints([{"served_model_weight": 0.9}]) == []
    (hint,) = _blend_hints([{"served_model_weight": 1.0}, {"served_model_weight": 0.03}])
    assert hint.startswith("the last block was served 97.0% by the running click rate")
    assert "served_model_weight" in hint and "trainer.base_rate_blend_clamp" in hint


@pytest.mark.skipif(not OBD.is_dir(), reason=f"Open Bandit sample folder {OBD} is absent")
def test_obd_backtest_over_both_policies_and_campaigns(tmp_path: Path) -> None:
    cfg = Config()
    cfg.trainer.train_every, cfg.trainer.hash_buckets, cfg.trainer.device = 5_000, 1 << 16, "cpu"
    source = open_source(cfg, "obd", OBD, seed=7, impressions=0)
    s = run_backtest(cfg, source, tmp_path, title="obd", seed=7, quiet=True, mlflow_run=False).summary
    assert (s["blocks"], s["examples"], s["dead_letters"]) == (8, 40_000, 0)
    assert s["join_stats"]["positives"] == 207
    for name in LEARNERS:
        v = s["learners"][name]
        lo, hi = v["auc_ci95"]
        assert 0 < lo < v["auc"] < hi < 1, (name, v)


def test_cli_backtest_of_a_criteo_file_writes_the_report_and_an_mlflow_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_readers import criteo_rows

    path = tmp_path / "day_0.txt"
    path.write_text("\n".join(criteo_rows(4_000, seed=2)) + "\n")
    out = tmp_path / "report"
    env = {
        "CTR_TRAINER_HASH_BUCKETS": "16384",
        "CTR_TRAINER_DEVICE": "cpu",
        "CTR_BACKTEST_BOOTSTRAP_RESAMPLES": "20",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        args = ["--format", "criteo", "--source", str(path), "--train-every", "1000", "--model", "dcnv2"]
        rc = main(["backtest", *args, "--attribution-window", "900", "--seed", "3", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "examples/s" in printed and "margin online_vs_ftrl" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["blocks"] == 4 and summary["model"] == "dcnv2" and summary["format"] == "criteo"
    # 4 blocks: enough to judge; labels drawn at random: the running click rate serves, and says so
    (hint,) = summary["hints"]
    assert hint.startswith("the last block was served") and "by the running click rate" in hint
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ctr-online-backtest")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["format"] == "criteo" and "online.auc" in run.data.metrics
    assert len(client.get_metric_history(run.info.run_id, "online_auc")) == 4
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {
        "metrics.csv",
        "summary.json",
        "auc.png",
    }
    assert main(["backtest", "--format", "obd", "--source", str(tmp_path / "absent")]) == 2
    too_short = [
        "--format",
        "criteo",
        "--source",
        str(path),
        "--attribution-window",
        "60",
    ]  # < 600 s delay cap
    assert main(["backtest", *too_short]) == 2


# -- JSONL in another vocabulary, impressions and clicks in two files, mostly-dead inputs ----------
VOCAB = {"type": "event_type", "user_id": "uid", "ts": "timestamp"}
VALUES = {"impression": "imp", "click": "clk"}
MAP_ARGS = [a for k, v in (*VOCAB.items(), *VALUES.items()) for a in ("--map", f"{k}={v}")]
SMALL_ENV = {
    "CTR_TRAINER_HASH_BUCKETS": "16384",
    "CTR_TRAINER_DEVICE": "cpu",
    "CTR_BACKTEST_BOOTSTRAP_RESAMPLES": "20",
}


def write_rows(rows: list[dict[str, object]], path: Path, garbage: tuple[bytes, ...] = ()) -> Path:
    path.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b"".join(g + b"\n" for g in garbage)
    )
    return path


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One simulated stream (3,000 impressions, in time order) written four ways."""
    cfg = drifting_config()
    cfg.simulator.duplicate_rate = cfg.simulator.early_click_rate = 0.0
    stream = sorted(Simulator(cfg.simulator, 5).stream(3_000), key=lambda r: (r[1]["ts"], r[0] == "click"))
    d = tmp_path_factory.mktemp("logs")
    (d / "split").mkdir()
    other = [{VOCAB.get(k, k): v for k, v in {"type": VALUES[kind], **e}.items()} for kind, e in stream]
    return {
        "canonical": write_rows([{"type": kind, **e} for kind, e in stream], d / "canonical.jsonl"),
        "other": write_rows(other, d / "other.jsonl", garbage=(b"{oops", b"[]")),  # 2 dead letters
        "impressions": write_rows(
            [e for kind, e in stream if kind == "impression"], d / "split" / "impressions.jsonl"
        ),
        "clicks": write_rows([e for kind, e in stream if kind == "click"], d / "split" / "clicks.jsonl"),
    }


def cli_backtest(source: Path, out: Path, *extra: str) -> int:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SMALL_ENV.items():
            mp.setenv(k, v)
        args = ["--source", str(source), "--train-every", "1000", "--model", "lr", "--seed", "3"]
        return main(["backtest", "--format", "jsonl", *args, "--out", str(out), *extra])


@pytest.fixture(scope="module")
def canonical_run(logs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("canonical")
    assert cli_backtest(logs["canonical"], out) == 0
    return out


def test_a_log_tagged_event_type_backtests_with_map_like_the_canonical_one(
    logs: dict[str, Path], canonical_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_backtest(logs["other"], tmp_path, *MAP_ARGS) == 0
    # and, in both runs, the last click: 6,600 s after its impression, past the window and the dedup
    # horizon (4,500 s), so its impression is forgotten and it is held, then refused, as an orphan
    assert "dead letters by reason: bad_json 1, not_an_object 1, orphan_click 1" in capsys.readouterr().out
    a, b = (json.loads((out / "summary.json").read_text()) for out in (canonical_run, tmp_path))
    assert b["examples"] == a["examples"] > 2_000 and b["events"] == a["events"] + 2
    assert (b["dead_letters_by_reason"], a["dead_letters_by_reason"]) == (
        {"bad_json": 1, "not_an_object": 1, "orphan_click": 1},
        {"orphan_click": 1},
    )
    assert (tmp_path / "metrics.csv").read_bytes() == (canonical_run / "metrics.csv").read_bytes()


def test_without_the_map_the_backtest_fails_and_names_the_option(
    logs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_backtest(logs["other"], tmp_path) == 3
    err = capsys.readouterr().err
    assert "became dead letters" in err and "missing_field" in err and '{"event_type": "imp"' in err
    assert "events look tagged 'event_type': pass --map type=event_type --map impression=imp" in err
    assert "--map user_id=uid" in err and "--map ts=timestamp" in err and "--map click=clk" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["examples"] == 0 and summary["dead_letter_share"] == 1.0
    assert sum(summary["dead_letters_by_reason"].values()) == summary["events"]


def test_a_log_out_of_time_order_is_said_to_be_so(
    logs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the canonical log's lines shuffled: in file order, an event far from the median of the events
    # around it is refused (ts_in_future or ts_too_old), and the run says why that may be
    rows = [json.loads(line) for line in logs["canonical"].read_bytes().splitlines()]
    start = rows[0]["ts"]
    for r in rows:  # its ~5 minutes stretched to ~2 hours, then its lines shuffled
        r["ts"] = start + (r["ts"] - start) * 24
    random.Random(5).shuffle(rows)
    shuffled = write_rows(rows, tmp_path / "shuffled.jsonl")
    assert cli_backtest(shuffled, tmp_path / "out") == 0  # under half dead: the run stands, with a note
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    refused = sum(n for r, n in summary["dead_letters_by_reason"].items() if r.startswith("ts_"))
    assert refused > 0.2 * summary["events"]
    assert f"note: {refused:,} events" in out and "If the log is not in event-time order, sort it" in out


def test_impression_and_click_files_give_the_examples_of_the_merged_file(
    logs: dict[str, Path], canonical_run: Path, tmp_path: Path
) -> None:
    assert cli_backtest(logs["impressions"], tmp_path, "--clicks", str(logs["clicks"])) == 0
    a, b = (json.loads((out / "summary.json").read_text()) for out in (canonical_run, tmp_path))
    assert (b["examples"], b["events"], b["join_stats"]) == (a["examples"], a["events"], a["join_stats"])
    assert (tmp_path / "metrics.csv").read_bytes() == (canonical_run / "metrics.csv").read_bytes()
    # a folder of impression* and click* files is the same input
    folder = open_source(Config(), "jsonl", logs["clicks"].parent, seed=0, impressions=0)
    clicks = open_source(Config(), "jsonl", logs["impressions"], seed=0, impressions=0, clicks=logs["clicks"])
    assert [e for b in folder.batches() for e in b] == [e for b in clicks.batches() for e in b]


def test_the_map_as_a_config_field(logs: dict[str, Path]) -> None:
    cfg = load_config(
        env={"CTR_JSONL_MAP": "type=event_type,impression=imp,click=clk,user_id=uid,ts=timestamp"}
    )
    mapped = [e for b in open_source(cfg, "jsonl", logs["other"], seed=0, impressions=0).batches() for e in b]
    canonical = [
        e
        for b in open_source(Config(), "jsonl", logs["canonical"], seed=0, impressions=0).batches()
        for e in b
    ]
    assert [(e.kind, e.value) for e in mapped[:-2]] == [(e.kind, e.value) for e in canonical]
    with pytest.raises(ValueError, match="unknown canonical name 'uid'"):
        open_source(
            load_config(env={"CTR_JSONL_MAP": "uid=user_id"}), "jsonl", logs["other"], seed=0, impressions=0
        )


@pytest.mark.slow
def test_a_demo_over_a_log_without_the_map_exits_3_and_names_it(
    logs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**SMALL_ENV, "CTR_TRAINER_MODEL": "lr"}.items():
            mp.setenv(k, v)
        rc = main(["demo", "--source", str(logs["other"]), "--train-every", "1000", "--out", str(tmp_path)])
    assert rc == 3 and "pass --map type=event_type" in capsys.readouterr().err


def test_the_verdict_names_the_flag_from_the_first_dead_letters() -> None:
    from pipeline.replay.dead_letter_check import diagnose
    from pipeline.sources.jsonl_mapping import JsonlMapping

    imp = {"impression_id": "i1", "ts": 1_767_225_600_000, "user_id": "u", "item_id": "a"}

    def letter(reason: str, obj: dict[str, object]) -> dict[str, object]:
        return {"reason": reason, "detail": "", "raw": json.dumps(obj), "source": "log.jsonl", "offset": 0}

    # the reported case: canonical fields and values, the tag under another name
    d = diagnose(
        308_155, {"unknown_field": 308_155}, [letter("unknown_field", {"event_type": "impression", **imp})]
    )
    assert d.failed and d.suggested == ["type=event_type"]
    assert "events look tagged 'event_type': pass --map type=event_type" in "\n".join(d.lines())
    # the tag is mapped but a value is not: the value's kind is guessed, or both are offered
    mapped = JsonlMapping.parse(["type=kind"])
    samples = [
        letter("unknown_field", {"kind": "imp", **imp}),
        letter("unknown_field", {"kind": "x9", **imp}),
    ]
    d = diagnose(10, {"unknown_field": 10}, samples, mapped)
    assert d.suggested == ["impression=imp"] and any("--map click=x9" in h for h in d.hints)
    # under half: not failed, the reasons still counted; epoch seconds get their own hint
    d = diagnose(10, {"ts_too_old": 4}, [letter("ts_too_old", {**imp, "ts": 1_767_225_600})])
    assert not d.failed and d.by_reason == {"ts_too_old": 4} and "epoch seconds" in d.hints[0]
    # ts as a date: said, with what the schema wants
    d = diagnose(5, {"bad_type": 5}, [letter("bad_type", {**imp, "ts": "2026-01-01T00:00:00.005Z"})])
    assert d.hints == [
        "ts is text ('2026-01-01T00:00:00.005Z'); the schema wants epoch milliseconds as a JSON "
        "integer: convert it before the replay (no --map converts it)"
    ]
    # a row format's reader passes on a row it cannot read: the layout it wanted, not the JSONL schema
    row = {
        "reason": "bad_json",
        "detail": "",
        "raw": "\t".join(["7"] * 39),
        "source": "criteo_tsv",
        "offset": 0,
    }
    d = diagnose(3, {"bad_json": 3}, [row])
    assert d.hints == [
        "Criteo rows are a 0/1 label, 13 integers and 26 categorical values, tab-separated (40 fields; "
        "Criteo's test files have no label, so they cannot be replayed); the example has 39 "
        "tab-separated fields"
    ]
    # many events refused for their time: the order of the log is suspect (the example fits JSONL)
    late = letter("ts_in_future", imp)
    d = diagnose(1_000, {"ts_in_future": 300, "ts_too_old": 20, "orphan_click": 40}, [late])
    assert not d.failed and d.notes == d.hints and len(d.hints) == 1
    assert d.hints[0].startswith("320 events (32.0%) were refused for their time")
    assert d.hints[0].endswith("sort it by ts first, e.g. jq -c -s 'sort_by(.ts)[]' FILE > sorted.jsonl")
    # a few of them (1 %) in a log that is in order but for them: no such hint, and nothing to note
    d = diagnose(1_000, {"ts_in_future": 10}, [late])
    assert not d.hints[0].startswith("10 events") and d.generic and d.notes == []
    # a JSON array instead of JSON Lines (pretty-printed: its first line is "[")
    array = {"reason": "bad_json", "detail": "", "raw": "[", "source": "log.jsonl", "offset": 0}
    d = diagnose(12, {"bad_json": 12}, [array])
    assert d.failed and d.hints == [
        "the log looks like one JSON array, not JSON Lines (one event object per line): convert "
        "it, e.g. jq -c '.[]' FILE > events.jsonl"
    ]
