#!/usr/bin/env bash
# The GPU figures of the model families and the packed update, as one prepared run on one
# GPU (docs/performance.md, docs/models.md): padded vs packed rows for a Qwen2.5-0.5B-shaped
# policy in bf16 (the update's useful tokens/s and MFU), the MoE experts' grouped vs dense
# matmuls and the bf16 routing-replay mismatch (gpu_moe.sh), then the Gemma, MoE and packing
# tests on the GPU. Each step has its own time limit and writes its log under $OUT.
#
#   bash benchmarks/gpu_families_packing.sh          # ~10 min on an H200
#
# Packages the GPU image lacks (grain, ml_collections and their needs) travel as wheels in
# .whl/ (git-ignored), installed into /tmp/site first, as in gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"
failed=0
step() {  # step NAME SECONDS COMMAND...
  local name=$1 seconds=$2 t0=$SECONDS
  shift 2
  timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 6 "$OUT/$name.log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}
step spread_0.5b 300 "$PY" -m benchmarks.bench train --workload spread --spread-shape 0.5b \
  --steps 3 --warmup 1 --out "$OUT/train_spread_0.5b_h200.json"
step moe 220 env OUT="$OUT" STEPS="experts mismatch" bash benchmarks/gpu_moe.sh
step family_tests 110 env JAX_DEFAULT_MATMUL_PRECISION=highest "$PY" -m pytest -q \
  tests/models/test_gemma.py tests/models/test_moe.py tests/rl/learn/test_packing.py
exit $failed
