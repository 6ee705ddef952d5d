"""The decoder-only transformer: causal, tied, named blocks, nanoGPT's sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist import models
from jaxdist.models import transformer


def _init(model, t=8):
  return model.init(jax.random.key(0), jnp.zeros((1, t), jnp.int32))


def test_small_has_nanogpt_shakespeare_char_parameter_count():
  # nanoGPT reports 10.65M for 6 x 384, vocab 65, counting all but the position embeddings:
  # 6 blocks x 12·384² (attention 4·384², MLP 8·384²) + 2 norms x 384, + 65·384 tied + ln_f 384.
  params = jax.eval_shape(lambda: _init(transformer.gpt(65, 'small')))['params']
  total = sum(x.size for x in jax.tree.leaves(params))
  per_block = 12 * 384**2 + 2 * 384
  assert total - 256 * 384 == 6 * per_block + 65 * 384 + 384 == 10_646_784


def test_parameters_are_named_by_block():
  params = jax.eval_shape(lambda: _init(transformer.gpt(11, 'tiny', layers=3)))['params']
  assert sorted(params) == ['block_0', 'block_1', 'block_2', 'embed', 'ln_f', 'pos_embed']


def test_causal_a_token_changes_only_later_logits():
  model = transformer.gpt(17, 'tiny')
  variables = _init(model)
  x = jax.random.randint(jax.random.key(1), (2, 8), 0, 17)
  y = model.apply(variables, x)
  y2 = model.apply(variables, x.at[:, 5].set((x[:, 5] + 1) % 17))
  assert y.shape == (2, 8, 17)
  np.testing.assert_array_equal(y2[:, :5], y[:, :5])
  assert float(jnp.abs(y2[:, 5:] - y[:, 5:]).max()) > 1e-4


def test_output_embedding_is_the_input_embedding():
  model = transformer.gpt(13, 'tiny', layers=0)
  variables = _init(model, 4)
  p = variables['params']
  x = jnp.array([[3, 1, 4, 1]])
  h = p['embed']['embedding'][x] + p['pos_embed'][:4]
  h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-6)
  expected = (h * p['ln_f']['scale']) @ p['embed']['embedding'].T
  np.testing.assert_allclose(model.apply(variables, x), expected, rtol=1e-5, atol=1e-5)


def test_shorter_sequences_and_errors():
  model = models.get('gpt', num_classes=5, size='tiny', context=8)
  variables = _init(model)
  assert model.apply(variables, jnp.zeros((1, 3), jnp.int32)).shape == (1, 3, 5)
  with pytest.raises(ValueError, match='longer than its context 8'):
    model.apply(variables, jnp.zeros((1, 9), jnp.int32))
  with pytest.raises(ValueError, match="unknown GPT size 'huge'"):
    transformer.gpt(5, 'huge')
  with pytest.raises(ValueError, match=r'heads \(3\) must divide width \(64\)'):
    _init(transformer.gpt(5, 'tiny', heads=3))
