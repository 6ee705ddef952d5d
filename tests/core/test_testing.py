"""The jaxdist.testing harness: layouts agree, and it imports no heavy dependencies."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdist import runtime, sync, testing


def test_simulated_and_real_devices_give_the_same_run():
  tx = optax.chain(optax.sgd(0.1), sync.local_sgd(2, axis_name=runtime.AXES))
  grads = lambda t: {'x': jnp.arange(8.0) * (t + 1)}
  runs = [testing.Run(tx, {'x': jnp.ones(())}, devices=d) for d in (1, 2, 8)]
  finals = [run.steps(4, grads) for run in runs]
  for got in finals[1:]:
    jax.tree.map(np.testing.assert_array_equal, got, finals[0])
  assert all(run.history == [[0], [1], [0], [1]] for run in runs)
  assert runs[0].updates['x'].shape == (8,)


def test_the_harness_imports_only_jax_optax_and_the_core():
  code = (
    'import sys, jaxdist.testing; '
    "heavy = {'tensorflow_datasets', 'orbax', 'matplotlib', 'tensorboardX', 'flax'}; "
    'print(sorted(heavy & {m.split(".")[0] for m in sys.modules}))'
  )
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]', out.stdout
