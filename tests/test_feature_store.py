"""The Feast store: push streaming features, read them back from the online store, compare.

One embedded (SQLite) store per module, since importing and applying Feast takes seconds. The Redis
test starts its own ``redis-server`` on a free port, so the production profile's online store is
exercised for real (its drop-if-not-newer rule is exactly what the SQLite store does not have).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from feast import FeatureStore
from feast.data_source import PushMode

from features.aggregations import StreamingFeatures
from features.store import (
    FeatureWriter,
    OnlineFeatureReader,
    connect_store,
    open_store,
    redis_connection_string,
)
from pipeline.core.config import FeatureConfig

T0 = 1_767_225_600_000


@dataclass
class Env:
    store: FeatureStore
    writer: FeatureWriter
    reader: OnlineFeatureReader
    sf: StreamingFeatures = field(default_factory=lambda: StreamingFeatures(FeatureConfig()))
    last_ts: dict[str, int] = field(default_factory=dict)  # newest event per "u..." / "i..." id

    def play(self, n: int, start_ms: int, seed: int) -> None:
        rng = random.Random(seed)
        for k in range(n):
            user, item = f"u{rng.randrange(30)}", f"i{rng.randrange(20)}"
            ts = start_ms + k * 1_000 + rng.randrange(-20_000, 1)
            record = self.sf.record_click if rng.random() < 0.1 else self.sf.record_impression
            record(user, item, ts)
            for ident in (user, item):
                self.last_ts[ident] = max(self.last_ts.get(ident, 0), ts)

    def expected(self, user: str, item: str) -> dict[str, float]:
        """What the counters hold for (user, item), each entity as of its own newest event."""
        by_user = self.sf.lookup(user, "", self.last_ts[user]) if user in self.last_ts else {}
        by_item = self.sf.lookup("", item, self.last_ts[item]) if item in self.last_ts else {}
        d = self.sf.defaults()
        return {n: (by_user if n.startswith("user_") else by_item).get(n, d[n]) for n in d}


def _env(store: FeatureStore) -> Env:
    return Env(store, FeatureWriter(store), OnlineFeatureReader(store))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    e = _env(open_store(tmp_path_factory.mktemp("feast")))
    e.play(2_000, T0, seed=1)
    e.writer.push(*e.sf.drain_dirty())
    return e


def test_reader_returns_exactly_what_the_counters_had(env: Env) -> None:
    items = [f"i{k}" for k in range(20)]
    for user in ("u0", "u7", "u29"):
        assert env.reader.get(user, items) == [env.expected(user, i) for i in items]


def test_reader_agrees_with_get_online_features(env: Env) -> None:
    items = ["i3", "i4", "unknown-item"]
    got = env.reader.get("u1", items)
    raw = env.store.get_online_features(
        features=[f"user_stats:{n}" for n in env.sf.user_names]
        + [f"item_stats:{n}" for n in env.sf.item_names],
        entity_rows=[{"user_id": "u1", "item_id": i} for i in items],
    ).to_dict()
    for k in range(2):
        assert got[k] == {n: float(raw[n][k]) for n in env.reader.feature_names}
    assert all(raw[n][2] is None for n in env.sf.item_names)  # Feast: missing entity -> None


def test_unknown_entities_get_defaults(env: Env) -> None:
    d = env.sf.defaults()
    new_user, known_item = env.reader.get("never-seen", ["i2"])[0], env.expected("u0", "i2")
    assert {n: v for n, v in new_user.items() if n.startswith("user_")} == {
        n: v for n, v in d.items() if n.startswith("user_")
    }
    assert {n: v for n, v in new_user.items() if n.startswith("item_")} == {
        n: v for n, v in known_item.items() if n.startswith("item_")
    }
    assert env.reader.get("never-seen", ["nor-this"]) == [d] and env.reader.get("u0", []) == []


def test_repeated_pushes_with_same_and_newer_timestamps(env: Env) -> None:
    newest = max(env.last_ts.values())
    for _ in range(3):  # same millisecond again and again: drained stamps still move forward
        env.sf.record_impression("u5", "i5", newest)
        env.last_ts["u5"] = env.last_ts["i5"] = newest
        env.writer.push(*env.sf.drain_dirty())
        assert env.reader.get("u5", ["i5"]) == [env.expected("u5", "i5")]
    env.play(500, newest + 3_600_000, seed=2)  # an hour later: the 1 h windows roll over
    env.writer.push(*env.sf.drain_dirty())
    items = [f"i{k}" for k in range(20)]
    assert env.reader.get("u5", items) == [env.expected("u5", i) for i in items]


def test_offline_log_is_part_files_feast_can_join(env: Env) -> None:
    folder = Path(str(env.store.config.repo_path)) / "offline" / "user_stats"
    parts = sorted(p.name for p in folder.glob("part-*.parquet"))
    assert len(parts) >= 3 and parts[0].endswith("-schema.parquet")
    when = pd.Timestamp(max(env.last_ts.values()) + 10 * 3_600_000, unit="ms", tz="UTC")
    hist = env.store.get_historical_features(
        entity_df=pd.DataFrame({"user_id": ["u3"], "event_timestamp": [when]}),
        features=["user_stats:user_impressions_24h", "user_stats:user_ctr_24h"],
    ).to_df()
    exp = env.expected("u3", "")
    assert hist["user_impressions_24h"].iloc[0] == exp["user_impressions_24h"]
    assert hist["user_ctr_24h"].iloc[0] == exp["user_ctr_24h"]


def test_reopen_keeps_the_data(env: Env) -> None:
    repo = Path(str(env.store.config.repo_path))
    for store in (open_store(repo), connect_store(repo)):
        assert OnlineFeatureReader(store).get("u0", ["i1"]) == env.reader.get("u0", ["i1"])


def _open_repeatedly(repo: str, start: Any) -> None:
    start.wait()  # both processes have imported Feast: their set-ups overlap
    for _ in range(8):
        open_store(Path(repo))


def test_two_processes_setting_up_one_folder_at_once_both_succeed(tmp_path: Path) -> None:
    """Two daemons sharing a state folder start together (the two-joiner deployment): the set-up's
    files and Feast's registry must not be written by both at once."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_open_repeatedly, args=(str(tmp_path / "feast"), start)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0]
    assert not list((tmp_path / "feast").rglob("*.tmp"))  # every temporary file was renamed


