"""The trainer's respect for a manual rollback: never move an alias someone else has moved.

An operator rolls back by pointing the champion alias at an older version (in the MLflow UI or with
``ctr rollback``). Before each block, :func:`adopt_moved_alias` resolves the alias; if it no longer
names the version the trainer promoted (or resumed from), the move is logged and the alias's version
is loaded as the trainer's champion. That block is then scored progressively by the rolled-back
champion, the candidate is fine-tuned from it and the gate compares the two on the same holdout, so
only a candidate that beats the rolled-back version moves the alias again. The trainer's own newer
line is dropped on purpose: an operator who rolls back may know something the gate cannot see.

:func:`move_alias_unless_moved` resolves the alias once more just before moving it: if it left the
version the candidate was gated against during the block, the candidate stays registered but the
alias is left alone (the next block adopts the new target). MLflow has no compare-and-set on
aliases, so a move in the few milliseconds between that check and the write can still be lost.

>>> from trainers.testing import InMemoryModelStore
>>> store = InMemoryModelStore()
>>> store.models.update({"1": None, "2": None}); store.set_alias("champion", "1")
>>> move_alias_unless_moved(store, "champion", "2", gated_against="1")
True
>>> store.set_alias("champion", "1")  # an operator rolls back while version 3 trains
>>> move_alias_unless_moved(store, "champion", "3", gated_against="2"), store.resolve("champion")
(False, '1')
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

__all__ = ["adopt_moved_alias", "move_alias_unless_moved"]

log = logging.getLogger(__name__)


class _Store(Protocol):
    def resolve(self, alias: str) -> str | None: ...

    def load(self, version: str) -> Any: ...

    def set_alias(self, alias: str, version: str) -> None: ...


def adopt_moved_alias(store: _Store, alias: str, ours: str | None) -> Any | None:
    """The learner of the version ``alias`` names if that is not ``ours``; None if it still is.

    Only once the trainer has a registered champion (``ours``): before that it promoted nothing (a
    trainer that should start from the alias is built with ``resume=True``). A deleted alias is not
    a rollback: None, and the trainer's next accepted candidate sets it again.
    """
    if ours is None:
        return None
    current = store.resolve(alias)
    if current is None or current == ours:
        return None
    log.warning(
        "trainer: alias '%s' points at version %s, not %s which this trainer promoted: someone moved it "
        "(a rollback); adopting version %s as the champion and gating every candidate against it",
        alias,
        current,
        ours,
        current,
    )
    learner = store.load(current)
    learner.version = current
    return learner


def move_alias_unless_moved(store: _Store, alias: str, version: str, gated_against: str | None) -> bool:
    """Point ``alias`` at ``version`` unless it has left ``gated_against``; True if it moved it.

    ``gated_against`` None (there was no champion to gate against) moves the alias unconditionally.
    """
    if gated_against is not None:
        current = store.resolve(alias)
        if current is not None and current != gated_against:
            log.warning(
                "trainer: alias '%s' moved to version %s while version %s was gated against %s; "
                "version %s is registered but the alias stays on %s",
                alias,
                current,
                version,
                gated_against,
                version,
                current,
            )
            return False
    store.set_alias(alias, version)
    return True
