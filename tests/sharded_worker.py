"""One rank of tests/test_sharding.py, run by torchrun (or alone, as the single-process reference).

``python tests/sharded_worker.py OUT [RESUME]``: a small model (``WORKER_MODEL``, default DeepFM;
``WORKER_MIN_COUNT``: frequency admission) learns blocks of a synthetic stream,
scoring each block before learning it, and saves itself to ``OUT/model``; rank 0 writes what it
saw to ``OUT/result.json`` (every rank's local table rows go to ``OUT/rows-<rank>.json``). With
``RESUME`` (a saved learner) it loads that and learns the next blocks instead of starting fresh.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def main(out: Path, resume: Path | None) -> None:
    from pipeline.core.config import TrainerConfig
    from trainers.encoding import Encoder
    from trainers.learner import TorchLearner
    from trainers.sharding import ShardedRows, join_launched_group
    from trainers.testing import synthetic_examples

    join_launched_group("cpu")
    torch.set_num_threads(1)
    model, min_count = os.environ.get("WORKER_MODEL", "deepfm"), int(os.environ.get("WORKER_MIN_COUNT", "0"))
    cfg = TrainerConfig(
        model=model,  # type: ignore[arg-type]
        min_count=min_count,
        hash_buckets=1 << 12,
        embedding_dim=4,
        hidden=(8,),
        batch_size=128,
        device="cpu",
        seed=3,
        threads=1,
    )
    examples = synthetic_examples(5000, seed=5)
    blocks = [examples[i : i + 1000] for i in range(0, 5000, 1000)]
    if resume is None:
        learner, todo = TorchLearner(cfg, Encoder.for_trainer(cfg).fit(blocks[0])), blocks[:3]
    else:
        learner, todo = TorchLearner.load(resume), blocks[3:]
    result: dict[str, list[object]] = {"loss": [], "predictions": []}
    for block in todo:
        result["predictions"].append(learner.predict(block).tolist())
        result["loss"].append(learner.learn(block))
    learner.save(out / "model")
    rank = int(os.environ.get("RANK", "0"))
    rows = {n: m.num_embeddings for n, m in learner.model.named_modules() if isinstance(m, ShardedRows)}
    (out / f"rows-{rank}.json").write_text(json.dumps(rows))
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
