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


def test_fp16_regimes_by_segment_are_reported_and_keep_float16_precision():
  """jaxdist's half of the fp16 section: each regime's rows by segment hold the RMS errors of
  its large and tiny segments, no inf, and the tiny one within 4 roundings of u = 2^-11 of the
  mean's RMS (the wide regime's N(0, 1e-6²) too, which one scale per vector would put among
  float16's subnormals: some 7e-2 off)."""
  peer_check = load_experiment('peer_check')
  inputs = peer_check.fp16_inputs(4, np.random.default_rng(0))
  means = peer_check.fp16_jaxdist(inputs)
  lines = peer_check.fp16_report(inputs, {'jaxdist': means})
  rows = [[c.strip() for c in line.split('|')] for line in lines]
  segments = {r[0]: r[2:] for r in rows if len(r) == 6 and r[1] == 'jaxdist'}
  assert set(segments) == set(peer_check.REGIMES)
  for name, (large, large_inf, tiny, tiny_inf) in segments.items():
    exact = inputs[name].astype(np.float64).mean(0)
    mean = means[name].astype(np.float64)
    cut = peer_check.LARGE
    assert float(large) == float(f'{peer_check.rel(mean[:cut], exact[:cut]):.2e}'), name
    assert float(tiny) == float(f'{peer_check.rel(mean[cut:], exact[cut:]):.2e}'), name
    assert (large_inf, tiny_inf) == ('0', '0'), name
    assert float(tiny) <= 4 * 2.0**-11, name
