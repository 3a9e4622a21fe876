"""Validation over the hostile corpus (tests/hostile.py): every refused event gets the reason the
corpus expects, and the events the joiner's rules handle pass validation. The same corpus goes
through real Kafka topics and a `ctr joiner` process in tests/integration/test_hostile_input.py."""

from __future__ import annotations

from collections import Counter

from pipeline.core.config import ValidationConfig
from pipeline.core.events import REASONS, DeadLetter
from pipeline.core.types import ManualClock, RawEvent
from pipeline.core.validation import Validator
from tests.hostile import corpus

NOW = 1_796_083_200_000  # 2026-12-01


def test_every_refused_event_gets_the_expected_reason() -> None:
    c = corpus(NOW, NOW - 45 * 60_000, valid=1_000, hostile=10_000, seed=3)
    validator = Validator(ValidationConfig(), ManualClock(NOW))
    reasons: Counter[str] = Counter()
    for kind, _, value in c.events:
        out = validator.validate(RawEvent(kind, value, "test"))  # never raises
        if isinstance(out, DeadLetter):
            assert out.detail and len(out.raw) <= 1_024
            reasons[out.reason] += 1
    expected = {f: n for f, n in c.fates.items() if f in REASONS and f != "user_mismatch"}
    assert dict(reasons) == expected
    # the corpus covers every reason but the joiner's and the partition check's (one partition here)
    joiners = {"user_mismatch", "orphan_click", "orphan_conversion"}
    assert set(expected) >= set(REASONS) - joiners - {"wrong_partition"}
    assert c.hostile == 10_000
