"""Deferred exchanges in the trainer: the inline run's models, bitwise, resumed mid-exchange too."""

import jax
import numpy as np
import pytest

from jaxdist.train import checkpoint

from conftest import run_digits

CASES = {
  # H = 4, P = 2, τ = 1, α = 0: a fragment sent after the steps 0, 2, 4, ..., merged after 1, 3,
  # ...; the checkpoint after 3 steps (step index 2, a send) holds fragment 1's average
  'streaming_diloco': (
    {'period': 4, 'fragments': 2, 'delay': 1, 'alpha': 0.0},
    3,
    lambda opt_state: opt_state[1]['pending']['Dense_0']['kernel'],
  ),
  # H = 4, eager: the average sent after step index 3 is read by the outer step at index 7; the
  # checkpoint after 5 steps holds it
  'diloco': (
    {'period': 4, 'eager': True},
    5,
    lambda opt_state: opt_state[1]['pending']['Conv_0']['kernel'],
  ),
}


@pytest.mark.parametrize('method', sorted(CASES))
def test_a_deferred_exchange_trains_the_inline_run_and_resumes_mid_exchange(
  tmp_path, data_dir, monkeypatch, method
):
  """8 workers on 8 devices, 9 steps: inline, against deferred stopped with an exchange in
  flight (its checkpoint must hold the average) and resumed. The checkpoints there are the
  same state, and so are the last models and every step's loss and bytes, bitwise."""
  section, stop, pending = CASES[method]
  settings = {f'sync.{method}.{k}': v for k, v in section.items()}

  def run(name, steps, exchange):
    return run_digits(
      tmp_path, name, data_dir, monkeypatch, args='workers=8', steps=steps,
      eval_every=stop, checkpoint_every=stop, keep_checkpoints=10,
      **{'optimizer.schedule': 'constant', 'optimizer.warmup_steps': 0},  # whatever `steps` is
      **{'sync.method': method, **settings, f'sync.{method}.exchange': exchange},
    )  # fmt: skip

  _, inline_log, inline = run('inline', 9, 'inline')
  run('deferred', stop, 'deferred')
  _, deferred_log, deferred = run('deferred', 9, 'deferred')  # resumes from the checkpoint

  want = checkpoint.read(str(tmp_path / 'inline' / 'checkpoints'), stop)[0]
  got = checkpoint.read(str(tmp_path / 'deferred' / 'checkpoints'), stop)[0]
  assert np.abs(pending(got['opt_state'])).max() > 0  # the average, not the zeros in flight
  jax.tree.map(np.testing.assert_array_equal, got, want)
  jax.tree.map(np.testing.assert_array_equal, deferred, inline)
  keys = ('step', 'loss', 'sent_bytes')
  assert [[r.get(k) for k in keys] for r in deferred_log] == [
    [r.get(k) for k in keys] for r in inline_log
  ]
