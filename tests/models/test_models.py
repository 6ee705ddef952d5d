"""Models build, have the expected sizes, and ResNet-20 keeps batch statistics."""

import jax
import jax.numpy as jnp
import pytest

from jaxdist import models


@pytest.mark.parametrize(
  'name, shape, n_params',
  [
    ('mlp', (8, 8, 1), 64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10),
    ('cnn', (8, 8, 1), None),
    ('resnet20', (32, 32, 3), None),
  ],
)
def test_models_build_and_classify(name, shape, n_params):
  model = models.get(name, num_classes=10)
  variables = model.init(jax.random.key(0), jnp.zeros((2, *shape)))
  count = sum(x.size for x in jax.tree.leaves(variables['params']))
  if n_params is not None:
    assert count == n_params
  logits = model.apply(variables, jnp.ones((3, *shape)), train=False)
  assert logits.shape == (3, 10)


def test_resnet20_has_about_270k_parameters_and_batch_stats():
  model = models.get('resnet20', num_classes=10)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  count = sum(x.size for x in jax.tree.leaves(variables['params']))
  assert 0.26e6 < count < 0.28e6  # He et al. 2016, Table 6: 0.27M
  assert 'batch_stats' in variables
  convs = [
    p
    for p in jax.tree_util.tree_flatten_with_path(variables['params'])[0]
    if 'Conv' in str(p[0]) and 'kernel' in str(p[0])
  ]
  assert sum(1 for path, k in convs if k.shape[:2] == (3, 3)) == 19  # 1 + 3 stages x 3 blocks x 2
  _, updates = model.apply(variables, jnp.ones((4, 32, 32, 3)), train=True, mutable=['batch_stats'])
  assert jax.tree.structure(updates['batch_stats']) == jax.tree.structure(variables['batch_stats'])


def test_unknown_model_lists_the_choices():
  with pytest.raises(
    ValueError, match=r"unknown model 'vgg99'; choose one of \['cnn', 'gpt', 'mlp', 'resnet20'\]"
  ):
    models.get('vgg99', num_classes=10)
