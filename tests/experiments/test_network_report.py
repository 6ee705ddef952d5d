"""experiments/network_report.py's arithmetic, against figures computed by hand."""

import math

import pytest

from conftest import load_experiment

network_report = load_experiment('network_report')


def _records(steps_ms, comm_ms, key):
  return [{'step_s': s / 1e3, key: c / 1e3} for s, c in zip(steps_ms, comm_ms, strict=True)]


def test_exchange_row_is_what_the_limited_link_adds_measured_and_modelled():
  """Limited: steps 30, 34, 32 ms (mean 32), modelled 12 ms on its fitted link; unlimited:
  steps 21, 23, 22 ms (mean 22), modelled 3 ms on its own. The link adds 10 ms measured and
  9 ms modelled: 1.11, within 15 %. Standard errors: each run's stdev / sqrt(3)."""
  limited = (_records([30, 34, 32], [12, 12, 12], 'comm_s@a'), 'comm_s@a')
  free = (_records([21, 23, 22], [3, 3, 3], 'comm_s@b'), 'comm_s@b')
  row = network_report.exchange_row(2, 'topk', '100 Mbit/s', limited, free)
  assert row['_measured'] == pytest.approx(0.010)
  assert row['_modelled'] == pytest.approx(0.009)
  assert (row['limited'], row['free'], row['measured'], row['modelled']) == (
    '32.00',
    '22.00',
    '10.00',
    '9.00',
  )
  se = math.hypot(2 / math.sqrt(3), 1 / math.sqrt(3))  # stdevs 2 and 1 ms
  assert row['noise'] == f'{se:.2f}'
  assert row['ratio'] == '1.11' and row['target'] == 'within 15%: holds'


def test_exchange_row_outside_the_bound_or_with_nothing_modelled_does_not_hold():
  limited = (_records([40, 40], [10, 10], 'k'), 'k')
  free = (_records([20, 20], [1, 1], 'k'), 'k')
  row = network_report.exchange_row(4, 'dense', '100 Mbit/s', limited, free)
  assert row['ratio'] == '2.22' and row['target'] == 'within 15%: not'  # 20 ms against 9
  row = network_report.exchange_row(4, 'dense', '100 Mbit/s', free, free)
  assert row['ratio'] == '-' and row['target'] == 'within 15%: not'  # modelled 0: no ratio
  broken = (_records([float('nan'), 29], [10, 10], 'k'), 'k')  # a NaN step holds nothing
  row = network_report.exchange_row(4, 'dense', '100 Mbit/s', broken, free)
  assert row['target'] == 'within 15%: not'


def test_hidden_is_the_share_of_the_exchange_the_training_step_does_not_pay():
  """The exchange alone: the link adds 32 - 22 = 10 ms. Training steps 105 and 103 ms on the
  limited link (mean 104) against 100 ms at unlimited rate: it adds 4 ms of the 10, so 0.60
  is hidden. Steps that pay it whole: 0.00; without training steps, or with the link adding
  nothing to the exchange: no figure."""
  limited = (_records([30, 34, 32], [12, 12, 12], 'k'), 'k')
  free = (_records([21, 23, 22], [3, 3, 3], 'k'), 'k')
  train = lambda ms: [{'step_s': s / 1e3} for s in ms]
  row = network_report.exchange_row(2, 'x', 'l', limited, free, (train([105, 103]), train([100])))
  assert (row['hidden'], row['step_ratio']) == ('0.60', '1.040')
  assert row['overlap'] == '≥ 0.90 hidden, ≤ 1.1x: not'
  row = network_report.exchange_row(2, 'x', 'l', limited, free, (train([110]), train([100])))
  assert row['hidden'] == '0.00'
  row = network_report.exchange_row(2, 'x', 'l', limited, free, (train([101, 100]), train([100])))
  assert (row['hidden'], row['overlap']) == ('0.95', '≥ 0.90 hidden, ≤ 1.1x: holds')
  assert network_report.exchange_row(2, 'x', 'l', limited, free)['hidden'] == '-'
  row = network_report.exchange_row(2, 'x', 'l', free, free, (train([110]), train([100])))
  assert row['hidden'] == '-'
