#!/usr/bin/env bash
# The mixture-of-experts figures and checks on one GPU (docs/models.md), as steps, each with
# its own time limit and its log under $OUT:
#   experts         the experts' grouped-matmul form against the one-hot dense form (forward +
#                   gradient, up to a Qwen3-30B-A3B layer's shape at 1,024 tokens)   ~100 s
#   mismatch        the bf16 rollout / update log-prob mismatch of a tiny MoE without routing
#                   replay, with R3 and with R2 (benchmarks/moe_replay_mismatch.py, JSON)
#   tests_highest   tests/models/test_moe.py in f32 with JAX_DEFAULT_MATMUL_PRECISION=highest
#   tests_default   the same at the backend's default matmul precision (TF32 on an H200):
#                   which of the f32 tolerances hold there
#
#   bash benchmarks/gpu_moe.sh                                        # every step, ~5 min
#   STEPS="mismatch tests_highest tests_default" bash benchmarks/gpu_moe.sh   # < 4 min
#
# Packages the GPU image lacks (grain, ml_collections and their needs) travel as wheels in
# .whl/ (git-ignored), installed into /tmp/site first, as in gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
STEPS=${STEPS:-experts mismatch tests_highest tests_default}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null && [[ ":${PYTHONPATH:-}:" != *":/tmp/site:"* ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
failed=0
step() {  # step NAME SECONDS COMMAND...: run it when NAME is in $STEPS
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  timeout "$seconds" "$@" >"$OUT/moe_$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 8 "$OUT/moe_$name.log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}
tests=(-m pytest -v -p no:cacheprovider --durations=5 tests/models/test_moe.py)
step experts 150 "$PY" benchmarks/moe_experts.py --reps 20 \
  --shapes tiny,small,qwen3_30b_a3b_layer_1k
step mismatch 80 "$PY" benchmarks/moe_replay_mismatch.py --seeds 3 \
  --out "$OUT/moe_replay_mismatch_h200.json"
step tests_highest 65 env JAX_DEFAULT_MATMUL_PRECISION=highest "$PY" "${tests[@]}"
step tests_default 65 env -u JAX_DEFAULT_MATMUL_PRECISION "$PY" "${tests[@]}"
exit $failed
