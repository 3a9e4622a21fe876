"""The source contract: batches of :class:`RawEvent`, and a snapshot that resumes exactly.

:func:`check_source` is for sources that replay a finite input in process (files, the simulator):
``make_source(resume)`` builds one, ``resume=None`` from the start. :func:`check_group_source` is
for Kafka consumer-group sources, which never end and resume by a commit (same group) or a seek
(a checkpoint's offsets, any group).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pipeline.checks._common import fail, impl_name
from pipeline.core.types import RawEvent, Source

__all__ = ["check_group_source", "check_source", "raw_event_positions"]

SourceFactory = Callable[[dict[str, Any] | None], Any]
# one delivered item as (where, offset, content): where = "topic:partition" for Kafka
Position = tuple[str, int, Any]


def _events(impl: str, batches: Iterable[Any]) -> list[RawEvent]:
    out: list[RawEvent] = []
    for i, batch in enumerate(batches):
        if not isinstance(batch, list):
            fail(impl, "batches are lists of RawEvent", f"batch {i} is a {type(batch).__name__}")
        for e in batch:
            if not isinstance(e, RawEvent) or e.kind not in ("impression", "click", "conversion"):
                fail(impl, "batches are lists of RawEvent", f"batch {i} holds {e!r:.200}")
        out.extend(batch)
    return out


def _json_snapshot(impl: str, snap: Any, when: str) -> dict[str, Any]:
    """The snapshot as a checkpoint file gives it back (what a restart resumes from)."""
    try:
        back = json.loads(json.dumps(snap))
    except (TypeError, ValueError) as exc:
        fail(impl, "snapshot() is JSON-serialisable", f"{when}: {exc} in {snap!r:.300}")
    if not isinstance(back, dict):
        fail(impl, "snapshot() is JSON-serialisable", f"{when}: a {type(snap).__name__}, not a dict")
    return back


def _compare(impl: str, rule: str, got: Sequence[Any], want: Sequence[Any], when: str) -> None:
    """``got == want``, else a failure counting what was lost and what repeated, and where."""
    if list(got) == list(want):
        return
    g, w = Counter(map(repr, got)), Counter(map(repr, want))
    lost, extra = sum((w - g).values()), sum((g - w).values())
    first = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want))
    )
    fail(
        impl,
        rule,
        f"{when}: {len(got)} events instead of {len(want)}; {lost} lost, {extra} repeated or unexpected; "
        f"first difference at position {first}: got {got[first] if first < len(got) else 'nothing'!r:.200}, "
        f"expected {want[first] if first < len(want) else 'nothing'!r:.200}",
    )


def check_source(
    make_source: SourceFactory, *, after_batches: Sequence[int] = (1, 3), name: str | None = None
) -> None:
    """Check a finite source against the :class:`pipeline.core.types.Source` contract.

    Rules: it is a ``Source``; every batch is a list of :class:`RawEvent`; two fresh sources deliver
    the same events; ``snapshot()`` is JSON-serialisable and calling it changes nothing; a source
    built with ``resume=`` a snapshot taken after batch ``k`` (for each ``k`` in ``after_batches``)
    delivers exactly the events after it, none lost, none repeated, its clock starting where the
    first one's was; a snapshot taken at the end resumes to nothing. The input must give more
    batches than ``max(after_batches)``.
    """
    whole = make_source(None)
    impl = impl_name(whole, name)
    if not isinstance(whole, Source):
        fail(impl, "implements pipeline.core.types.Source", "needs clock, batches() and snapshot()")
    batches = list(whole.batches())
    full = _events(impl, batches)
    if len(batches) <= max(after_batches):
        fail(
            impl, "the check's input is large enough", f"{len(batches)} batches, need > {max(after_batches)}"
        )
    _compare(
        impl,
        "a fresh source replays the same events",
        _events(impl, make_source(None).batches()),
        full,
        "twice",
    )
    end = _json_snapshot(impl, whole.snapshot(), "at the end")
    _compare(
        impl,
        "resume delivers exactly the rest",
        _events(impl, make_source(end).batches()),
        [],
        "from the end",
    )
    for k in after_batches:
        first = make_source(None)
        it = first.batches()
        head = _events(impl, (next(it) for _ in range(k)))
        snap = _json_snapshot(impl, first.snapshot(), f"after batch {k}")
        if _json_snapshot(impl, first.snapshot(), f"after batch {k}") != snap:
            fail(impl, "snapshot() has no effect", f"two calls after batch {k} differ")
        resumed = make_source(snap)
        at = resumed.clock.now_ms()
        if at != first.clock.now_ms():
            fail(
                impl,
                "a resumed clock starts where the snapshot was taken",
                f"after batch {k}: {at} != {first.clock.now_ms()}",
            )
        rest = _events(impl, resumed.batches())
        _compare(
            impl,
            "resume delivers exactly the rest",
            head + rest,
            full,
            f"resumed after batch {k} ({snap!r:.200})",
        )
        if resumed.clock.now_ms() != whole.clock.now_ms():
            fail(
                impl,
                "a resumed clock ends where an uninterrupted one does",
                f"after batch {k}: {resumed.clock.now_ms()} != {whole.clock.now_ms()}",
            )


def raw_event_positions(batch: Any) -> list[Position]:
    """Where each event of a :class:`KafkaEventSource` batch came from, and what it was."""
    _events("KafkaEventSource", [batch])
    return [(f"{e.source}:{e.partition}", e.offset, (e.kind, e.key, e.value)) for e in batch]


def _drain(
    src: Any,
    until: int,
    positions: Callable[[Any], list[Position]],
    timeout_s: float,
    idle_polls: int,
) -> list[Position]:
    """Items until ``until`` arrived, then ``idle_polls`` more polls that must bring nothing."""
    got: list[Position] = []
    deadline = time.monotonic() + timeout_s
    idle = 0
    for batch in src.batches():
        got += positions(batch)
        if len(got) > until:
            break
        if len(got) == until:
            idle += 1
            if idle > idle_polls:
                break
        if time.monotonic() > deadline:
            break
    return got


def _by_partition(items: Iterable[Position]) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for where, offset, content in items:
        out[where].append((offset, content))
    return dict(out)


def check_group_source(
    make_source: Callable[[str], Any],
    groups: tuple[str, str],
    expected: int,
    *,
    after_batches: int = 2,
    positions: Callable[[Any], list[Position]] = raw_event_positions,
    timeout_s: float = 60.0,
    idle_polls: int = 2,
    name: str | None = None,
) -> None:
    """Check a consumer-group source (:mod:`pipeline.kafka.io`) over topics holding ``expected`` records.

    ``make_source(group_id)`` builds a member of that group; ``groups`` are two fresh group ids;
    ``positions(batch)`` lists ``(topic:partition, offset, content)`` per item (default: a batch is
    a list of :class:`RawEvent`). Rules: every record arrives once, in offset order per partition;
    ``snapshot()`` after ``after_batches`` non-empty batches is JSON-serialisable; ``commit`` of it
    commits it all; a new member of the same group then delivers exactly the rest (commit-based
    resume), and so does a member of a group that never committed, after ``seek(snapshot)``.
    """
    g_commit, g_seek = groups

    def read(group: str, until: int, seek: dict[str, Any] | None = None) -> list[Position]:
        src = make_source(group)
        try:
            if seek is not None:
                src.seek(seek)
            return _drain(src, until, positions, timeout_s, idle_polls)
        finally:
            src.close()

    probe = make_source(g_seek)
    impl = impl_name(probe, name)
    try:
        full = _drain(probe, expected, positions, timeout_s, idle_polls)
    finally:
        probe.close()  # nothing committed: g_seek stays a group that never committed
    whole = _by_partition(full)
    unordered = sorted(p for p, items in whole.items() if items != sorted(items, key=lambda i: i[0]))
    if len(full) != expected or unordered:
        fail(
            impl,
            "every record arrives once, in offset order",
            f"{len(full)} items of {expected} produced; out of offset order in {unordered or 'none'}",
        )
    src = make_source(g_commit)
    try:
        head: list[Position] = []
        it, done = src.batches(), 0
        deadline = time.monotonic() + timeout_s
        while done < after_batches:  # idle polls ([]) do not count
            if time.monotonic() > deadline:
                fail(impl, "delivers what was produced", f"only {len(head)} items within {timeout_s:g} s")
            got = positions(next(it))
            if got:
                head, done = head + got, done + 1
        snap = _json_snapshot(impl, src.snapshot(), f"after {after_batches} batches")
        committed = src.commit(snap)
        if committed != snap:
            fail(impl, "commit(snapshot) commits all of it", f"committed {committed}, snapshot {snap}")
    finally:
        src.close()
    if len(head) >= expected:
        fail(
            impl, "the check's input is large enough", f"{after_batches} batches held all {expected} records"
        )
    for how, rest in (
        ("a new member of the committed group", read(g_commit, expected - len(head))),
        ("a fresh group after seek(snapshot)", read(g_seek, expected - len(head), seek=snap)),
    ):
        resumed = _by_partition(head + rest)
        if resumed != whole:
            lost = sum(len({o for o, _ in whole[p]} - {o for o, _ in resumed.get(p, [])}) for p in whole)
            extra = len(head) + len(rest) - expected + lost
            fail(
                impl,
                "resume delivers exactly the rest",
                f"{how}, from {snap}: {lost} records lost, {extra} repeated or unexpected",
            )
