"""experiments/peer_check.py's local_sgd section, jaxdist's half (no torch needed)."""

import numpy as np

from conftest import load_experiment


def pytorch_synchronises(t, period, warmup, ddp):
  """PyTorch's step t: DDP's all-reduced gradients before `warmup` (post_localSGD_hook), or
  PeriodicModelAverager's average (averagers.py: step >= warmup_steps and
  (step - warmup_steps) % period == 0)."""
  return (ddp and t < warmup) or (t >= warmup and (t - warmup) % period == 0)


def test_local_sgd_schedules_line_up_with_pytorchs():
  peer_check = load_experiment('peer_check')
  inputs = peer_check.local_sgd_inputs(4, np.random.default_rng(0), steps=12)
  out = peer_check.local_sgd_jaxdist(inputs)
  *aligned, control = enumerate(inputs['settings'])
  for i, (period, _, warmup, ddp) in aligned:
    want = [pytorch_synchronises(t, period, warmup, ddp) for t in range(12)]
    assert list(out[f'events_{i}'] > 0) == want, inputs['settings'][i]
    for models_WxDxK in out[f'models_{i}'][np.asarray(want)]:
      assert peer_check.one_model(models_WxDxK)
  i, (period, _, warmup, ddp) = control  # there to show a schedule that does not line up
  want = [pytorch_synchronises(t, period, warmup, ddp) for t in range(12)]
  assert list(out[f'events_{i}'] > 0) != want
