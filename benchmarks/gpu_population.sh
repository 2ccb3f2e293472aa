#!/usr/bin/env bash
# A population on one GPU: MEMBERS members of the tiny model (the demo's RL config from a
# random policy, benchmarks/configs/grpo_arith_scratch.py) against one solo run of it, each
# in its own process, wall time with start-up and compiles included; the population with
# each member's own update and with population.batched_update (one vmapped update). JSON
# under $OUT.
#
#   bash benchmarks/gpu_population.sh                      # ~4 min on one H200
#   STEPS=3 MEMBERS=2 bash benchmarks/gpu_population.sh    # a smoke run (CPU: minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/gpu}
PY=${PY:-python3}
STEPS=${STEPS:-60}
MEMBERS=${MEMBERS:-16}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
if compgen -G ".whl/*.whl" >/dev/null && ! "$PY" -c "import grain, ml_collections" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
timeout "${LIMIT:-330}" "$PY" -m benchmarks.population --scratch --members "$MEMBERS" \
  --solo-runs 1 --steps "$STEPS" --both --workdir /tmp/population_gpu \
  --out "$OUT/population_${MEMBERS}.json" >"$OUT/population.log" 2>&1
status=$?
tail -4 "$OUT/population.log"
exit $status
