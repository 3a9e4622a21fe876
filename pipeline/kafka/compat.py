"""A fix for a kafka-python 3.0.x group-join defect, applied when :mod:`pipeline.kafka.client` is imported.

**The defect.** ``BaseCoordinator.join_group_async`` keeps a JoinGroup/SyncGroup attempt running
when ``poll(timeout_ms)`` expires mid-attempt, and re-awaits it on the next poll only
``while self.need_rejoin()``. A rejoin that the *consumer* coordinator asked for because the topic
metadata or the subscription changed stops being "needed" as soon as the attempt starts: the leader
copies the metadata snapshot in ``_perform_assignment`` and ``group_protocols`` copies the
subscription. So a poll that times out between JoinGroup and the SyncGroup response leaves the
attempt's assignment unapplied for good: the member keeps its old assignment (empty at start-up)
while the broker believes it owns the partitions, and nobody reads them. It shows on a busy host
whenever a consumer meets fresh topics (their metadata arrives after the first join) with short
polls; reproduced against the real broker by
``tests/integration/test_kafka_io.py::test_a_topic_created_after_subscribing_is_assigned_despite_short_polls``.

**The fix.** A join attempt in flight is itself a reason to rejoin: ``need_rejoin()`` is also true
while ``_join_task`` is set (kafka-python clears it when an attempt completes or fails), so the next
poll awaits the attempt and applies its assignment. The patch checks that the attribute it relies on
exists and does nothing otherwise (a kafka-python that reworked the join path).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from kafka.coordinator.base import BaseCoordinator
from kafka.coordinator.consumer import ConsumerCoordinator

__all__ = ["patch_join_in_flight"]

log = logging.getLogger(__name__)


@functools.cache
def patch_join_in_flight() -> bool:
    """Make an in-flight join attempt count as a needed rejoin; True if the patch was applied."""
    if "_join_task" not in BaseCoordinator.__init__.__code__.co_names:
        log.info("kafka-python keeps no _join_task: the join-in-flight patch does not apply")
        return False
    original = ConsumerCoordinator.need_rejoin

    @functools.wraps(original)
    def need_rejoin(self: Any) -> bool:
        if getattr(self, "_join_task", None) is not None:
            return True
        return bool(original(self))

    ConsumerCoordinator.need_rejoin = need_rejoin
    return True
