#!/usr/bin/env bash
# The mixture-of-experts figures on one GPU (docs/models.md): the experts' grouped-matmul
# form against the one-hot dense form (forward + gradient, up to a Qwen3-30B-A3B layer's
# shape at 1,024 tokens), and the bf16 rollout / update log-prob mismatch of a tiny MoE with
# and without routing replay on the GPU's kernels. Each step writes its log under $OUT.
#
#   bash benchmarks/gpu_moe.sh          # ~3 min
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false
failed=0
timeout 300 "$PY" benchmarks/moe_experts.py --reps 20 \
  --shapes tiny,small,qwen3_30b_a3b_layer_1k 2>&1 | tee "$OUT/moe_experts.log" || failed=$((failed + 1))
timeout 300 "$PY" benchmarks/moe_replay_mismatch.py --seeds 3 2>&1 \
  | tee "$OUT/moe_replay_mismatch.log" || failed=$((failed + 1))
exit $failed
