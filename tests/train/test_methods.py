"""The table of sync methods: one row per method, each consistent with its factory and section."""

import inspect

import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import runtime, sync
from jaxdist.train import config as config_lib
from jaxdist.train import elastic, factory, methods

RULES = {methods.REPLICATED, methods.MEAN, methods.CYCLIC, methods.RESET, methods.SHARDS, None}


def test_every_row_has_a_section_and_every_method_section_a_row():
  sections = config_lib.sync()
  assert set(methods.METHODS) <= set(sections)
  not_methods = {'method', 'compensation', 'local_clip', 'staggered', 'per_worker'}
  not_methods |= set(factory.COMPENSATIONS)
  assert set(sections) - not_methods == set(methods.METHODS)


@pytest.mark.parametrize('name', sorted(methods.METHODS))
def test_a_row_names_a_public_factory_and_consistent_rules(name):
  row = methods.METHODS[name]
  assert getattr(jd.sync, name) is row.make
  assert row.optimizer in ('before', 'after', 'in', 'own')
  assert set(row.supplies) <= set(factory.SUPPLIES)
  params = inspect.signature(row.make).parameters
  assert set(row.convert) <= set(params), 'convert names arguments of the factory'
  if row.optimizer == 'in':
    assert next(iter(params)) in ('optimizer', 'global_optimizer')
  if row.optimizer == 'own':
    assert 'learning_rate' in params, 'a method that is the optimizer takes the run schedule'
  assert bool(row.model) != bool(row.refused), 'a method is resharded or refused, with a reason'
  assert row.model in ('', methods.REPLICATED, methods.MEAN, methods.CYCLIC)
  assert row.device in ('', 'model', 'split')
  if row.multiple_of:
    assert row.multiple_of in params
  for fields in row.states.values():
    assert set(fields.values()) <= RULES


def test_every_state_type_has_one_rule_set():
  seen = {}
  for name, row in methods.METHODS.items():
    for state in row.states:
      assert state not in seen, f'{state.__name__} in {seen.get(state)} and {name}'
      seen[state] = name
  assert methods.state_rules() == elastic.FIELDS
  for state, fields in elastic.FIELDS.items():
    assert set(fields) == set(state._fields), state.__name__


@pytest.mark.parametrize('name', sorted(methods.METHODS))
def test_every_row_builds_with_its_section_defaults(name):
  config = config_lib.base()
  config.sync.method = name
  config.steps = 10
  tx, _ = factory.build_chain(config, runtime.layout(4))
  assert isinstance(tx, optax.GradientTransformation)


def test_waiting_rules_by_hand():
  assert methods.bsp({}, 4) == {'wait': 'bsp'}
  assert methods.ssp('staleness')({'staleness': 3}, 4) == {'wait': 'ssp', 'staleness': 3}
  ring = methods.neighbours({'topology': 'ring', 'rows': None}, 4)['neighbours'](0)
  np.testing.assert_allclose(ring.sum(axis=1), 1.0)
  assert [np.count_nonzero(r) for r in ring] == [3, 3, 3, 3]


def test_an_unknown_method_is_named_with_the_choices():
  with pytest.raises(ValueError, match=r"unknown sync.method 'lcoal_sgd'; choose one of \["):
    methods.get('lcoal_sgd')
  config = config_lib.base()
  config.sync.method = 'per_worker'  # a key of config.sync, not a method
  with pytest.raises(ValueError, match=r'unknown sync\.method'):
    factory.build_chain(config, runtime.layout(4))


def test_the_per_worker_ways_follow_the_rows():
  assert factory.SHARED_MODEL == (
    'allreduce', 'compressed_allreduce', 'hitopk_allreduce', 'powersgd', 'quantized_allreduce',
    'bucketed_allreduce',
  )  # fmt: skip
  assert factory.MEAN_ONLY == ('allreduce', 'powersgd', 'bucketed_allreduce')
  assert factory.DEVICE_MODEL == ('allreduce', 'powersgd')
  assert factory.DEVICE_SPLIT == ('compressed_allreduce',)
  assert sync.weighted_allreduce is methods.METHODS['allreduce'].weighted


def test_an_outer_cosine_spans_the_outer_steps():
  """DiLoCo, 1 worker, H = 2, 8 steps: 4 outer steps, so an outer cosine (lr 1, no warm-up)
  gives 1, 0.854, 0.5, 0.146 (½(1 + cos(πk/4))). Inner SGD lr 1 on a constant gradient of 1
  moves the worker by -2 a period, the pseudo-gradient is 2 each time: by hand the anchor goes
  0 -> -2 -> -3.707 -> -4.707 -> -5.0. (Spanning the 8 inner steps instead, the rates would
  be 1, 0.962, 0.854, 0.691.)"""
  import jax.numpy as jnp

  from jaxdist import testing

  config = config_lib.base()
  config.steps, config.workers = 8, 1
  config.optimizer = config_lib.optimizer('sgd', 1.0)
  config.sync.method = 'diloco'
  config.sync.diloco.period = 2
  config.sync.diloco.outer_optimizer = config_lib.optimizer('sgd', 1.0, schedule='cosine')
  tx, _ = factory.build_chain(config, runtime.layout(1))
  run = testing.Run(tx, {'x': jnp.zeros(())}, workers=1, devices=1)
  anchors = []
  for step in range(8):
    got = run({'x': jnp.ones((1,))})['x']
    if step % 2:
      anchors.append(float(got[0]))
  np.testing.assert_allclose(anchors, [-2.0, -3.70710678, -4.70710678, -5.0], rtol=1e-6)
