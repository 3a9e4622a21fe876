"""Sources: one snapshot/resume contract for all of them, JSONL round trips, the Avazu reader."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.config import SimulatorConfig, ValidationConfig
from pipeline.core.events import Click, DeadLetter, Impression
from pipeline.core.types import RawEvent, Source
from pipeline.core.validation import Validator
from pipeline.sources.avazu import AvazuCsvSource, avazu_hour_to_ms
from pipeline.sources.jsonl_mapping import JsonlMapping, write_jsonl
from pipeline.sources.simulator import Simulator
from pipeline.sources.streams import JsonlSource, MergedJsonlSource, SimulatorSource

AVAZU_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "avazu_first_hour"
AVAZU = AVAZU_DIR / "avazu_train_first_9999.csv"
needs_avazu = pytest.mark.skipif(not AVAZU_DIR.is_dir(), reason=f"Avazu sample folder {AVAZU_DIR} is absent")
SIM_CFG = SimulatorConfig(duplicate_rate=0.01, early_click_rate=0.02)
SPLIT_CFG = SimulatorConfig(duplicate_rate=0.0, early_click_rate=0.0)  # each kind in ts order
Factory = Callable[[dict[str, Any] | None], Any]
# Another vocabulary for the same events: tag, tag values and two field names renamed.
RENAMES = {"type": "event_type", "user_id": "uid", "ts": "timestamp"}
VALUES = {"impression": "imp", "click": "clk"}
MAP = JsonlMapping.parse(
    [*(f"{k}={v}" for k, v in RENAMES.items()), *(f"{k}={v}" for k, v in VALUES.items())]
)


def val(event: RawEvent) -> dict[str, Any]:
    assert isinstance(event.value, dict)
    return event.value


def read_all(source: Any) -> list[RawEvent]:
    return [e for batch in source.batches() for e in batch]


def validate_all(events: list[RawEvent], source: Any) -> list[Impression | Click | DeadLetter]:
    validator = Validator(ValidationConfig(), source.clock)
    return [validator.validate(e) for e in events]


@pytest.fixture(scope="module")
def sim_jsonl(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A simulated stream written as two JSONL files."""
    rows = list(Simulator(SIM_CFG, 21).stream(6_000))
    folder = tmp_path_factory.mktemp("jsonl")
    paths = [folder / "a.jsonl", folder / "b.jsonl"]
    write_jsonl(rows[:2_500], paths[0])
    write_jsonl(rows[2_500:], paths[1])
    return paths


def renamed(kind: str, event: dict[str, Any]) -> dict[str, Any]:
    """``event`` tagged ``kind`` in the vocabulary of :data:`MAP`."""
    return {RENAMES.get(k, k): v for k, v in {"type": VALUES[kind], **event}.items()}


