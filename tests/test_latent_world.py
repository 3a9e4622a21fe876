"""benchmarks/latent_world.py: a valid stream in ``ctr simulate``'s format, the same for a seed."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core.events import Click, DeadLetter, Impression
from pipeline.sources.streams import JsonlSource
from tests.test_readers import validate_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.latent_world import write


def test_every_event_is_valid_and_a_seed_gives_the_same_stream(tmp_path: Path) -> None:
    a, b, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    n, clicks = write(a, seed=3, impressions=2_000)
    write(b, seed=3, impressions=2_000)
    write(other, seed=4, impressions=2_000)
    assert a.read_bytes() == b.read_bytes() != other.read_bytes()
    events = validate_all(JsonlSource([a]))
    assert not [e for e in events if isinstance(e, DeadLetter)]
    imps = {e.impression_id: e for e in events if isinstance(e, Impression)}
    attributed = [e for e in events if isinstance(e, Click)]
    assert (len(imps), len(attributed)) == (n, clicks) and 20 < clicks < 200  # ~3.4 %
    assert all(c.impression_id in imps and c.ts >= imps[c.impression_id].ts for c in attributed)
    assert {e.features["page"][0] for e in imps.values()} == {"p"} and len(
        {e.item_id for e in imps.values()}
    ) > 100
