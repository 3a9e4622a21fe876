"""A/B split: which arm (champion or challenger) scores a user, by a stable hash of the user id.

The same user always lands in the same arm for a given share (no flicker between requests or
replicas), and raising the share only moves users from champion to challenger, never back:
a user is in the challenger arm iff its hash bucket in [0, 1) is below the share.

>>> arm_of("user-1", 0.0), arm_of("user-1", 1.0)
('champion', 'challenger')
>>> all(arm_of(f"u{i}", 0.3) == arm_of(f"u{i}", 0.3) for i in range(100))
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from serving_bridge.replica import Replica, ScoreResult

__all__ = ["ARMS", "ABRouter", "arm_of", "bucket_of"]

ARMS = ("champion", "challenger")
_SALT = b"ctr-ab-v1"  # changing it reshuffles every user between the arms


def bucket_of(user_id: str) -> float:
    """A stable, uniform number in [0, 1) for ``user_id`` (the same in every process)."""
    digest = hashlib.blake2b(user_id.encode(), digest_size=8, key=_SALT).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def arm_of(user_id: str, challenger_share: float) -> str:
    """``"challenger"`` for a ``challenger_share`` of users, ``"champion"`` for the rest."""
    if challenger_share <= 0.0:
        return "champion"
    return "challenger" if bucket_of(user_id) < challenger_share else "champion"


class ABRouter:
    """Scores each request with the arm its user falls in; champion and challenger swap independently.

    ``challenger`` is a second :class:`Replica` watching the challenger alias. While that alias is
    unset (or its version not loaded yet) every user is scored by the champion, and the response
    says so: ``arm`` always names the model that actually scored.
    """

    def __init__(
        self, champion: Replica, challenger: Replica | None = None, challenger_share: float = 0.0
    ) -> None:
        if not 0.0 <= challenger_share <= 1.0:
            raise ValueError(f"serving.challenger_share = {challenger_share} must be within [0, 1]")
        self.champion = champion
        self.challenger = challenger
        self.challenger_share = challenger_share if challenger is not None else 0.0

    @property
    def replicas(self) -> list[Replica]:
        return [self.champion] + ([self.challenger] if self.challenger is not None else [])

    @property
    def ready(self) -> bool:
        return self.champion.ready

    def notify(self) -> None:
        for r in self.replicas:
            r.notify()

    def start(self) -> ABRouter:
        for r in self.replicas:
            r.start()
        return self

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    def score(
        self, user_id: str, context: Mapping[str, str], item_ids: Sequence[str]
    ) -> tuple[ScoreResult, str]:
        """(result, arm); raises RuntimeError if no model is loaded yet."""
        replica, arm = self.arm(user_id)
        return replica.score(user_id, context, item_ids), arm

    async def ascore(
        self,
        user_id: str,
        context: Mapping[str, str],
        item_ids: Sequence[str],
        dense: Sequence[Mapping[str, float]] | None = None,
    ) -> tuple[ScoreResult, str]:
        """:meth:`score` for a caller on the event loop (:meth:`Replica.ascore`)."""
        replica, arm = self.arm(user_id)
        return await replica.ascore(user_id, context, item_ids, dense), arm

    def arm(self, user_id: str) -> tuple[Replica, str]:
        """The replica that scores ``user_id`` and its arm's name."""
        challenger = self.challenger
        if (
            challenger is not None
            and challenger.ready
            and arm_of(user_id, self.challenger_share) == "challenger"
        ):
            return challenger, "challenger"
        return self.champion, "champion"
