#!/usr/bin/env bash
# The GPU figures of docs/performance.md ("On a GPU") as one prepared run on one GPU, for a
# ~0.5B (Qwen2.5-0.5B-shaped) model in bf16, then the model and sampler tests on the GPU.
# Every step has its own time limit, so one slow step cannot eat the others; each writes its
# JSON and log under $OUT.
#
#   bash benchmarks/gpu_check.sh                      # versions,sampler,smollm2,train,rl,tests (~10 min)
#   bash benchmarks/gpu_check.sh versions,profile      # only these steps
#   SMOKE=1 bash benchmarks/gpu_check.sh              # the same steps at CPU sizes (minutes)
#
# Steps: versions (packages, devices), sampler (tokens/s vs transformers generate, each in
# its own process, and the 256-row decode step against its roofline), profile (a decode
# step's kernels from a device trace: time and launches per step, at 256 rows), train (MFU),
# rl (one GRPO step of ours), tests (model and sampler tests on the GPU); on request: spread
# (padded vs packed rows, `train.pack_tokens`) and spread_tests.
#
# Packages the GPU image lacks (grain, ml_collections and their two missing needs) travel as
# wheels in .whl/ (git-ignored; see the device tool's README for the pip download line) and
# are installed into /tmp/site first. Step failures are reported and the run goes on; the exit
# status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."  # the repository root: `python -m benchmarks.bench` from here
STEPS=${1:-versions,sampler,smollm2,train,rl,tests}
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9

if [ -z "${SMOKE:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then  # py3.12 wheels
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [ -n "${SMOKE:-}" ]; then  # CPU sizes: checks the script, not the machine
  SAMPLER="--config=benchmarks/configs/random_qwen2.py:tiny --config.rollout.max_new_tokens=16 --batches 16 --repeats 2 --roofline-batch 32 --roofline-new-tokens 8"
  TRAIN="--models 25m --batches 25m=2 --seq 128 --variants rl_fused,rl_fused+dpa --repeats 2 --memory-batch 0 --profile"
  PROFILE="--config=benchmarks/configs/random_qwen2.py:tiny --batches 16 --new-tokens 8 --repeats 2"
  SMOLLM2="--config=benchmarks/configs/random_qwen2.py:tiny --config.rollout.max_new_tokens=8 --batches 16 --repeats 2 --roofline-batch 0 --memory-roofline-batch 16"
  SMOLLM2_TRAIN="--models tiny --batches tiny=2 --seq 128 --variants rl_fused --repeats 2 --memory-batch 0"
  LIMIT=600
else
  SAMPLER="--config=benchmarks/configs/random_qwen2.py:0.5b --batches 16,64,256 --repeats 3 --roofline-batch 256 --roofline-new-tokens 32 --peak-n 8192"
  # batch 8: at 16 x 1024 tokens the plain variant's f32 [B, T, V] logits need 66 GiB of temps
  # the update with each attention implementation (einsums, jax.nn.dot_product_attention,
  # cuDNN's fused kernel) and unrolled layers, each profiled by kind of op
  TRAIN="--models 0.5b --batches 0.5b=8 --seq 1024 --dtype bfloat16 --variants rl_fused,rl_plain,rl_fused+dpa,rl_fused+cudnn,rl_fused+unroll --repeats 3 --matmul-n 8192 --memory-batch 0 --profile"
  PROFILE="--config=benchmarks/configs/random_qwen2.py:0.5b --batches 256 --new-tokens 32 --repeats 3"
  # SmolLM2-135M's shape (random weights: the GPU has no checkpoint file), f32 then bf16
  SMOLLM2="--config=benchmarks/configs/random_qwen2.py:smollm2 --batches 16,64 --repeats 3 --roofline-batch 0 --memory-roofline-batch 16"
  SMOLLM2_TRAIN="--models smollm2 --batches smollm2=16 --seq 512 --variants rl_fused --repeats 3 --matmul-n 8192 --memory-batch 0 --profile"
  LIMIT=0
fi

failed=0
step() {  # step NAME SECONDS COMMAND...: run if NAME is in $STEPS, with a time limit
  local name=$1 seconds=$2
  shift 2
  [[ ",$STEPS," == *",$name,"* ]] || return 0
  [ "$LIMIT" -gt 0 ] && seconds=$LIMIT
  echo "== $name (limit ${seconds}s): $*"
  local t0=$SECONDS
  timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 5 "$OUT/$name.log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

step versions 30 "$PY" -c "
import importlib.metadata as m, jax
for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'grain', 'ml_collections', 'torch', 'transformers'):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, 'missing')
print(jax.devices())"
# Decode tokens/s vs transformers generate (each in its own process; on the GPU when torch
# sees one) and the roofline.
step sampler 300 "$PY" -m benchmarks.bench sampler $SAMPLER --out "$OUT/sampler_0.5b_gpu.json"
# The same at SmolLM2-135M's shape: f32, bf16 weights, the bf16 sampler beside f32 weights
# (rollout.dtype), and its update's MFU (bf16).
step smollm2 400 bash -c "'$PY' -m benchmarks.bench sampler $SMOLLM2 --out '$OUT/sampler_smollm2_f32_gpu.json' && \
  '$PY' -m benchmarks.bench sampler $SMOLLM2 --config.model.dtype=bfloat16 --out '$OUT/sampler_smollm2_bf16_gpu.json' && \
  '$PY' -m benchmarks.bench sampler $SMOLLM2 --no-hf --config.rollout.dtype=bfloat16 --out '$OUT/sampler_smollm2_rollout_bf16_gpu.json' && \
  '$PY' -m benchmarks.bench train $SMOLLM2_TRAIN --dtype bfloat16 --out '$OUT/train_smollm2_gpu.json'"
# A decode step's kernels, from a device trace (decode_profile.py): launch- or kernel-bound?
step profile 150 "$PY" -m benchmarks.bench profile $PROFILE --trace-dir /tmp/jaxrl_trace \
  --out "$OUT/profile_0.5b_gpu.json"
# Train-step MFU against an 8192^2 matmul peak timed in the same run.
step train 300 "$PY" -m benchmarks.bench train $TRAIN --out "$OUT/train_0.5b_gpu.json"
# One full GRPO step of ours on the tiny model (TRL is not in the GPU image).
step rl 90 "$PY" -m benchmarks.bench rl --no-trl --steps 5 --out "$OUT/rl_tiny_gpu.json"
# Packed against padded rows on spread completions (train_spread.py; not in the default
# steps: `bash benchmarks/gpu_check.sh spread`), then the packing tests on the GPU.
step spread 400 "$PY" -m benchmarks.bench train --workload spread --steps 5 --warmup 2 \
  --out "$OUT/train_spread_gpu.json"
step spread_tests 150 env JAX_DEFAULT_MATMUL_PRECISION=highest "$PY" -m pytest -q -x \
  -p no:cacheprovider tests/rl/learn/test_packing.py
# Correctness on the GPU: the model against transformers and the sampler's tests, in f32 at
# full matmul precision (on a GPU, XLA may run f32 matmuls in TF32 by default).
step tests 75 env JAX_DEFAULT_MATMUL_PRECISION=highest "$PY" -m pytest -v -x -p no:cacheprovider \
  tests/models/test_transformer.py tests/sampling/test_sampler.py
echo "== done: $failed failed step(s); JSON and logs in $OUT"
exit $failed