_ROUND_TRIP = """
store = open_store(Path(sys.argv[1]))
sf = StreamingFeatures(FeatureConfig())
sf.record_click("u1", "i1", 1_767_225_600_000)
FeatureWriter(store).push(*sf.drain_dirty())
print(OnlineFeatureReader(store).get("u1", ["i1"])[0]["user_clicks_1h"])
"""
_IMPORTS = (
    "import sys; from pathlib import Path; from features.aggregations import StreamingFeatures; "
    "from features.store import FeatureWriter, OnlineFeatureReader, open_store; "
    "from pipeline.core.config import FeatureConfig\n"
)


def test_feast_comes_without_typeguards_instrumentation_and_our_calls_pass_its_checks(tmp_path: Path) -> None:
    """``features/__init__``: a process that imports Feast through this package skips typeguard's
    instrumentation of Feast (seconds per daemon start; ``benchmarks/startup.py`` measures them and
    fails if either way comes out otherwise); a process that imports Feast first keeps it, and there
    our definitions, the store's set-up, a push and a read pass Feast's type checks."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "startup.json"
    script = [sys.executable, str(root / "benchmarks" / "startup.py"), "--trials", "1", "--targets", "feast"]
    done = subprocess.run([*script, "--out", str(out)], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    feast = json.loads(out.read_text())["targets"]["feast"]
    assert len(feast["trials"]["as_run"]) == len(feast["trials"]["reference"]) == 1

    code = "import feast, features; print(features.feast_typechecked())\n" + _IMPORTS + _ROUND_TRIP
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "store")], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "1.0"]


def test_bad_arguments_fail_loudly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="redis_url"):
        open_store(tmp_path, profile="production")
    with pytest.raises(ValueError, match="project"):
        open_store(tmp_path, project="no-dashes")
    with pytest.raises(FileNotFoundError):
        connect_store(tmp_path / "nothing")
    assert redis_connection_string("redis://h:6380/2") == "h:6380,db=2"
    assert redis_connection_string("rediss://:p%40ss@h") == "h:6379,db=0,password=p@ss,ssl=true"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_redis_drops_rows_not_newer_and_drained_rows_are_always_newer(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    e = _env(open_store(tmp_path_factory.mktemp("feast-redis"), profile="production", redis_url=redis_url))
    e.play(1_000, T0, seed=3)
    e.writer.push(*e.sf.drain_dirty())
    items = [f"i{k}" for k in range(20)]
    assert e.reader.get("u2", items) == [e.expected("u2", i) for i in items]
    # Feast's rule: a row whose timestamp is not newer than the stored one is skipped silently
    stale = {n: 999 if "_ctr_" not in n else 0.5 for n in e.sf.user_names}
    ts = datetime.fromtimestamp(e.last_ts["u2"] / 1000, UTC)
    e.store.push(
        "user_stats_push",
        pd.DataFrame([{"user_id": "u2", "event_timestamp": ts, **stale}]),
        to=PushMode.ONLINE,
    )
    assert e.reader.get("u2", ["i0"]) == [e.expected("u2", "i0")]
    # same-millisecond updates through drain_dirty are stamped newer, so they land
    e.sf.record_click("u2", "i0", e.last_ts["u2"])
    e.writer.push(*e.sf.drain_dirty())
    assert e.reader.get("u2", ["i0"]) == [e.expected("u2", "i0")]
