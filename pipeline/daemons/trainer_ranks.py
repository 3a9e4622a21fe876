"""`ctr trainer` on several ranks (``torchrun``; ``trainer.ranks``): rank 0 is the daemon, the rest follow.

Each rank holds its share of the model's hashed tables (:mod:`trainers.sharding`) and every rank
must run the same training steps on the same examples. Rank 0 is :class:`TrainerDaemon` as in one
process: it alone reads Kafka, checkpoints, talks to MLflow and Redis, and answers systemd. Before
each ``IncrementalTrainer.add`` it hands the examples to the other ranks (:class:`Leader`), which
run the same ``add`` (:func:`follow`); so the blocks, the gate's decisions and the lineage are
the ones of one process, and each accepted block is one registered version.

Whatever the trainer asks the model store is answered by rank 0 and shared (:class:`LeaderStore`,
:class:`MirrorStore`): where the alias points, the versions it registered; a version adopted after a
rollback is downloaded by rank 0 and its files sent to every rank. Every published model is first
gathered whole on rank 0 (``TorchLearner.unsharded``), so what is checkpointed and registered is an
ordinary model that any single process (a serving replica, a restart with other ranks) loads.

Messages go over the process group itself (``broadcast_object_list``, pickled; only our own
processes are in it). A follower waits for rank 0 however long a block takes to fill
(:data:`WAIT`); if any rank dies, the launcher (``pipeline/ops/ranks.py``, or torchrun) stops the
others, and the restart resumes every rank from rank 0's checkpoint.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from pipeline.core.config import Config
from pipeline.core.events import LabelledExample
from pipeline.daemons.idempotent_store import IdempotentStore
from trainers.incremental import BlockReport, IncrementalTrainer
from trainers.learner import TorchLearner
from trainers.sharding import join_launched_group

__all__ = ["WAIT", "Leader", "LeaderStore", "MirrorStore", "follow", "join"]

WAIT = timedelta(days=365)  # a collective waits this long for the other ranks (a quiet stream)


def share(obj: Any = None) -> Any:
    """Rank 0's ``obj``, on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def share_folder(folder: Path | None, dst: Path) -> Path | None:
    """Rank 0's ``folder`` (its files; None: no folder), copied into ``dst`` on the other ranks."""
    files = None
    if folder is not None:
        files = {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}
    files = share(files)
    if files is None:
        return None
    if folder is not None:
        return folder
    for rel, data in files.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(data)
    return dst


def _empty(folder: Path) -> Path:
    """``folder``, emptied: one copy of an adopted version at a time, not one per rollback."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def join(cfg: Config) -> int | None:
    """This process's rank under torchrun (after joining the group); None in a single process."""
    sharding = join_launched_group(cfg.trainer.device, timeout=WAIT)
    return None if sharding is None else sharding.rank


class LeaderStore:
    """Rank 0's model store: the daemon's, with every answer the trainer acts on shared."""

    def __init__(self, inner: IdempotentStore, scratch: Path) -> None:
        self.inner, self.scratch = inner, scratch

    def resolve(self, alias: str) -> str | None:
        return share(self.inner.resolve(alias))

    def load(self, version: str) -> TorchLearner:
        dst = _empty(self.scratch / "adopting")
        folder = share_folder(self.inner.download(version, dst), dst)
        assert folder is not None
        return TorchLearner.load(folder)

    def publish(self, model: TorchLearner, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        whole = model.unsharded(self.scratch / "publish")
        assert whole is not None
        return share(self.inner.publish(whole, lineage, metrics))

    def set_alias(self, alias: str, version: str) -> None:
        self.inner.set_alias(alias, version)


class MirrorStore:
    """A follower's model store: rank 0's answers, in the order the trainer asks."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def resolve(self, alias: str) -> str | None:
        return share()

    def load(self, version: str) -> TorchLearner:
        folder = share_folder(None, _empty(self.scratch / "adopting"))
        assert folder is not None
        return TorchLearner.load(folder)

    def publish(self, model: TorchLearner, lineage: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
        model.unsharded(self.scratch / "publish")  # this rank's rows, gathered on rank 0
        return share()

    def set_alias(self, alias: str, version: str) -> None:
        """Rank 0 moves it."""


class Leader:
    """What the daemon on rank 0 tells the other ranks."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = _empty(scratch)  # a previous run's copies go

    def store(self, inner: IdempotentStore) -> LeaderStore:
        return LeaderStore(inner, self.scratch)

    def start(self, learner_dir: Path | None, trainer: IncrementalTrainer) -> None:
        """The champion the daemon resumed from (its checkpoint folder) and the block count."""
        share({"version": trainer.champion_version, "blocks": trainer.blocks})
        share_folder(learner_dir, self.scratch)

    def add(self, examples: Sequence[LabelledExample], position: Any) -> None:
        share(("add", list(examples), position))

    def stop(self) -> None:
        share(("stop", None, None))


def _mirror(trainer: IncrementalTrainer, report: BlockReport, scratch: Path) -> None:
    """What the daemon does with a block's report that takes every rank: checkpointing a champion
    adopted after a rollback (``TrainerDaemon._block_done``) gathers its tables."""
    if report.adopted_version is not None and report.version is None:
        assert trainer.champion is not None
        trainer.champion.save(scratch / "adopted")


def follow(cfg: Config) -> dict[str, int]:
    """A follower rank's life: resume as rank 0 did, then learn what it hands over until it stops.

    SIGTERM and SIGINT are left to rank 0, which finishes its block (with this rank) and says stop.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with tempfile.TemporaryDirectory(prefix="ctr-trainer-rank-") as tmp:
        scratch = Path(tmp)
        start = share()
        folder = share_folder(None, scratch / "champion")
        champion = None if folder is None else TorchLearner.load(folder)
        if champion is not None:
            champion.version = start["version"]
        trainer = IncrementalTrainer(
            cfg.trainer,
            MirrorStore(scratch),
            alias=cfg.registry.champion_alias,
            champion=champion,
            resume=False,
            label_delay_ms=cfg.joiner.label_delay_ms,
            serves_offset=True,  # rank 0 scores what it buffers for the live offset: every rank takes part
        )
        trainer.blocks = start["blocks"]
        while True:
            what, examples, position = share()
            if what == "stop":
                return {"blocks": trainer.blocks}
            for report in trainer.add(examples, position=position):
                _mirror(trainer, report, scratch)
