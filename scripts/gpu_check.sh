#!/usr/bin/env bash
# The GPU figures of docs/performance.md ("On a GPU") as one prepared run on one H200, for a
# ~0.5B (Qwen2.5-0.5B-shaped) model in bf16, then the model and sampler tests on the GPU.
# Every step has its own time limit, so one slow step cannot eat the others; each writes its
# JSON and log under $OUT.
#
#   bash scripts/gpu_check.sh                      # versions,sampler,train,rl,tests (~8 min)
#   bash scripts/gpu_check.sh versions,options     # only these steps
#   SMOKE=1 bash scripts/gpu_check.sh              # the same steps at CPU sizes (a few minutes)
#
# Steps: versions (packages, devices), sampler (tokens/s vs transformers generate, roofline),
# options (XLA command-buffer options for the rollout programs and the once-per-rollout weight
# cast, side by side), profile (a decode step's kernels from a device trace: time and launches
# per step, at 256 rows), train (MFU), rl (one GRPO step), tests (model and sampler tests
# on the GPU). The next lent GPU: `versions,options,profile,sampler` (what session 7 could not
# measure: the once-per-rollout weight cast, and where the 256-row step's time goes).
#
# Packages the GPU image lacks (grain, ml_collections and their two missing needs) travel as
# wheels in .whl/ (git-ignored; see the device tool's README for the pip download line) and
# are installed into /tmp/site first. Step failures are reported and the run goes on; the exit
# status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-versions,sampler,train,rl,tests}
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9

if [ -z "${SMOKE:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then  # py3.12 wheels
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# Rollout programs compiled with each set of XLA options (Sampler(compiler_options=)), the
# first the baseline: do kernel launches bound a decode step at small batch?
OPTIONS='{"xla_default": {}, "no_command_buffers": {"xla_gpu_enable_command_buffer": ""},
  "graphs_min1": {"xla_gpu_graph_min_graph_size": 1},
  "graphs_while": {"xla_gpu_enable_command_buffer":
    "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE", "xla_gpu_graph_min_graph_size": 1}}'
if [ -n "${SMOKE:-}" ]; then  # CPU sizes: checks the script, not the machine
  SAMPLER="--models tiny --batches 16 --new-tokens 16 --repeats 2 --roofline-batch 32 --roofline-new-tokens 8"
  AB="--models tiny --batches 16 --new-tokens 16 --repeats 2"
  TRAIN="--models 25m --batches 25m=2 --seq 128 --variants rl_fused --repeats 2 --memory-batch 0"
  PROFILE="--models tiny --batches 16 --new-tokens 8 --repeats 2"
  LIMIT=600
else
  SAMPLER="--models 0.5b --batches 16,64,256 --new-tokens 128 --dtype bfloat16 --repeats 3 --roofline-batch 256 --roofline-new-tokens 32 --peak-n 8192"
  AB="--models 0.5b --batches 16 --new-tokens 128 --dtype bfloat16 --repeats 3"
  # batch 8: at 16 x 1024 tokens the plain variant's f32 [B, T, V] logits need 66 GiB of temps
  TRAIN="--models 0.5b --batches 0.5b=8 --seq 1024 --dtype bfloat16 --variants rl_fused,rl_plain --repeats 3 --matmul-n 8192 --memory-batch 0"
  PROFILE="--models 0.5b --batches 256 --new-tokens 32 --dtype bfloat16 --repeats 3"
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
# Decode tokens/s vs transformers generate (on the GPU when torch sees one) and the roofline.
step sampler 230 "$PY" scripts/bench.py sampler $SAMPLER --out "$OUT/bench_sampler_gpu.json"
# ... and the bf16 weights cast at every use against once per rollout (cast_weights_once)
step options 230 "$PY" scripts/bench.py sampler $AB --ab-only --options-ab "$OPTIONS" --cast-ab \
  --out "$OUT/bench_options_gpu.json"
# A decode step's kernels, from a device trace (bench_profile.py): launch- or kernel-bound?
step profile 150 "$PY" scripts/bench.py profile $PROFILE --trace-dir /tmp/jaxrl_trace \
  --out "$OUT/bench_profile_gpu.json"
# Train-step MFU against an 8192^2 matmul peak timed in the same run.
step train 160 "$PY" scripts/bench.py train $TRAIN --out "$OUT/bench_train_gpu.json"
# One full GRPO step of ours on the tiny model (TRL is not in the GPU image).
step rl 50 "$PY" scripts/bench.py rl --no-trl --steps 5 --out "$OUT/bench_rl_gpu.json"
# Correctness on the GPU: the model against transformers and the sampler's tests, in f32 at
# full matmul precision (on a GPU, XLA may run f32 matmuls in TF32 by default).
step tests 75 env JAX_DEFAULT_MATMUL_PRECISION=highest "$PY" -m pytest -v -x -p no:cacheprovider \
  tests/test_transformer.py tests/test_sampling.py
echo "== done: $failed failed step(s); JSON and logs in $OUT"
exit $failed
