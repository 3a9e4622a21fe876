"""One opener for every input a replay or ``ctr produce --source`` reads: ``open_source(cfg, format, path)``.

Formats: JSONL (renamed by ``cfg.jsonl``, one stream or impressions and clicks in two), Avazu's
CSV, Criteo's TSV, Open Bandit's CSVs, Parquet, and the simulator. Labelled logs (Avazu, Criteo,
OBD) become impressions plus clicks a lognormal delay later (``cfg.backtest.click_delay_*``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.config import Config
from pipeline.core.types import Source
from pipeline.sources.avazu import AvazuCsvSource
from pipeline.sources.files import with_compression
from pipeline.sources.jsonl_mapping import JsonlMapping
from pipeline.sources.parquet import ParquetSource
from pipeline.sources.readers import ClickDelay, CriteoTsvSource, ObdCsvSource
from pipeline.sources.streams import JsonlSource, MergedJsonlSource, SimulatorSource
from pipeline.sources.worlds import open_world

__all__ = ["FORMATS", "open_jsonl", "open_source"]

FORMATS = ("jsonl", "avazu", "criteo", "obd", "parquet", "simulator")
_SUFFIXES = {
    "jsonl": with_compression((".jsonl",)),
    "criteo": (".txt", ".tsv", ".gz", ".bz2", ".xz"),
    "parquet": (".parquet",),
}


def _files(path: Path, fmt: str) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_SUFFIXES[fmt]))
    if not files:
        raise FileNotFoundError(f"backtest: no {'/'.join(_SUFFIXES[fmt])} files in {path}")
    return files


def open_jsonl(cfg: Config, path: Path, clicks: Path | None = None) -> Source:
    """JSONL input renamed by ``cfg.jsonl`` (:mod:`pipeline.sources.jsonl_mapping`): one stream, or
    impressions and clicks in two (``clicks``, or a folder of ``impression*`` and ``click*`` files)
    merged on event time; an untagged line of such a file is of the file's kind."""
    mapping = JsonlMapping.from_config(cfg.jsonl)
    files = _files(path, "jsonl")
    click_files = _files(clicks, "jsonl") if clicks is not None else []
    if clicks is None and path.is_dir():
        click_files = [f for f in files if f.name.lower().startswith("click")]
        imps = [f for f in files if f.name.lower().startswith("imp")]
        if click_files and imps and len(click_files) + len(imps) < len(files):
            other = ", ".join(f.name for f in files if f not in click_files and f not in imps)
            raise ValueError(f"backtest: {path} holds click* and impression* files and also {other}")
        click_files, files = (click_files, imps) if click_files and imps else ([], files)
    if not click_files:
        return JsonlSource(files, mapping=mapping)
    parts = [JsonlSource(files, mapping=mapping, kind="impression")]
    return MergedJsonlSource([*parts, JsonlSource(click_files, mapping=mapping, kind="click")])


def open_source(
    cfg: Config,
    fmt: str,
    path: Path | None,
    *,
    seed: int,
    impressions: int,
    clicks: Path | None = None,
    world: str = "simulator",
) -> Source:
    """The source for ``--format``: a file or folder, or the simulator (``impressions``, ``seed``;
    ``world``: another of :mod:`pipeline.sources.worlds`); ``clicks``: a JSONL file or folder of
    clicks to merge with ``path``'s impressions."""
    if fmt != "jsonl" and clicks is not None:
        raise ValueError(f"backtest: --clicks is for --format jsonl, not {fmt}")
    if fmt == "simulator":
        return SimulatorSource(open_world(world, seed, cfg.simulator), impressions)
    if fmt not in FORMATS:
        raise ValueError(f"backtest: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if path is None or not path.exists():
        raise FileNotFoundError(f"backtest: --source {path} does not exist (needed for --format {fmt})")
    if clicks is not None and not clicks.exists():
        raise FileNotFoundError(f"backtest: --clicks {clicks} does not exist")
    b = cfg.backtest
    delay = ClickDelay(b.click_delay_median_s, b.click_delay_sigma, b.click_delay_max_s)
    if fmt in ("avazu", "criteo", "obd") and delay.max_s > cfg.joiner.attribution_window_s:
        raise ValueError(
            f"backtest: click_delay_max_s {delay.max_s:g} exceeds the attribution window "
            f"{cfg.joiner.attribution_window_s:g}s: known positives would become negatives"
        )
    if fmt == "avazu":
        return AvazuCsvSource(
            path,
            click_delay_median_s=delay.median_s,
            click_delay_max_s=delay.max_s,
            click_delay_sigma=delay.sigma,
            seed=seed,
        )
    if fmt == "obd":
        return ObdCsvSource(path, delay=delay, seed=seed)
    if fmt == "criteo":
        return CriteoTsvSource(
            _files(path, fmt),
            start_ms=b.criteo_start_ms,
            rows_per_s=b.criteo_rows_per_s,
            user_field=b.criteo_user_field,
            item_field=b.criteo_item_field,
            delay=delay,
            seed=seed,
        )
    if fmt == "parquet":  # renamed only when asked (`[jsonl] map`, --map): names are the schema's
        renames = cfg.jsonl.map or cfg.jsonl.map_file
        return ParquetSource(
            _files(path, fmt), mapping=JsonlMapping.from_config(cfg.jsonl) if renames else None
        )
    return open_jsonl(cfg, path, clicks)
