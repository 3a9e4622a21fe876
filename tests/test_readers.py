"""Backtest readers: Criteo TSV (generated rows), the Open Bandit Dataset (real sample), parquet."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.core.config import Config, SimulatorConfig, ValidationConfig
from pipeline.core.events import Click, DeadLetter, Impression
from pipeline.core.types import RawEvent, Source
from pipeline.core.validation import Validator
from pipeline.sources.open import open_source
from pipeline.sources.parquet import ParquetSource, write_parquet
from pipeline.sources.readers import CRITEO_START_MS, ClickDelay, CriteoTsvSource, ObdCsvSource
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import SimulatorSource

OBD = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "open_bandit_obd"
needs_obd = pytest.mark.skipif(not OBD.is_dir(), reason=f"Open Bandit sample folder {OBD} is absent")


def read_all(source: Any) -> list[RawEvent]:
    return [e for batch in source.batches() for e in batch]


def validate_all(source: Any) -> list[Impression | Click | DeadLetter]:
    validator = Validator(ValidationConfig(), source.clock)
    out = []
    for batch in source.batches():  # validate as the loop does: the clock moved by each batch
        out += [validator.validate(e) for e in batch]
    return out


def criteo_rows(n: int, seed: int = 0) -> list[str]:
    """``n`` lines in Criteo's layout: label, 13 integers, 26 hex categoricals; some blanks."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        ints = [("" if rng.random() < 0.2 else str(int(rng.integers(-2, 5000)))) for _ in range(13)]
        cats = [("" if rng.random() < 0.1 else f"{int(rng.integers(0, 40)):08x}") for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *ints, *cats]))
    return lines


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("criteo") / "day_0.txt"
    path.write_text("\n".join(criteo_rows(3_000)) + "\n")
    return path


def test_criteo_rows_become_impressions_and_delayed_clicks(criteo_file: Path) -> None:
    lines = criteo_file.read_text().splitlines()
    source = CriteoTsvSource([criteo_file], rows_per_s=10.0, delay=ClickDelay(30, 1.0, 600), seed=3)
    events = read_all(source)
    assert all(isinstance(e.value, dict) for e in events)
    imps = [e.value for e in events if e.kind == "impression" and isinstance(e.value, dict)]
    clicks = [e.value for e in events if e.kind == "click" and isinstance(e.value, dict)]
    assert len(imps) == 3_000 and len(clicks) == sum(line[0] == "1" for line in lines)
    first = imps[0]
    assert first["ts"] == CRITEO_START_MS and imps[10]["ts"] == CRITEO_START_MS + 1_000
    cols = lines[0].split("\t")
    assert first["features"] == {f"C{k}": v for k, v in enumerate(cols[14:], 1) if v}
    assert first["dense"] == {f"I{k}": int(v) for k, v in enumerate(cols[1:14], 1) if v}
    ts = [e.value["ts"] for e in events if isinstance(e.value, dict)]
    assert ts == sorted(ts)  # clicks are delivered in event-time order among the impressions
    imp_ts = {v["impression_id"]: v["ts"] for v in imps}
    assert all(0 < c["ts"] - imp_ts[c["impression_id"]] <= 600_000 for c in clicks)
    assert not [o for o in validate_all(source) if isinstance(o, DeadLetter)]


def test_criteo_bad_rows_are_dead_letters_and_gzip_reads(tmp_path: Path) -> None:
    good = criteo_rows(4, seed=1)
    path = tmp_path / "mixed.txt.gz"
    bad = [
        "2\t" + good[0][2:],
        "1\tonly\tthree",
        good[1].replace("\t", "\tx", 1),
    ]  # bad label, short, bad int
    with gzip.open(path, "wt") as f:
        f.write("\n".join([good[0], *bad, *good[1:]]) + "\n")
    out = validate_all(CriteoTsvSource([path], user_field="C1", item_field="C2"))
    assert sum(isinstance(o, DeadLetter) and o.reason == "bad_json" for o in out) == 3
    imps = [o for o in out if isinstance(o, Impression)]
    assert len(imps) == 4 and imps[0].item_id == good[0].split("\t")[15]
    with pytest.raises(ValueError, match=r"C1\.\.C26"):
        CriteoTsvSource([path], user_field="I3")


def test_a_folder_of_compressed_criteo_days_reads_as_the_plain_files(
    criteo_file: Path, tmp_path: Path
) -> None:
    lines = criteo_file.read_bytes().splitlines(keepends=True)
    (tmp_path / "day_0.txt.bz2").write_bytes(bz2.compress(b"".join(lines[:1_000])))
    (tmp_path / "day_1.txt.xz").write_bytes(lzma.compress(b"".join(lines[1_000:])))
    (tmp_path / "README.md").write_text("not a day of the log")
    cfg = Config()
    folder = open_source(cfg, "criteo", tmp_path, seed=3, impressions=0)
    plain = open_source(cfg, "criteo", criteo_file, seed=3, impressions=0)
    assert [(e.kind, e.value) for e in read_all(folder)] == [(e.kind, e.value) for e in read_all(plain)]


