"""Streaming DiLoCo's deferred exchange in the trainer: the inline run's models, resumed too."""

import jax
import numpy as np

from jaxdist.train import checkpoint

from conftest import run_digits

# H = 4, P = 2, τ = 1, α = 0: a fragment sent after the steps 0, 2, 4, ..., merged after 1, 3, ...
STREAMING = {
  'sync.method': 'streaming_diloco',
  'sync.streaming_diloco.period': 4,
  'sync.streaming_diloco.fragments': 2,
  'sync.streaming_diloco.delay': 1,
  'sync.streaming_diloco.alpha': 0.0,
  'eval_every': 3,  # after step index 2, a send: the evaluation waits for its exchange
  'checkpoint_every': 3,
  'keep_checkpoints': 10,
}


def test_a_deferred_exchange_trains_the_inline_run_and_resumes_mid_exchange(
  tmp_path, data_dir, monkeypatch
):
  """8 workers on 8 devices, 9 steps: inline, against deferred stopped after 3 steps (its
  checkpoint taken with fragment 0's all-reduce in flight) and resumed. The checkpoints at
  step 3 are the same state (the average in `pending`), and so are the last models and
  every step's loss and bytes, bitwise."""
  run = lambda name, steps, exchange: run_digits(
    tmp_path, name, data_dir, monkeypatch, args='workers=8', steps=steps,
    **STREAMING, **{'sync.streaming_diloco.exchange': exchange},
  )  # fmt: skip
  _, inline_log, inline = run('inline', 9, 'inline')
  run('deferred', 3, 'deferred')
  _, deferred_log, deferred = run('deferred', 9, 'deferred')  # resumes from step 3

  want = checkpoint.read(str(tmp_path / 'inline' / 'checkpoints'), 3)[0]
  got = checkpoint.read(str(tmp_path / 'deferred' / 'checkpoints'), 3)[0]
  assert np.abs(got['opt_state'][1]['pending']['Dense_0']['kernel']).max() > 0  # fragment 1's
  jax.tree.map(np.testing.assert_array_equal, got, want)
  jax.tree.map(np.testing.assert_array_equal, deferred, inline)
  keys = ('step', 'loss', 'sent_bytes')
  assert [[r.get(k) for k in keys] for r in deferred_log] == [
    [r.get(k) for k in keys] for r in inline_log
  ]
