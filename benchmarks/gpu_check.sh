#!/usr/bin/env bash
# One short GPU check of the trainer, for a session that is lent a CUDA machine (the device tool's
# H200: no network there, python3 already holds torch and numpy). From the repository root:
#
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=540)
#
# 1. creates a venv over the image's python3 (--system-site-packages: torch comes from the image,
#    nothing is downloaded) and puts this checkout on its path;
# 2. the trainer's CPU-only tests of the CUDA decisions, then the same training step on CUDA:
#    one block learned with torch.cuda.set_sync_debug_mode("warn"), which must warn exactly once
#    (the block's loss, read at the end), and the learner's AUC on held-out rows;
# 3. benchmarks/train.py on cuda (DeepFM and DCN-V2, batches 1k..64k, 2^24 rows) and prints its JSON.
# Everything it writes goes to ${OUT:-/tmp/gpu-check} (the device tool brings $OUT back).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
venv=/tmp/ctr-gpu-venv
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
py="$venv/bin/python"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

echo "== CUDA decisions and row-wise Adam (CPU tests)"
"$py" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_trainer_perf.py -k "not benchmark" 2>&1 | tail -3 || true

echo "== one block on CUDA: host syncs and learning"
"$py" - <<'EOF' 2>&1 | tee "$out/cuda_step.txt"
import warnings, numpy as np, torch
from pipeline.core.config import TrainerConfig
from trainers.learner import TorchLearner
from trainers.encoding import Encoder
from trainers.metrics import auc
from trainers.testing import synthetic_examples
train, test = synthetic_examples(20_000, seed=1), synthetic_examples(5_000, seed=2)
cfg = TrainerConfig(hash_buckets=1 << 20, batch_size=512, batch_size_cuda=2048, device="cuda")
learner = TorchLearner(cfg, Encoder(1 << 20).fit(train))
block = learner.encode(train)
learner.learn(block[:4096])  # warm-up: optimizer state, cuBLAS handles
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    loss = learner.learn(block)
    torch.cuda.set_sync_debug_mode("default")
syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
print(f"steps={learner.steps} loss={loss:.4f} host_syncs_in_block={len(syncs)}", syncs[:3])
enc_test = learner.encode(test)
a = auc(enc_test.labels, learner.predict(enc_test))
print(f"held-out AUC on CUDA: {a:.4f}")
assert len(syncs) == 1, "the hot loop synchronised with the host"
assert a > 0.6, "the CUDA trainer did not learn"
EOF

echo "== benchmarks/train.py on cuda"
"$py" benchmarks/train.py --devices cuda --rows $((1 << 24)) --steps 8 --repeats 2 --out "$out/train-cuda.json"
cat "$out/train-cuda.json"
