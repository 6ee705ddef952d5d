"""Config sections are the factories' arguments; errors name the key."""

import dataclasses
import inspect
import os

import numpy as np
import pytest

from jaxdist import compress, runtime, sync
from jaxdist.train import compare, factory, methods
from jaxdist.train import config as config_lib

from conftest import REPO

# Arguments the trainer supplies itself, per factory (not config keys); hitopk_allreduce's
# axes and local size are the worker layout's (devices = nodes, simulated workers = local).
SUPPLIED = {'axis_name', 'num_workers', 'compressor', 'node_axis', 'local_axis', 'local_size'}
FIRST_ARG_OPTIMIZER = {'optimizer', 'global_optimizer'}


def arguments(fn) -> set[str]:
  return set(inspect.signature(fn).parameters)


def test_every_sync_section_key_is_an_argument_of_its_factory():
  sections = config_lib.sync()
  checked = 0
  for name in [*methods.METHODS, *factory.COMPENSATIONS, 'local_clip']:
    fn = getattr(sync, name)
    keys = set(sections[name])
    row = methods.METHODS.get(name)
    supplied = SUPPLIED | (FIRST_ARG_OPTIMIZER if row and row.optimizer == 'in' else set())
    supplied |= {'learning_rate'} if row and row.optimizer == 'own' else set()
    if name in factory.COMPENSATIONS:
      supplied = supplied | {'delay'}  # gradient_delay's
    extra = keys - arguments(fn)
    assert not extra, f'config.sync.{name} has {sorted(extra)}, not arguments of sync.{name}'
    missing = {
      p.name
      for p in inspect.signature(fn).parameters.values()
      if p.default is inspect.Parameter.empty and p.name not in supplied
    } - keys
    assert not missing, f'config.sync.{name} lacks required arguments {sorted(missing)}'
    checked += 1
  assert checked == len(methods.METHODS) + 3


def test_every_compressor_section_key_is_a_field_and_every_field_is_reachable():
  sections = config_lib.compress()
  names = [k for k in sections if k != 'name']
  assert sorted(names) == sorted(n for n in compress.REGISTRY if n != 'powersgd')
  for name in names:
    cls = compress.REGISTRY[name]
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    keys = set(sections[name])
    assert keys <= fields, f'config.compress.{name} has {sorted(keys - fields)}, not fields'
    assert fields <= keys, f'{name} fields {sorted(fields - keys)} cannot be set from a config'


def test_a_key_that_is_not_an_argument_is_refused_by_name():
  with pytest.raises(ValueError, match=r"config.sync.selsync has \['ewma_alpha'\]"):
    factory.call(sync.selsync, 'sync.selsync', {'threshold': 0.1, 'ewma_alpha': 0.1},
                 optimizer=None, axis_name='data')  # fmt: skip


def chain_of(**overrides):
  config = config_lib.base()
  config.update_from_flattened_dict({k.replace('__', '.'): v for k, v in overrides.items()})
  return config


@pytest.mark.parametrize(
  'overrides, message',
  [
    (dict(sync__method='selsync', sync__selsync__alpha=1.5), r'config.sync.selsync: alpha must be'),
    (dict(sync__method='local_sgd', sync__local_sgd__period=0), r'config.sync.local_sgd: period'),
    (dict(sync__method='compressed_allreduce', compress__name='dgc', compress__dgc__ratio=1.5),
     r'config.compress.dgc: ratio must be in \(0, 1\], got 1.5'),
    (dict(sync__method='compressed_allreduce', compress__name='zip'), 'unknown compress.name'),
    (dict(sync__method='diloco', sync__local_sgd__averager='x'), None),
    (dict(sync__method='local_sgd', sync__local_sgd__averager='x'),
     r"config.sync.local_sgd.averager must be .*got 'x'"),
    (dict(sync__method='gossipy'), "unknown sync.method 'gossipy'"),
    (dict(sync__method='bucketed_allreduce', sync__bucketed_allreduce__buckets=0),
     r'config.sync.bucketed_allreduce.buckets \(bytes per bucket\) must be > 0'),
    (dict(sync__compensation='spike_compensation'), 'applies to gradient_delay'),
    (dict(optimizer__name='lion'), r"config.optimizer.name must be 'sgd', 'adam' or 'adamw'"),
    (dict(optimizer__lr_scale=0.0), r'config.optimizer.lr_scale must be > 0, got 0.0'),
    (dict(sync__method='diloco', sync__diloco__outer_optimizer__lr_scale=-1.0),
     r'config.sync.diloco.outer_optimizer.lr_scale must be > 0'),
  ],
)  # fmt: skip
def test_bad_values_name_the_key_the_user_typed(overrides, message):
  workers = runtime.layout(8)
  config = chain_of(**overrides)
  if message is None:  # another method's section is not read
    factory.build_chain(config, workers)
    return
  with pytest.raises(ValueError, match=message):
    factory.build_chain(config, workers)


def test_averager_sections_build_the_named_transform():
  config = chain_of(sync__method='local_sgd', sync__local_sgd__averager='compressed_allreduce')
  config.compress.name = 'randomk'
  tx, _ = factory.build_chain(config, runtime.layout(8))
  assert callable(tx.init)


def test_config_arguments_after_the_colon():
  config = factory.load_config(os.path.join(REPO, 'configs/digits.py') + ':runlocal,workers=16')
  assert (config.workers, config.steps) == (16, 20)
  config = factory.load_config(os.path.join(REPO, 'configs/cifar10_resnet20.py') + ':workers=4')
  assert (config.workers, config.dataset.name) == (4, 'cifar10')
  with pytest.raises(
    ValueError, match=r"unknown config argument 'worker' \(did you mean 'workers'\?\); this config"
  ):
    factory.load_config(os.path.join(REPO, 'configs/digits.py') + ':worker=4')
  with pytest.raises(ValueError, match=r'workers takes a int, got .four.'):
    factory.load_config(os.path.join(REPO, 'configs/digits.py') + ':workers=four')


