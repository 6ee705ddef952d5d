"""`import jaxdist` is light: the training stack loads only when used."""

import json
import subprocess
import sys

HEAVY = ('tensorflow_datasets', 'orbax', 'matplotlib', 'tensorboardX', 'flax')


def loaded_after(code: str) -> set[str]:
  script = f'{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))'
  out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=True)
  return {m.split('.')[0] for m in json.loads(out.stdout.splitlines()[-1])}


def test_import_jaxdist_loads_no_training_stack():
  modules = loaded_after('import jaxdist as jd; jd.sync.allreduce; jd.compress.topk')
  assert 'jax' in modules and 'optax' in modules
  assert not modules & set(HEAVY), f'import jaxdist loaded {sorted(modules & set(HEAVY))}'


def test_training_stack_loads_on_first_use():
  stack = {'flax', 'orbax', 'tensorflow_datasets', 'matplotlib'}
  # a binary parses its flags (jaxdist.train.cli) before the stack loads
  assert not loaded_after('import jaxdist as jd; jd.train; import jaxdist.train.cli') & stack
  assert stack <= loaded_after('import jaxdist as jd; jd.train.train_and_evaluate')


def test_the_planners_solvers_load_only_when_used():
  # binaries (train, compare, benchmarks) run where kneed and pymoo are not installed
  modules = loaded_after('import jaxdist.train.factory, jaxdist.train.trainer, jaxdist.control')
  assert not modules & {'kneed', 'pymoo'}, sorted(modules & {'kneed', 'pymoo'})