Factory = Callable[[dict[str, Any] | None], Any]


def resume_contract(make: Factory, after_batches: int) -> None:
    """A snapshot taken after some batches resumes with exactly the remaining events."""
    whole = make(None)
    assert isinstance(whole, Source)
    full = read_all(whole)
    first = make(None)
    it = first.batches()
    head = [e for _ in range(after_batches) for e in next(it)]
    snapshot = first.snapshot()
    resumed = make(json.loads(json.dumps(snapshot)))
    assert resumed.clock.now_ms() == first.clock.now_ms() > 0
    rest = read_all(resumed)
    assert head + rest == full
    # read again (a replay's read-ahead, pipeline.join.lookahead): from where it began, in place
    assert [e for batch in first.read_again() for e in batch] == full  # type: ignore[attr-defined]
    assert first.snapshot() == snapshot and head + [e for batch in it for e in batch] == full
    assert [e for batch in resumed.read_again() for e in batch] == rest  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    rows = list(Simulator(SimulatorConfig(duplicate_rate=0.01), 4).stream(3_000))
    folder = tmp_path_factory.mktemp("parquet")
    paths = [folder / "a.parquet", folder / "b.parquet"]
    write_parquet(rows[:1_000], paths[0])
    write_parquet(rows[1_000:], paths[1])
    return paths


def test_parquet_round_trip_gives_the_simulator_events(parquet_files: list[Path]) -> None:
    source = ParquetSource(parquet_files, batch_size=700)
    events = read_all(source)
    expected = list(Simulator(SimulatorConfig(duplicate_rate=0.01), 4).stream(3_000))
    assert [(e.kind, e.value) for e in events] == expected
    assert not [o for o in validate_all(source) if isinstance(o, DeadLetter)]


def test_parquet_json_and_struct_columns_and_garbage(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ts = 1_767_225_600_000
    table = pa.table(
        {
            "impression_id": ["i1", "i2", "i1"],
            "click_id": [None, None, "c1"],
            "ts": [ts, ts + 1, ts + 2],
            "user_id": ["u", "u", "u"],
            "item_id": ["a", "b", None],
            "features": ['{"site": "news"}', "not json", None],
        }
    )
    pq.write_table(table, tmp_path / "x.parquet")
    out = validate_all(ParquetSource([tmp_path / "x.parquet"]))
    assert isinstance(out[0], Impression) and out[0].features == {"site": "news"}
    assert isinstance(out[1], DeadLetter) and out[1].reason == "bad_type"
    assert isinstance(out[2], Click)


def make_factories(criteo_file: Path, parquet_files: list[Path]) -> dict[str, Factory]:
    out: dict[str, Factory] = {
        "criteo": lambda r: CriteoTsvSource([criteo_file], seed=1, batch_size=900, resume=r),
        "parquet": lambda r: ParquetSource(parquet_files, batch_size=800, resume=r),
        "simulator": lambda r: SimulatorSource(
            Simulator(SimulatorConfig(), 4), 2_000, batch_size=600, resume=r
        ),
    }
    if OBD.is_dir():
        out["obd"] = lambda r: ObdCsvSource(OBD / "bts", seed=1, batch_size=4_000, resume=r)
    return out


@pytest.mark.parametrize("name", ["criteo", "parquet", "simulator", pytest.param("obd", marks=needs_obd)])
def test_resume_from_a_snapshot_yields_exactly_the_rest(
    name: str, criteo_file: Path, parquet_files: list[Path]
) -> None:
    resume_contract(make_factories(criteo_file, parquet_files)[name], after_batches=2)


@needs_obd
def test_obd_sample_merges_both_policies_and_campaigns_on_time() -> None:
    source = ObdCsvSource(OBD, seed=5)
    events = read_all(source)
    imps = [e.value for e in events if e.kind == "impression" and isinstance(e.value, dict)]
    clicks = [e.value for e in events if e.kind == "click"]
    assert (len(imps), len(clicks)) == (40_000, 207)  # the README's figures
    groups = {(v["features"]["policy"], v["features"]["campaign"]) for v in imps}
    assert groups == {("bts", "men"), ("bts", "women"), ("random", "men"), ("random", "women")}
    imp_ts = [v["ts"] for v in imps]
    assert imp_ts == sorted(imp_ts) and imp_ts[0] // 86_400_000 == 18_224  # 2019-11-24
    first = imps[0]
    assert first["item_id"].split("-")[0] in ("men", "women") and first["user_id"].startswith("obd-")
    assert set(first["dense"]) == {"item_feature_0", "affinity"}
    assert {"position", "user_feature_0", "item_feature_3"} <= set(first["features"])
    assert not [o for o in validate_all(source) if isinstance(o, DeadLetter)]


def test_obd_layout_errors_and_bad_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="item_context"):
        ObdCsvSource(tmp_path)
    folder = tmp_path / "random" / "men"
    folder.mkdir(parents=True)
    (folder / "item_context.csv").write_text(
        ",item_id,item_feature_0,item_feature_1,item_feature_2,item_feature_3\n0,0,0.5,a,b,c\n"
    )
    head = ",timestamp,item_id,position,click,propensity_score," + ",".join(
        f"user_feature_{k}" for k in range(4)
    )
    head += ",user-item_affinity_0"
    good = "0,2019-11-24 00:01:03.979311+00:00,0,1,1,0.5,u0,u1,u2,u3,0.0"
    bad_item = "1,2019-11-24 00:02:03+00:00,7,1,0,0.5,u0,u1,u2,u3,0.0"  # item 7 has no context
    (folder / "men.csv").write_text("\n".join([head, good, bad_item, "2,nonsense"]) + "\n")
    out = validate_all(ObdCsvSource(tmp_path))
    assert [type(o).__name__ for o in out].count("DeadLetter") == 2
    assert sum(isinstance(o, Impression) for o in out) == 1 and sum(isinstance(o, Click) for o in out) == 1