def test_the_shipped_configs_are_found_by_name_from_anywhere(tmp_path, monkeypatch):
  assert config_lib.config_path() == os.path.join(REPO, 'configs', '')  # a checkout
  assert config_lib.config_path('variants/default.py') == f'{REPO}/configs/variants/default.py'
  monkeypatch.chdir(tmp_path)  # no configs/ here
  by_name = factory.load_config('digits.py:runlocal,workers=4', steps=7)
  by_path = factory.load_config(f'{REPO}/configs/digits.py:runlocal,workers=4', steps=7)
  assert by_name == by_path and (by_name.workers, by_name.steps) == (4, 7)
  group = compare.load_group('variants/default.py')
  assert group.path == f'{REPO}/configs/variants/default.py' and 'dense' in group.variants
  (tmp_path / 'digits.py').write_text(
    'from jaxdist.train import config\n'
    'def get_config(arg=None):\n'
    '  c = config.base()\n'
    '  c.steps = 3\n'
    '  return c\n'
  )
  assert factory.load_config('digits.py').steps == 3  # a file of that path comes first
  with pytest.raises(factory.ConfigError, match=r'no config file at digit.py \(nor in .*/configs/'):
    factory.load_config('digit.py')


def test_both_configs_build_on_the_one_base():
  """Each config changes the base's sync sections only where it says so: digits tunes the
  DiLoCo family's outer momentum to its inner SGD (configs/digits.py)."""
  base = config_lib.base()
  tuned = {'digits.py': {'sync.diloco.outer_optimizer.momentum': 0.5,
                         'sync.streaming_diloco.outer_optimizer.momentum': 0.5}}  # fmt: skip
  for name in ('digits.py', 'cifar10_resnet20.py'):
    config = factory.load_config(os.path.join(REPO, 'configs', name))
    assert set(config.keys()) == set(base.keys()), name
    sync = base.sync.copy_and_resolve_references()
    for key, value in tuned.get(name, {}).items():
      sync.update_from_flattened_dict({key.removeprefix('sync.'): value})
    assert config.sync == sync and config.compress == base.compress, name


def test_cluster_section_keys_are_the_cluster_arguments_and_all_of_them():
  from jaxdist import netmodel

  keys = set(config_lib.cluster())
  fields = {f.name for f in dataclasses.fields(netmodel.Cluster)}
  # cores: netmodel.Cluster.from_cores; straggles: from config.fault.straggle
  assert keys == (fields - {'straggles'}) | {'cores'}
  assert 'cores' in arguments(netmodel.Cluster.from_cores)


def test_arguments_that_default_to_none_can_still_be_set_by_a_flag():
  # a plain None field has no type, and ml_collections' flags refuse to override it
  config = config_lib.base()
  for group in ('sync', 'compress'):
    for name, section in config[group].items():
      if not hasattr(section, 'get_ref'):
        continue
      for key, value in section.items():
        if value is None:
          kind = section.get_ref(key).get_type()
          assert kind is not type(None), f'config.{group}.{name}.{key} is an untyped None'
  config.compress.topk.k = 7  # each placeholder is its own field
  assert config.compress.mstopk.k is None and config.compress.dgc.k is None


@pytest.mark.parametrize('schedule', ['constant', 'cosine'])
def test_lr_scale_multiplies_the_rate_of_every_step(schedule):
  """learning_rate 0.2 x lr_scale 0.25: the schedule's rate is 0.05 where it would be 0.2
  (cosine: at its peak, after 10 warm-up steps, and halfway down); the optimizer's first SGD
  update of a gradient of ones is the rate itself (constant) or 0 (cosine: warm-up from 0)."""
  import jax.numpy as jnp

  rates = {}
  for scale in (1.0, 0.25):
    section = config_lib.optimizer('sgd', 0.2, lr_scale=scale, schedule=schedule, warmup_steps=10)
    opt, sched = factory.build_optimizer(section, 110)
    rates[scale] = [float(sched(t)) for t in (10, 60)]
    update, _ = opt.update({'w': jnp.ones(2)}, opt.init({'w': jnp.zeros(2)}))
    first = 0.0 if schedule == 'cosine' else 0.2 * scale
    assert float(update['w'][0]) == pytest.approx(-first)
  assert rates[1.0][0] == pytest.approx(0.2)
  assert rates[1.0][1] == pytest.approx(0.2 if schedule == 'constant' else 0.1)
  assert rates[0.25] == pytest.approx([r * 0.25 for r in rates[1.0]], rel=1e-6)


def test_cluster_fixed_s_reaches_the_cluster_and_alone_describes_one():
  config = config_lib.base()
  config.cluster.fixed_s = '0,0.04'
  cluster = factory.build_cluster(config.cluster, 2)
  assert cluster.speeds == (1.0, 1.0) and cluster.fixed_s == (0.0, 0.04)
  # 0.04 + 10 / 1 x 0.01 on the second worker
  np.testing.assert_allclose(cluster.compute_seconds(0, [10, 10], 0.01), [0.1, 0.14])
  config.cluster.fixed_s = '0.1'
  with pytest.raises(ValueError, match=r'config\.cluster: fixed_s has 1 workers, but speeds has 2'):
    factory.build_cluster(config.cluster, 2)
