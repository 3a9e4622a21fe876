"""`ctr rollback`: move the champion alias to an older version, record who, when and why, push it.

A rollback is what an operator does in the MLflow UI (model page -> version -> aliases -> move
``champion``), plus a record and a push:

1. the target must be a registered version of the model (anything else is refused with the list of
   versions), and the reason must not be empty;
2. the alias moves (the one write that matters: replicas poll it, the trainer checks it before
   every block, see :mod:`trainers.alias_guard`);
3. the swap notification goes out on Redis (:data:`serving_bridge.server.NOTIFY_CHANNEL`), so every
   replica checks the alias now instead of at its next poll;
4. who, when, why and the version it replaced are written as tags on the target version
   (``rollback.by``, ``rollback.at``, ``rollback.reason``, ``rollback.from``) and on the registered
   model (``last_rollback.*`` with ``last_rollback.to``), so the MLflow UI shows them.

The alias moves before the tags are written: a failure in between leaves a rollback without its
record (reported on stderr), never a record of a rollback that did not happen.
"""

from __future__ import annotations

import getpass
import logging
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mlflow.exceptions import MlflowException

from serving_bridge.server import NOTIFY_CHANNEL
from trainers.model_registry import ModelRegistry

if TYPE_CHECKING:
    from trainers.registry import MlflowModelStore

__all__ = [
    "ModelRegistry",
    "RollbackError",
    "RollbackRecord",
    "announce_champion_moved",
    "default_operator",
    "rollback",
]

log = logging.getLogger(__name__)
TAG_PREFIX = "rollback."  # on the target version
MODEL_TAG_PREFIX = "last_rollback."  # on the registered model


class RollbackError(ValueError):
    """A refused rollback (unknown version, no reason, ...: nothing changed) or one whose record
    could not be written after the alias moved; the message says which."""


@dataclass(frozen=True)
class RollbackRecord:
    """What one rollback did: the alias moved from ``previous`` to ``version``."""

    model: str
    alias: str
    version: str
    previous: str | None
    by: str
    at: str  # ISO 8601, UTC
    reason: str
    announced: bool  # whether the Redis push went out (replicas still poll without it)

    def tags(self) -> dict[str, str]:
        """The version tags of this rollback (the model tags are these with ``last_`` and ``to``)."""
        return {
            f"{TAG_PREFIX}by": self.by,
            f"{TAG_PREFIX}at": self.at,
            f"{TAG_PREFIX}reason": self.reason,
            f"{TAG_PREFIX}from": self.previous or "none",
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_operator() -> str:
    """``user@host`` of whoever runs the command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def announce_champion_moved(redis_url: str | None) -> bool:
    """Publish the swap notification replicas listen to; False (logged) if Redis is unreachable."""
    if not redis_url:
        return False
    try:
        import redis

        client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.publish(NOTIFY_CHANNEL, b"1")
        finally:
            client.close()
    except Exception:  # replicas still poll the alias; a missed push costs one poll interval
        log.warning("rollback: could not announce the move on Redis %s", redis_url, exc_info=True)
        return False
    return True


def rollback(
    store: ModelRegistry | MlflowModelStore,
    to: str,
    reason: str,
    *,
    alias: str = "champion",
    by: str | None = None,
    redis_url: str | None = None,
) -> RollbackRecord:
    """Point ``alias`` of ``store``'s model at version ``to``, announce it and tag who/when/why.

    Raises :class:`RollbackError` (nothing changed) for an empty reason, an unknown model or
    version, or a version the alias already names.
    """
    target = str(to).strip()
    why = reason.strip()
    if not why:
        raise RollbackError("a rollback needs a reason (--reason TEXT): it is recorded on the version")
    versions = store.versions()
    if not versions:
        raise RollbackError(f"model '{store.name}' has no versions at {store.tracking_uri}")
    if target not in versions:
        raise RollbackError(
            f"model '{store.name}' has no version {target!r}; its versions are {', '.join(versions)}"
        )
    previous = store.resolve(alias)
    if previous == target:
        raise RollbackError(f"alias '{alias}' of model '{store.name}' already points at version {target}")
    store.set_alias(alias, target)
    announced = announce_champion_moved(redis_url)
    record = RollbackRecord(
        model=store.name,
        alias=alias,
        version=target,
        previous=previous,
        by=by or default_operator(),
        at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        reason=why,
        announced=announced,
    )
    client = store.client
    try:
        for key, value in record.tags().items():
            client.set_model_version_tag(store.name, target, key, value)
        model_tags = {k.replace(TAG_PREFIX, MODEL_TAG_PREFIX, 1): v for k, v in record.tags().items()}
        for key, value in (model_tags | {f"{MODEL_TAG_PREFIX}to": target}).items():
            client.set_registered_model_tag(store.name, key, value)
    except MlflowException as exc:
        raise RollbackError(
            f"alias '{alias}' now points at version {target}, but recording the rollback failed: {exc}"
        ) from exc
    log.info("rollback: %s@%s %s -> %s by %s: %s", store.name, alias, previous, target, record.by, why)
    return record
