"""experiments/bench_compress.py: --results writes the tables; DGC sends what its rule sends."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd

from conftest import REPO, load_experiment

SCRIPT = os.path.join(REPO, 'experiments', 'bench_compress.py')


@pytest.mark.parametrize('n', [7, 1000, 4099])
def test_dgc_sends_what_its_rule_written_directly_sends(n):
  """The fold of strided bins, the bisection and the packed compaction keep the direct payload."""
  rng = np.random.default_rng(n)
  xs = {
    'normal': rng.standard_normal(n),
    'ties': np.round(rng.standard_normal(n) * 2),  # many equal |x|, within and across bins
    'zeros': np.zeros(n),
  }
  direct = load_experiment('bench_compress')._dgc_direct(jd)
  for kw in (dict(ratio=0.05), dict(k=3), dict(ratio=0.02, bins_per_k=3)):
    new, old = (
      jax.jit(lambda x, k, c=c: c.encode(x, (), k)[0])
      for c in (jd.compress.dgc(**kw), direct(**kw))
    )
    for kind, x in xs.items():
      x = jnp.asarray(x, jnp.float32)
      for seed in range(3):
        key = jax.random.key(seed)
        for a, b in zip(new(x, key), old(x, key), strict=True):
          np.testing.assert_array_equal(a, b, err_msg=f'{kind}, {kw}, seed {seed}')


def test_results_file_is_written_at_tiny_sizes(tmp_path):
  out = tmp_path / 'compress_bench.md'
  proc = subprocess.run(
    [
      sys.executable,
      SCRIPT,
      '--sizes=512',
      '--rounds=1',
      '--gradient_models=mlp',
      '--gradient_steps=0',
      f'--results={out}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    env=dict(os.environ, PYTHONPATH=REPO),
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  assert text.startswith('Command: `python ') and 'bench_compress.py --sizes=512' in text
  assert '; machine: ' in text.splitlines()[0] and '; date: ' in text.splitlines()[0]
  assert '| compressor | n | ms (median) |' in text
  for row in ('| qsgd(127) | 512 |', '| dgc | 512 |', '| terngrad | 512 |'):
    assert row in text
  assert '| random bits for n elements |' in text
  assert '| coins: jd.compress.bernoulli 16-bit (default) | 512 |' in text
  assert '- n=512: dgc payload equals its rule written directly: yes' in text
  assert "| DGC's bins on gradients |" in text and '| mlp |' in text
  assert '- target: approximate top-k within 3x of a memory pass at 512: ' in text
  assert (
    '- target (random bits no longer dominant, i.e. under half the time) at 512: qsgd(127) ' in text
  )
  assert '| qsgd(127) no coins (rounded) | 512 |' in text
  assert '| compaction alone | n | mask positions | slots |' in text
  for row in (
    '| threshold: packed words | 512 | 512 | 5 |',
    '| dgc bins: positions | 512 | 10 | 5 |',
  ):
    assert row in text
  assert '- n=512: compaction (dgc bins) by words equals by positions: yes' in text
