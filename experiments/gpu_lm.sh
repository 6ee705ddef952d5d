#!/usr/bin/env bash
# The language-model table at nanoGPT's size (`small`: 6 x 384, context 256, 10.65M parameters)
# on one GPU: the variants of configs/variants/lm.py that the targets read, 8 workers
# simulated on the GPU, then each method's step against AdamW's and the targets. Never a test
# dependency; run it where a GPU is lent:
#
#   OUT=/some/dir bash experiments/gpu_lm.sh
#
# PY is a Python with jaxdist[train] and a CUDA jax (pip install -e '.[train,cuda]').
# Budgeted for about 9 minutes of GPU time: STEPS steps a variant (600: 6 variants took
# 400-450 s of an H200 with their compiles), each variant under its own timeout (VARIANT_S
# seconds), so that a cut leaves the finished variants' runs; the table is then made of those.
# The warm start (diloco50_warm) and M = 1 (diloco50_m1) are left out at this budget: they need
# the 2,500 steps of the CPU table. QUICK=1 runs the same commands at runlocal size on whatever
# device there is, to check them before GPU time is spent. Writes $OUT/lm_small.md,
# $OUT/step_lm_small.md, $OUT/lm_targets_small.md and a log of each step.
set -uo pipefail
PY=${PY:-python3}
: "${OUT:?set OUT}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
VARIANTS=(bsp int8_allreduce diloco50 streaming48_fp8 sparseloco50 demo)
if [ "${QUICK:-0}" = 1 ]; then
  CONFIG=configs/shakespeare_gpt.py:runlocal
  STEPS=${STEPS:-4} VARIANT_S=${VARIANT_S:-300} BENCH_S=${BENCH_S:-300}
  EVERY=2
  BENCH=(--lm_config=shakespeare_gpt.py:runlocal --lm_steps=2 --repeats=1 --lm=bsp,diloco10
         --lm_trainer_steps=6)
else
  CONFIG=configs/shakespeare_gpt.py:small
  STEPS=${STEPS:-600} VARIANT_S=${VARIANT_S:-80} BENCH_S=${BENCH_S:-60}
  EVERY=100
  BENCH=(--lm_config=shakespeare_gpt.py:small --lm=bsp,diloco50,streaming48_fp8,sparseloco50,demo
         --lm_trainer_steps=0)
fi
RUN=(--config="$CONFIG" --variants=configs/variants/lm.py --workdir="$OUT/workdir"
     --config.progress=False --config.steps="$STEPS" --config.eval_every="$EVERY"
     --config.checkpoint_every="$STEPS")
{ date -u; nvidia-smi 2>/dev/null || true; $PY -c 'import jax; print(jax.__version__, jax.devices())'; } \
  > "$OUT/env.log" 2>&1
finished=()
for v in "${VARIANTS[@]}"; do
  start=$(date +%s)
  timeout "$VARIANT_S" $PY experiments/compare.py "${RUN[@]}" --only="$v" > "$OUT/compare_$v.log" 2>&1
  rc=$?
  echo "$v: rc $rc, $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
  [ -f "$OUT/workdir/$v/summary.json" ] && finished+=("$v")
done
if [ ${#finished[@]} -gt 0 ]; then  # the table of the finished runs (each resumes at its end)
  only=$(IFS=,; echo "${finished[*]}")
  $PY experiments/compare.py "${RUN[@]}" --only="$only" --results="$OUT/lm_small.md" \
    > "$OUT/compare.log" 2>&1
fi
timeout "$BENCH_S" $PY experiments/bench_step.py --nolayouts --scaling= --overhead_params= \
  "${BENCH[@]}" --results="$OUT/step_lm_small.md" > "$OUT/bench.log" 2>&1
echo "bench: rc $?" | tee -a "$OUT/steps.log"
$PY experiments/lm_targets.py --workdir="$OUT/workdir" --steps="$OUT/step_lm_small.md" \
  --results="$OUT/lm_targets_small.md" > "$OUT/targets.log" 2>&1
echo "wrote $OUT/lm_small.md, $OUT/step_lm_small.md and $OUT/lm_targets_small.md (${finished[*]})"
