#!/usr/bin/env bash
# Issue 14: the GPU figures, in one call of the workplace's device tool (a one-GPU machine).
#
# Run from the repository root with OUT set to the folder the logs go to:
#   OUT=/some/dir COMMIT=$(git rev-parse HEAD) bash experiments/results/gpu/gpu_run.sh
# There, python3 is the machine's own (jax with CUDA, flax, optax, orbax); what jaxdist
# needs beyond it travels as wheels in .whl/ (see the device README) and goes to /tmp/site:
# the versions of .venv, downloaded for cp312 with pip download --no-deps --only-binary=:all:
#   ml_collections 1.1.0, tensorflow-datasets 4.9.10, array_record 0.8.6, dm-tree 0.1.10,
#   immutabledict 4.3.1, promise 2.3 (sdist only: built here with pip wheel), simple-parsing
#   0.1.9, docstring_parser 0.18.0, tensorflow-metadata 1.21.0, googleapis-common-protos
#   1.76.0, termcolor 3.3.0, toml 0.10.2, tensorboardX 2.6.5, importlib_resources 7.1.0,
#   kneed 0.8.6 (every binary needs it: jaxdist.control imports scavenger, which imports
#   kneed), protobuf 7.36.2 (to /tmp/pb, used only if the machine's is too old);
#   .whl_pinned/: flax 0.12.8, optax 0.2.8, orbax-checkpoint 0.12.8 (pyproject's pins), used
#   only if make run fails with the machine's own.
# jaxdist is not installed (pyproject pins jax 0.10): PYTHONPATH=. instead.
# STEPS='bench_step_resnet20 bench_compress' runs only the steps named (env.log is always written).
# QUICK=1 PY=.venv/bin/python SKIP_INSTALL=1 runs every step at toy sizes on a CPU, to check
# the command lines before device time is spent on them.
#
# Logs: env.log (date, nvidia-smi, versions, a copy-bandwidth reference), then one log per
# step, each starting with the command it ran: bench_step_resnet20.log, bench_compress.log,
# make_run.log and make_run_table.md (the run's compare.md), bench_step_cnn.log.
set -u
PY=${PY:-python3}
QUICK=${QUICK:-0}
BUDGET=${BUDGET:-570}  # seconds for all steps; each step's timeout is cut to what is left
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"
env_log=$OUT/env.log

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  pipi() { $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$@"; }
  # shellcheck disable=SC2046
  pipi --target /tmp/site $(ls .whl/*.whl | grep -v /protobuf-) || exit 1
  pipi --target /tmp/pb .whl/protobuf-*.whl || exit 1
  pipi --target /tmp/pinned .whl_pinned/*.whl || exit 1
fi
path=.:/tmp/site
# the machine's own protobuf, unless it is too old for tensorflow_metadata's generated code
if ! PYTHONPATH=$path $PY -c 'from tensorflow_metadata.proto.v0 import schema_pb2' \
  >"$OUT/protobuf_check.txt" 2>&1; then
  path=.:/tmp/site:/tmp/pb
fi
check='import jax, flax, optax, orbax.checkpoint, ml_collections, tensorboardX, kneed
import tensorflow_datasets as tfds
import jaxdist.train.compare, jaxdist.data.digits, jaxdist.control'
PYTHONPATH=$path $PY -c "$check" >"$OUT/import_check.txt" 2>&1
export PYTHONPATH=$path

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: ${COMMIT:-unknown}"
  echo "PYTHONPATH: $PYTHONPATH"
  echo "protobuf check with the machine's protobuf (empty: it served):"
  sed 's/^/  /' "$OUT/protobuf_check.txt" | tail -3
  echo "import check (empty: every import worked):"
  sed 's/^/  /' "$OUT/import_check.txt" | tail -5
  rm -f "$OUT/protobuf_check.txt" "$OUT/import_check.txt"
  echo '--- nvidia-smi'
  nvidia-smi 2>&1 || echo 'nvidia-smi: not available'
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory \
    --format=csv 2>&1 || true
  echo '--- versions'
  $PY - <<'EOF'
import importlib.metadata as md
import platform
import sys

print('python', sys.version.split()[0], platform.machine())
for name in ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda13-pjrt', 'flax', 'optax',
             'orbax-checkpoint', 'numpy', 'protobuf', 'tensorflow-datasets', 'ml-collections',
             'scikit-learn'):
  try:
    print(f'version {name} {md.version(name)}')
  except md.PackageNotFoundError:
    print(f'version {name} -')
import jax
import flax, optax, orbax.checkpoint, google.protobuf
for m in (jax, flax, optax, orbax.checkpoint, google.protobuf):
  print(f'module {m.__name__} {getattr(m, "__version__", "?")} {m.__file__}')
d = jax.devices()[0]
print(f'device {d.platform} {d.device_kind} x{len(jax.devices())}')
EOF
  echo '--- copy bandwidth (jitted jnp.copy of float32, bytes read + written)'
  $PY - "$QUICK" <<'EOF'
import statistics
import sys
import time

import jax
import jax.numpy as jnp

quick = sys.argv[1] == '1'
f = jax.jit(jnp.copy)
for n in (10**5, 10**6) if quick else (10**6, 10**7, 10**8):
  x = jnp.ones(n, jnp.float32)
  jax.block_until_ready(f(x))
  single = []
  for _ in range(20):
    t = time.perf_counter()
    jax.block_until_ready(f(x))
    single.append(time.perf_counter() - t)
  reps = 100
  t = time.perf_counter()
  for _ in range(reps):
    y = f(x)
  jax.block_until_ready(y)
  chained = (time.perf_counter() - t) / reps
  s = statistics.median(single)
  gb = 8 * n / 1e9
  print(f'copy n={n} single_ms={s * 1e3:.4f} single_GBps={gb / s:.1f} '
        f'back_to_back_ms={chained * 1e3:.4f} back_to_back_GBps={gb / chained:.1f}')
EOF
} >"$env_log" 2>&1

step() {  # step NAME SECONDS CMD...: runs CMD under a timeout, output to $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then
    return 0
  fi
  local left=$((BUDGET - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 30 ]; then
    echo "skipped $name: ${left}s left" | tee -a "$env_log"
    return 0
  fi
  local start=$SECONDS
  {
    echo "command: $*"
    echo "PYTHONPATH: $PYTHONPATH"
  } >"$OUT/$name.log"
  (set -o pipefail; timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log")
  local rc=$?
  echo "exit $rc after $((SECONDS - start)) s (limit ${limit} s)" | tee -a "$OUT/$name.log"
  echo "$name: exit $rc after $((SECONDS - start)) s" >>"$env_log"
  return $rc
}

if [ "$QUICK" = 1 ]; then
  small_step=(--steps=1 --repeats=1 --cpu_devices=1)
  compress=(--sizes=100000,200000 --rounds=2)
  digits=configs/digits.py:runlocal
  one_cpu=(--cpu_devices=1)
else
  small_step=()
  compress=(--sizes=1000000,10000000,100000000)
  digits=configs/digits.py
  one_cpu=()
fi

# vmap ('auto' on a GPU) and shared (one model's weights); the loop runs the workers one after
# the other, which a GPU does not need (the CNN's rows show it)
step bench_step_resnet20 270 $PY experiments/bench_step.py --model=resnet20 --image=32,32,3 \
  --batch=256 --workers=8,256 --per_worker=vmap,shared --steps=5 --repeats=3 "${small_step[@]}"
step bench_compress 150 $PY experiments/bench_compress.py "${compress[@]}"
rm -rf /tmp/w
if step make_run 200 $PY experiments/compare.py --config=$digits --workdir=/tmp/w "${one_cpu[@]}"; then
  cp /tmp/w/compare.md "$OUT/make_run_table.md" 2>/dev/null
else
  # jax 0.11 with the machine's flax/optax/orbax failed: again with the versions pyproject pins
  rm -rf /tmp/w
  PYTHONPATH=/tmp/pinned:$PYTHONPATH step make_run_pinned 150 $PY experiments/compare.py \
    --config=$digits --workdir=/tmp/w "${one_cpu[@]}" && cp /tmp/w/compare.md "$OUT/make_run_table.md"
fi
step bench_step_cnn 90 $PY experiments/bench_step.py --per_worker=vmap,loop,shared "${small_step[@]}"
echo "total ${SECONDS} s" | tee -a "$env_log"