AVAZU = OBD.parent / "avazu_first_hour" / "avazu_train_first_9999.csv"


@pytest.mark.skipif(not AVAZU.is_file(), reason=f"Avazu sample {AVAZU} is absent")
def test_backtest_opens_the_avazu_sample_with_the_configured_click_delay() -> None:
    from pipeline.core.config import Config
    from pipeline.sources.open import open_source

    cfg = Config()
    cfg.backtest.click_delay_median_s, cfg.backtest.click_delay_max_s = 10.0, 120.0
    events = read_all(open_source(cfg, "avazu", AVAZU, seed=2, impressions=0))
    values = [(e.kind, e.value) for e in events if isinstance(e.value, dict)]
    imp_ts = {v["impression_id"]: v["ts"] for kind, v in values if kind == "impression"}
    delays = [v["ts"] - imp_ts[v["impression_id"]] for kind, v in values if kind == "click"]
    assert (len(imp_ts), len(delays)) == (9_999, 1_706) and min(delays) > 0 and max(delays) <= 120_000


def test_a_byte_order_mark_before_the_header_or_first_line_is_not_data(
    criteo_file: Path, tmp_path: Path
) -> None:
    """Excel and some Windows exports write UTF-8's byte-order mark first: it is not part of the
    first column's name (Avazu's 'id', OBD's) nor of the first JSONL event."""
    bom = b"\xef\xbb\xbf"
    lines = criteo_file.read_bytes().splitlines(keepends=True)[:50]
    (tmp_path / "bom.txt").write_bytes(bom + b"".join(lines))
    (tmp_path / "plain.txt").write_bytes(b"".join(lines))
    cfg = Config()

    def events_of(fmt: str, name: str) -> list[tuple[str, Any]]:
        return [
            (e.kind, e.value) for e in read_all(open_source(cfg, fmt, tmp_path / name, seed=3, impressions=0))
        ]

    assert len(events_of("criteo", "bom.txt")) > 50 and events_of("criteo", "bom.txt") == events_of(
        "criteo", "plain.txt"
    )
    events = list(Simulator(SimulatorConfig(), 4).stream(20))
    (tmp_path / "bom.jsonl").write_bytes(bom + b"".join(json.dumps(ev).encode() + b"\n" for _, ev in events))
    out = validate_all(open_source(cfg, "jsonl", tmp_path / "bom.jsonl", seed=0, impressions=0))
    assert len(out) == len(events) and not any(isinstance(o, DeadLetter) for o in out)
    if AVAZU.is_file():
        head = AVAZU.read_bytes().splitlines(keepends=True)[:200]
        (tmp_path / "bom.csv").write_bytes(bom + b"".join(head))
        (tmp_path / "plain.csv").write_bytes(b"".join(head))
        assert len(events_of("avazu", "bom.csv")) > 199 and events_of("avazu", "bom.csv") == events_of(
            "avazu", "plain.csv"
        )


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_compressed_log_cut_short_is_reported_with_what_to_do(
    criteo_file: Path, tmp_path: Path, suffix: str
) -> None:
    """A truncated download: the events before the cut are delivered, then one clear error, which
    `ctr backtest` prints in a line (exit 2) instead of a traceback."""
    from pipeline.ops.cli import main
    from pipeline.sources.files import UnreadableLog

    packed = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix](
        criteo_file.read_bytes()
    )
    cut = tmp_path / f"day_0.txt{suffix}"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    source = CriteoTsvSource([cut], batch_size=100)
    got: list[RawEvent] = []
    with pytest.raises(UnreadableLog, match=r"cannot be read on after [\d,]+ events .*copy it again") as err:
        for batch in source.batches():
            got += batch
    assert f"after {len(got):,} events" in str(err.value)
    assert len(got) > 100 or suffix == ".bz2"  # bzip2 decodes by whole blocks (900 kB), this is one
    out = tmp_path / "report"
    assert main(["backtest", "--format", "criteo", "--source", str(cut), "--out", str(out)]) == 2
    gone = CriteoTsvSource([cut])
    cut.unlink()  # not damaged: not there (between the open and the read)
    with pytest.raises(UnreadableLog, match=r"FileNotFoundError.*check that the file is there and readable"):
        read_all(gone)


