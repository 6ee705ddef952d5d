"""jaxdist.timing: the median of repeated runs, within a budget."""

import jax.numpy as jnp
import pytest

from jaxdist import timing


def counting():
  calls = []

  def run():
    calls.append(1)
    return jnp.zeros(())

  return run, calls


def test_all_repeats_run_without_a_budget():
  run, calls = counting()
  assert timing.median_seconds(run, repeats=5, warmup=2) >= 0
  assert len(calls) == 7


def test_a_spent_budget_stops_after_three_timed_runs():
  run, calls = counting()
  timing.median_seconds(run, repeats=20, warmup=1, budget_s=0.0)
  assert len(calls) == 1 + 3
  run, calls = counting()
  timing.median_seconds(run, repeats=2, warmup=1, budget_s=0.0)  # fewer repeats than three
  assert len(calls) == 1 + 2


def test_repeats_must_be_positive():
  with pytest.raises(ValueError, match='repeats must be >= 1'):
    timing.median_seconds(lambda: jnp.zeros(()), repeats=0)
