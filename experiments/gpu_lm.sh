#!/usr/bin/env bash
# The language-model table at nanoGPT's size (`small`: 6 x 384, context 256, 10.65M parameters)
# on one GPU: every variant of configs/variants/lm.py, 8 workers simulated on the GPU, and each
# method's step against AdamW's. Never a test dependency; run it where a GPU is lent:
#
#   OUT=/some/dir bash experiments/gpu_lm.sh
#
# PY is a Python with jaxdist[train] and a CUDA jax (pip install -e '.[train,cuda]');
# QUICK=1 runs the same commands at runlocal size on whatever device there is, to check them
# before GPU time is spent. Writes $OUT/lm_small.md (the table), $OUT/step_lm_small.md and a
# log of each step.
set -euo pipefail
PY=${PY:-python3}
: "${OUT:?set OUT}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${QUICK:-0}" = 1 ]; then
  CONFIG=configs/shakespeare_gpt.py:runlocal
  EXTRA=(--config.steps=4 --config.eval_every=2 --config.checkpoint_every=4)
  BENCH=(--lm_config=shakespeare_gpt.py:runlocal --lm_steps=2 --repeats=1 --lm=bsp,diloco10)
else
  CONFIG=configs/shakespeare_gpt.py:small
  EXTRA=()
  BENCH=(--lm_config=shakespeare_gpt.py:small --lm=all)
fi
{ date -u; nvidia-smi 2>/dev/null || true; $PY -c 'import jax; print(jax.__version__, jax.devices())'; } \
  > "$OUT/env.log" 2>&1
$PY experiments/compare.py --config="$CONFIG" --variants=configs/variants/lm.py \
  --workdir="$OUT/workdir" --config.progress=False --results="$OUT/lm_small.md" "${EXTRA[@]}" \
  > "$OUT/compare.log" 2>&1
$PY experiments/bench_step.py --nolayouts --scaling= --overhead_params= "${BENCH[@]}" \
  --results="$OUT/step_lm_small.md" > "$OUT/bench.log" 2>&1
echo "wrote $OUT/lm_small.md and $OUT/step_lm_small.md"
