"""Token windows: the examples of a language model, by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist import data
from jaxdist.train import step as step_lib


def test_windows_overlap_by_one_token_and_cover_every_target():
  seq = data.sequences.from_tokens('t', np.arange(10), np.arange(7), 10, context=3)
  assert len(seq.train) == 3 and len(seq.test) == 2  # (10 - 1) // 3, (7 - 1) // 3
  x, y = seq.inputs(seq.train, np.array([0, 2]))
  np.testing.assert_array_equal(x, [[0, 1, 2], [6, 7, 8]])
  np.testing.assert_array_equal(y, [[1, 2, 3], [7, 8, 9]])
  x, y = seq.inputs(seq.test, np.array([[1]]))
  np.testing.assert_array_equal(x, [[[3, 4, 5]]])
  np.testing.assert_array_equal(y, [[[4, 5, 6]]])
  assert seq.input_shape == (3,) and seq.input_dtype == np.int32 and seq.tokens_per_example == 3


def test_bad_streams_are_errors():
  with pytest.raises(ValueError, match=r'token ids must lie in \[0, 4\), got \[0, 9\]'):
    data.sequences.from_tokens('t', np.arange(10), np.arange(3), 4, context=2)
  with pytest.raises(ValueError, match='has no window of context 8'):
    data.sequences.from_tokens('t', np.arange(10), np.arange(5), 10, context=8)


def test_loss_of_a_sequence_is_the_mean_over_positions_and_accuracy_counts_positions():
  logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]]))  # [1, 2, 3]
  labels = jnp.array([[0, 2]])
  expected = -(math.log(0.5) + math.log(0.1)) / 2
  np.testing.assert_allclose(step_lib.cross_entropy(logits, labels), [expected], rtol=1e-6)
  np.testing.assert_array_equal(step_lib.correct(logits, labels), [0.5])
  assert data.sequences.bits(math.log(2) * 3) == pytest.approx(3.0)