def test_a_file_of_another_format_names_what_it_lacks(tmp_path: Path) -> None:
    from pipeline.sources.avazu import AvazuCsvSource
    from pipeline.sources.files import UnreadableLog

    (tmp_path / "other.csv").write_text("user,ad,clicked\nu1,a1,0\n")
    with pytest.raises(
        UnreadableLog, match=r"not an Avazu CSV: its header lacks C14, click.*starts 'user,ad"
    ):
        read_all(AvazuCsvSource(tmp_path / "other.csv"))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UnreadableLog, match="it is empty"):
        read_all(AvazuCsvSource(tmp_path / "empty.csv"))
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(UnreadableLog, match="cannot be read as Parquet"):
        read_all(ParquetSource([tmp_path / "x.parquet"]))
    folder = tmp_path / "random" / "men"
    folder.mkdir(parents=True)
    (folder / "item_context.csv").write_text(",item_id,item_feature_0\n0,0,0.5\n")
    (folder / "men.csv").write_text(",ts,item,pos,clicked\n0,1,0,1,0\n")
    with pytest.raises(UnreadableLog, match="not an Open Bandit log: its header lacks click, item_id"):
        read_all(ObdCsvSource(tmp_path))


def test_a_parquet_log_in_another_vocabulary_reads_with_the_map(
    parquet_files: list[Path], tmp_path: Path
) -> None:
    """--map renames Parquet columns as it does JSONL fields (the verdict of such a log suggests it)."""
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_files[0])
    renamed = {"type": "event_type", "user_id": "uid", "ts": "timestamp"}
    pq.write_table(
        table.rename_columns([renamed.get(n, n) for n in table.column_names]), tmp_path / "r.parquet"
    )
    cfg = Config()
    cfg.jsonl.map = ("type=event_type", "user_id=uid", "ts=timestamp")
    mapped = read_all(open_source(cfg, "parquet", tmp_path / "r.parquet", seed=0, impressions=0))
    canonical = read_all(open_source(Config(), "parquet", parquet_files[0], seed=0, impressions=0))
    assert [(e.kind, e.value) for e in mapped] == [(e.kind, e.value) for e in canonical]
    assert {e.kind for e in mapped} == {"impression", "click"}
    unmapped = validate_all(open_source(Config(), "parquet", tmp_path / "r.parquet", seed=0, impressions=0))
    assert all(isinstance(o, DeadLetter) for o in unmapped)  # without the map: refused, with reasons


def test_a_compression_is_known_by_its_first_bytes_not_its_name(criteo_file: Path, tmp_path: Path) -> None:
    """A gzipped log without .gz (Avazu's `train`, renamed) reads as the plain one; one compressed
    with zstd, zip or lz4 is said to be, with the command that decompresses it (it was read as text:
    every line a dead letter, the hint about the JSONL schema)."""
    from pipeline.sources.files import UnreadableLog

    (tmp_path / "day_0").write_bytes(gzip.compress(criteo_file.read_bytes()))
    cfg = Config()
    plain = [
        (e.kind, e.value) for e in read_all(open_source(cfg, "criteo", criteo_file, seed=3, impressions=0))
    ]
    unnamed = [
        (e.kind, e.value)
        for e in read_all(open_source(cfg, "criteo", tmp_path / "day_0", seed=3, impressions=0))
    ]
    assert unnamed == plain
    (tmp_path / "log.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64))
    with pytest.raises(UnreadableLog, match=r"compressed with zstd.*\(zstd -d log\.jsonl\.zst\)"):
        read_all(open_source(cfg, "jsonl", tmp_path / "log.jsonl.zst", seed=0, impressions=0))