def write_lines(rows: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def mapped_jsonl(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The stream of :func:`sim_jsonl` in another vocabulary (read with :data:`MAP`)."""
    rows = [renamed(kind, e) for kind, e in Simulator(SIM_CFG, 21).stream(6_000)]
    return [write_lines(rows, tmp_path_factory.mktemp("mapped") / "log.jsonl")]


@pytest.fixture(scope="module")
def split_jsonl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A simulated stream as an impressions file and a clicks file, untagged."""
    rows = list(Simulator(SPLIT_CFG, 23).stream(4_000))
    folder = tmp_path_factory.mktemp("split")
    imps = write_lines([e for kind, e in rows if kind == "impression"], folder / "impressions.jsonl")
    return imps, write_lines([e for kind, e in rows if kind == "click"], folder / "clicks.jsonl")


@pytest.fixture(scope="module")
def compressed_jsonl(sim_jsonl: list[Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The files of :func:`sim_jsonl`, gzipped and xz-compressed (how logs are shipped)."""
    folder = tmp_path_factory.mktemp("compressed")
    out = [folder / "a.jsonl.gz", folder / "b.jsonl.xz"]
    out[0].write_bytes(gzip.compress(sim_jsonl[0].read_bytes()))
    out[1].write_bytes(lzma.compress(sim_jsonl[1].read_bytes()))
    return out


def merged(split: tuple[Path, Path], batch_size: int = 5_000, resume: dict[str, Any] | None = None) -> Any:
    parts = [JsonlSource([split[0]], kind="impression"), JsonlSource([split[1]], kind="click")]
    return MergedJsonlSource(parts, batch_size=batch_size, resume=resume)


def factories(
    jsonl: list[Path], mapped: list[Path], split: tuple[Path, Path], packed: list[Path]
) -> dict[str, Factory]:
    sim = Simulator(SIM_CFG, 20)
    out: dict[str, Factory] = {
        "simulator": lambda resume: SimulatorSource(sim, 12_000, batch_size=1_700, resume=resume),
        "jsonl": lambda resume: JsonlSource(jsonl, batch_size=700, resume=resume),
        "jsonl-mapped": lambda resume: JsonlSource(mapped, batch_size=700, resume=resume, mapping=MAP),
        "jsonl-merged": lambda resume: merged(split, batch_size=900, resume=resume),
        "jsonl-compressed": lambda resume: JsonlSource(packed, batch_size=700, resume=resume),
    }
    if AVAZU_DIR.is_dir():
        out["avazu"] = lambda resume: AvazuCsvSource(AVAZU, batch_size=1_500, resume=resume)
    return out


JSONL_SOURCES = ["jsonl", "jsonl-mapped", "jsonl-merged", "jsonl-compressed"]


@pytest.mark.parametrize("name", ["simulator", *JSONL_SOURCES, pytest.param("avazu", marks=needs_avazu)])
@pytest.mark.parametrize("after_batches", [1, 3])
def test_resume_from_a_snapshot_yields_exactly_the_rest(
    name: str,
    after_batches: int,
    sim_jsonl: list[Path],
    mapped_jsonl: list[Path],
    split_jsonl: tuple[Path, Path],
    compressed_jsonl: list[Path],
) -> None:
    make = factories(sim_jsonl, mapped_jsonl, split_jsonl, compressed_jsonl)[name]
    assert isinstance(make(None), Source)
    whole = make(None)
    batches = list(whole.batches())
    assert {len(b) for b in batches[:-1]} == {whole.batch_size} and len(batches) > after_batches
    full = [e for b in batches for e in b]
    first = make(None)
    it = first.batches()
    head = [e for _ in range(after_batches) for e in next(it)]
    snap = json.loads(json.dumps(first.snapshot()))  # must survive a trip through a checkpoint file
    resumed = make(snap)
    assert resumed.clock.now_ms() == first.clock.now_ms() > 0
    assert head + read_all(resumed) == full
    assert resumed.clock.now_ms() == whole.clock.now_ms()
    assert read_all(make(json.loads(json.dumps(resumed.snapshot())))) == []


@pytest.mark.parametrize("name", ["simulator", *JSONL_SOURCES])
def test_a_snapshot_of_another_source_is_refused(
    name: str,
    sim_jsonl: list[Path],
    mapped_jsonl: list[Path],
    split_jsonl: tuple[Path, Path],
    compressed_jsonl: list[Path],
) -> None:
    make = factories(sim_jsonl, mapped_jsonl, split_jsonl, compressed_jsonl)[name]
    with pytest.raises(ValueError, match="snapshot"):
        make({"source": "elsewhere", "offset": 0})


def test_compressed_jsonl_reads_as_the_plain_files(
    sim_jsonl: list[Path], compressed_jsonl: list[Path]
) -> None:
    def events(paths: list[Path]) -> list[tuple[Any, ...]]:
        return [(e.kind, e.value, e.partition, e.offset) for e in read_all(JsonlSource(paths))]

    assert events(compressed_jsonl) == events(sim_jsonl)
    source = JsonlSource(compressed_jsonl)  # and through the validator: all valid, as the plain ones
    assert not [o for o in validate_all(read_all(source), source) if isinstance(o, DeadLetter)]


def test_simulator_source_clock_follows_event_time() -> None:
    source = SimulatorSource(Simulator(SIM_CFG, 22), 5_000, batch_size=1_000)
    for batch in source.batches():
        assert source.clock.now_ms() == max(val(e)["ts"] for e in batch)
        assert all(e.source == "simulator" and e.key for e in batch)


def test_jsonl_round_trip_validates_every_event(sim_jsonl: list[Path]) -> None:
    source = JsonlSource(sim_jsonl)
    events = read_all(source)
    expected = [e for _, e in Simulator(SIM_CFG, 21).stream(6_000)]
    assert [e.value for e in events] == expected
    out = validate_all(events, source)
    assert not [d for d in out if isinstance(d, DeadLetter)]
    assert [e.kind for e in events] == ["impression" if isinstance(o, Impression) else "click" for o in out]
    assert {e.partition for e in events} == {0, 1}


def test_bad_lines_become_dead_letters_never_exceptions(tmp_path: Path) -> None:
    good = {"type": "click", "click_id": "c1", "impression_id": "i1", "ts": 1_767_225_600_000, "user_id": "u"}
    untagged = {k: v for k, v in good.items() if k != "type"}
    lines = [
        b"not json at all",
        b"[1, 2]",
        json.dumps({**good, "type": "view"}).encode(),
        b'{"type": "impression", "ts": "yesterday"}',
        b"\xff\xfe garbage",
        b"",
        b'{"type": "impression", "pad": "' + b"x" * 70_000 + b'"}',
        json.dumps(good).encode(),
        json.dumps(untagged).encode(),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = JsonlSource([path])
    events = read_all(source)
    out = validate_all(events, source)
    reasons = [o.reason if isinstance(o, DeadLetter) else type(o).__name__ for o in out]
    assert reasons == [
        "bad_json", "not_an_object", "unknown_field", "missing_field", "bad_encoding", "too_large",
        "Click", "Click",
    ]  # fmt: skip
    assert [e.offset for e in events] == [0, 1, 2, 3, 4, 6, 7, 8]  # line numbers; blank lines skipped


def test_a_corrupt_far_future_ts_does_not_move_the_clock(tmp_path: Path) -> None:
    ts = 1_767_225_600_000
    rows = [{"type": "click", "click_id": f"c{i}", "impression_id": f"i{i}", "ts": ts + i, "user_id": "u"}
            for i in range(5)]  # fmt: skip
    rows[2]["ts"] = ts * 1000  # microseconds by mistake
    path = tmp_path / "skewed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = JsonlSource([path])
    out = validate_all(read_all(source), source)
    assert source.clock.now_ms() == ts + 4
    assert [o.reason for o in out if isinstance(o, DeadLetter)] == ["ts_in_future"]


def test_avazu_hour_to_ms() -> None:
    assert avazu_hour_to_ms("14102100") == 1_413_849_600_000
    assert avazu_hour_to_ms("14102913") - avazu_hour_to_ms("14102100") == (8 * 24 + 13) * 3_600_000
    with pytest.raises(ValueError, match="YYMMDDHH"):
        avazu_hour_to_ms("2014-10-21")


@needs_avazu
def test_avazu_sample_gives_9999_impressions_1706_clicks_all_valid() -> None:
    source = AvazuCsvSource(AVAZU)
    events = read_all(source)
    imps = [val(e) for e in events if e.kind == "impression"]
    clicks = [val(e) for e in events if e.kind == "click"]
    assert (len(imps), len(clicks)) == (9_999, 1_706)
    assert not [o for o in validate_all(events, source) if isinstance(o, DeadLetter)]
    ts = [val(e)["ts"] for e in events]
    assert ts == sorted(ts) and ts[0] == avazu_hour_to_ms("14102100") and ts[-1] < ts[0] + 3_600_000 + 600_000
    imp_ts = {i["impression_id"]: i["ts"] for i in imps}
    assert all(0 < c["ts"] - imp_ts[c["impression_id"]] <= 600_000 for c in clicks)
    first = imps[0]
    assert first["user_id"] == "ddd2926e-44956a24" and first["item_id"] == "15706"
    assert first["features"]["device_ip"] == "ddd2926e" and "C14" not in first["features"]


@needs_avazu
def test_avazu_start_ms_moves_the_hour(tmp_path: Path) -> None:
    events = read_all(AvazuCsvSource(AVAZU, start_ms=1_767_225_600_000, batch_size=20_000))
    assert val(events[0])["ts"] == 1_767_225_600_000


def test_avazu_malformed_rows_are_dead_letters(tmp_path: Path) -> None:
    header = "id,click,hour,C1,banner_pos,C14,device_id,device_ip,device_model"
    path = tmp_path / "tiny.csv"
    path.write_text(
        f"{header}\n1,1,14102100,1005,0,15706,abc123,ip1,m1\n2,maybe,14102100,1005,0,1,a,b,c\n3,0,oops\n"
        "4,0,14102101,1005,0,15707,a99f214a,ip2,m2\n"
    )
    source = AvazuCsvSource(path)
    events = read_all(source)
    out = validate_all(events, source)
    kinds = [o.reason if isinstance(o, DeadLetter) else type(o).__name__ for o in out]
    assert sorted(kinds) == ["Click", "Impression", "Impression", "bad_json", "bad_json"]
    users = {e.value["user_id"] for e in events if isinstance(e.value, dict)}
    assert users == {"abc123", "ip2-m2"}


@pytest.mark.parametrize(
    "suffix, pack", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)]
)
def test_a_compressed_avazu_file_reads_as_the_csv(
    tmp_path: Path, suffix: str, pack: Callable[[bytes], bytes]
) -> None:
    header = "id,click,hour,C1,banner_pos,C14,device_id,device_ip,device_model"
    rows = [
        f"{i},{i % 3 == 0:d},1410210{i // 40},1005,0,157{i % 7},a99f214a,ip{i % 5},m{i % 4}"
        for i in range(80)
    ]
    plain = tmp_path / "train.csv"
    plain.write_text("\n".join([header, *rows, "81,0,oops"]) + "\n")
    packed = tmp_path / f"train{suffix}"  # Avazu ships train.gz
    packed.write_bytes(pack(plain.read_bytes()))
    want = [(e.kind, e.value) for e in read_all(AvazuCsvSource(plain, seed=3))]
    assert len(want) == 80 + 27 + 1  # impressions, clicks, the bad row
    assert [(e.kind, e.value) for e in read_all(AvazuCsvSource(packed, seed=3))] == want


def test_a_mapped_log_reads_as_the_canonical_one(sim_jsonl: list[Path], mapped_jsonl: list[Path]) -> None:
    canonical, mapped = JsonlSource(sim_jsonl), JsonlSource(mapped_jsonl, mapping=MAP)
    a, b = read_all(canonical), read_all(mapped)
    assert [(e.kind, e.value, e.key) for e in b] == [(e.kind, e.value, e.key) for e in a]
    assert not [o for o in validate_all(b, mapped) if isinstance(o, DeadLetter)]
    assert mapped.clock.now_ms() == canonical.clock.now_ms()
    unmapped = JsonlSource(mapped_jsonl)  # without the mapping every line is rejected
    assert all(isinstance(o, DeadLetter) for o in validate_all(read_all(unmapped), unmapped))


def test_mapping_renames_only_and_validation_still_rejects(tmp_path: Path) -> None:
    imp = {"impression_id": "i1", "ts": 1_767_225_600_000, "user_id": "alice", "item_id": "ad"}
    lines = [
        renamed("impression", imp),  # read
        {**renamed("impression", imp), "extra": 1},  # a field outside the schema
        {**renamed("impression", imp), "user_id": "bob"},  # uid -> user_id would collide
        {**renamed("impression", imp), "event_type": "view"},  # a tag value not mapped
        {"type": "impression", **imp},  # the canonical names always work
        {k: v for k, v in renamed("impression", imp).items() if k != "event_type"},  # untagged
    ]
    source = JsonlSource([write_lines(lines, tmp_path / "log.jsonl")], mapping=MAP)
    out = validate_all(read_all(source), source)
    details = [o.detail if isinstance(o, DeadLetter) else type(o).__name__ for o in out]
    assert details == [
        "Impression",
        "unknown field 'extra'",
        "unknown field 'uid'",
        "unknown field 'event_type'",
        "Impression",
        "Impression",
    ]


def test_mapping_pairs_files_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"type": "kind", "impression": ["imp", "view"], "user_id": "uid"}))
    m = JsonlMapping.parse(JsonlMapping.load(path))
    assert m.tags == ("kind", "type") and m.fields == {"uid": "user_id"}
    assert (m.kinds["view"], m.kinds["imp"], m.kinds["click"]) == ("impression", "impression", "click")
    assert JsonlMapping.parse([]).is_identity and not m.is_identity
    with pytest.raises(ValueError, match="unknown canonical name 'userid'"):
        JsonlMapping.parse(["userid=uid"])
    with pytest.raises(ValueError, match="canonical=raw"):
        JsonlMapping.parse(["user_id"])
    path.write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        JsonlMapping.load(path)


def test_impression_and_click_files_merge_on_event_time(split_jsonl: tuple[Path, Path]) -> None:
    source = merged(split_jsonl, batch_size=1_000)
    events = read_all(source)
    rows = list(Simulator(SPLIT_CFG, 23).stream(4_000))
    by_kind = {k: [e for kind, e in rows if kind == k] for k in ("impression", "click")}
    assert all(v == sorted(v, key=lambda e: e["ts"]) for v in by_kind.values())  # each file is in order
    expected = sorted(rows, key=lambda r: (r[1]["ts"], r[0] == "click"))  # ties: impressions first
    assert [
        (e.kind, json.loads(e.value) if isinstance(e.value, bytes) else e.value) for e in events
    ] == expected
    assert not [o for o in validate_all(events, source) if isinstance(o, DeadLetter)]
    assert source.clock.now_ms() == max(e["ts"] for _, e in rows)


def test_a_jsonl_line_may_name_the_record_key_it_was_produced_with(tmp_path: Path) -> None:
    path = tmp_path / "keyed.jsonl"
    click = {"click_id": "c1", "impression_id": "i1", "ts": 1_767_225_600_000, "user_id": "alice"}
    write_jsonl([("click", {**click, "kafka_key": "i1"}), ("click", {**click, "click_id": "c2"})], path)
    [first, second] = next(iter(JsonlSource([path]).batches()))
    assert (first.key, second.key) == (b"i1", b"alice")  # keyed by the impression id, then by user
    assert first.value == click  # the key is not part of the event
    assert isinstance(Validator(ValidationConfig()).validate(first), Click)
