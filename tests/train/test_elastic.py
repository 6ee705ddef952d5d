"""Elastic restore: a checkpoint of N workers resumes on M (jaxdist.train.elastic).

The rules by hand on tiny states of the real transforms, then the trainer:
8 workers train, the same work directory continues on 4 and on 16, and bad
input fails with one clear error and leaves the checkpoint as it was.
"""

import hashlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import compress, runtime, sync
from jaxdist.train import checkpoint, elastic, factory, methods, metrics
from jaxdist.train import config as config_lib
from jaxdist.train import step as step_lib
from jaxdist.train.step import TrainState

from conftest import REPO

AXES = runtime.AXES


def worker_state(tx, params, n):
  """A NumPy TrainState of n workers that all start from `params` (one worker's tree)."""
  stacked = jax.tree.map(lambda x: np.broadcast_to(x, (n, *np.shape(x))).copy(), params)
  opt = jax.device_get(jax.vmap(tx.init)(jax.tree.map(jnp.asarray, stacked)))
  return TrainState(stacked, {}, opt)


def template(tx, params, m):
  """This run's shapes for m workers, as `jax.eval_shape` of its init gives them."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), worker_state(tx, params, m))


def rows(*values):
  return np.asarray(values, np.float32)


def test_dense_keeps_the_replicated_model_and_refuses_one_that_differs():
  tx = optax.chain(sync.allreduce(axis_name=AXES), optax.sgd(0.1, momentum=0.9))
  saved = worker_state(tx, {'w': rows(1.5, -2.0)}, 4)
  trace = saved.opt_state[1][0]._replace(trace={'w': np.tile(rows(0.25, 3.0), (4, 1))})
  wire = saved.opt_state[0].wire
  saved = saved._replace(
    opt_state=(
      saved.opt_state[0]._replace(wire=type(wire)(wire.kind, wire.nbytes, np.ones(4, np.int32))),
      (trace, saved.opt_state[1][1]),
    )
  )
  for m in (2, 8):
    out, report = elastic.reshard(saved, template(tx, {'w': rows(0, 0)}, m), 'allreduce')
    np.testing.assert_array_equal(out.params['w'], np.tile(rows(1.5, -2.0), (m, 1)))
    np.testing.assert_array_equal(out.opt_state[1][0].trace['w'], np.tile(rows(0.25, 3.0), (m, 1)))
    np.testing.assert_array_equal(out.opt_state[0].wire.count, np.zeros(m, np.int32))  # reset
    assert report.leaves[elastic.REPLICATED] == ['params.w', 'opt_state.1.0.trace.w']
  differs = saved._replace(params={'w': rows([1.5, -2.0], [1.5, -2.0], [1.5, -2.0], [1.5, 2.0])})
  with pytest.raises(
    elastic.ReshardError, match=r'params.w is replicated but differs between its 4'
  ):
    elastic.reshard(differs, template(tx, {'w': rows(0, 0)}, 2), 'allreduce')


def test_topk_error_feedback_conserves_the_pending_update():
  # e_n of 4 workers; (1/N) Σ e_n = (2, 1, -0.5) is the update the model is still owed
  tx = optax.chain(
    sync.compressed_allreduce(compress.topk(ratio=0.5), axis_name=AXES), optax.sgd(0.1)
  )
  params = {'w': rows(0.5, 1.0, -1.0)}
  saved = worker_state(tx, params, 4)
  e = rows([1, 2, 0], [3, -2, -2], [5, 0, 1], [-1, 4, -1])
  ef = saved.opt_state[0]._replace(
    residual=(e,), count=np.full(4, 7, np.int32), norms=np.ones((4, 2), np.float32)
  )
  saved = saved._replace(opt_state=(ef, saved.opt_state[1]))
  for m in (2, 8):
    out, _ = elastic.reshard(saved, template(tx, params, m), 'compressed_allreduce')
    new = out.opt_state[0]
    np.testing.assert_array_equal(new.residual[0], np.tile(rows(2, 1, -0.5), (m, 1)))
    np.testing.assert_array_equal(elastic.owed(new.residual[0]), elastic.owed(e))  # (1/M)Σ = (1/N)Σ
    np.testing.assert_array_equal(new.count, np.full(m, 7))  # replicated: kept
    np.testing.assert_array_equal(new.key, np.tile(saved.opt_state[0].key[:1], (m, 1)))
    np.testing.assert_array_equal(new.norms, np.zeros((m, 2)))  # a probe the next step writes
    np.testing.assert_array_equal(out.params['w'], np.tile(params['w'], (m, 1)))


def test_local_sgd_averages_the_local_models_and_optimizer_states():
  tx = optax.chain(optax.sgd(0.1, momentum=0.9), sync.local_sgd(4, axis_name=AXES))
  params = {'w': rows(0, 0)}
  saved = worker_state(tx, params, 4)
  trace = saved.opt_state[0][0]._replace(trace={'w': rows([1, 0], [1, 0], [-1, 2], [3, 2])})
  count = saved.opt_state[1]._replace(count=np.full(4, 3, np.int32))
  saved = saved._replace(
    params={'w': rows([1, 2], [3, 4], [5, 6], [7, -4])},
    opt_state=((trace, *saved.opt_state[0][1:]), count),
  )
  out, report = elastic.reshard(saved, template(tx, params, 2), 'local_sgd')
  np.testing.assert_array_equal(out.params['w'], rows([4, 2], [4, 2]))  # the synchronised model
  np.testing.assert_array_equal(out.opt_state[0][0].trace['w'], rows([1, 1], [1, 1]))
  np.testing.assert_array_equal(out.opt_state[1].count, [3, 3])  # the period's phase goes on
  assert 'params.w' in report.leaves[elastic.MEAN]
  apart = saved._replace(
    opt_state=(saved.opt_state[0], count._replace(count=np.arange(4, dtype=np.int32)))
  )
  with pytest.raises(elastic.ReshardError, match=r'opt_state.1.count is replicated but differs'):
    elastic.reshard(apart, template(tx, params, 2), 'local_sgd')


def test_diloco_keeps_the_anchor_and_outer_momentum_and_averages_the_inner_models():
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  tx = optax.chain(optax.sgd(0.1), sync.diloco(outer, 4, axis_name=AXES))
  params = {'w': rows(0, 0)}
  saved = worker_state(tx, params, 4)
  d = saved.opt_state[1]
  anchor, momentum = np.tile(rows(0.5, -1), (4, 1)), np.tile(rows(0.25, 0.125), (4, 1))
  outer_state = (d.outer_state[0]._replace(trace={'w': momentum}), *d.outer_state[1:])
  d = d._replace(anchor={'w': anchor}, outer_state=outer_state)
  inner = rows([1, 2], [3, 4], [5, 6], [7, 0])
  saved = saved._replace(params={'w': inner}, opt_state=(saved.opt_state[0], d))
  for m in (2, 8):
    out, _ = elastic.reshard(saved, template(tx, params, m), 'diloco')
    np.testing.assert_array_equal(out.params['w'], np.tile(rows(4, 3), (m, 1)))
    np.testing.assert_array_equal(out.opt_state[1].anchor['w'], np.tile(rows(0.5, -1), (m, 1)))
    np.testing.assert_array_equal(
      out.opt_state[1].outer_state[0].trace['w'], np.tile(rows(0.25, 0.125), (m, 1))
    )
  moved = anchor.copy()
  moved[3, 1] = np.nextafter(np.float32(-1), np.float32(0))  # one ulp on one worker
  bad = saved._replace(opt_state=(saved.opt_state[0], d._replace(anchor={'w': moved})))
  with pytest.raises(elastic.ReshardError, match=r'opt_state.1.anchor.w is replicated'):
    elastic.reshard(bad, template(tx, params, 2), 'diloco')


def test_diloco_by_steps_restarts_each_workers_count_of_steps_taken():
  tx = optax.chain(
    sync.sit_out(optax.sgd(0.1)), sync.diloco(None, 4, axis_name=AXES, by_steps=True)
  )
  params = {'w': rows(0, 0)}
  saved = worker_state(tx, params, 3)
  d = saved.opt_state[1]
  d = d._replace(anchor={'w': np.tile(rows(0.5, -1), (3, 1))}, taken=np.array([3, 2, 1], np.int32))
  saved = saved._replace(
    params={'w': rows([1, 2], [3, 4], [5, 0])}, opt_state=(saved.opt_state[0], d)
  )
  out, report = elastic.reshard(saved, template(tx, params, 2), 'diloco')
  np.testing.assert_array_equal(out.params['w'], np.tile(rows(3, 2), (2, 1)))  # the mean model
  np.testing.assert_array_equal(out.opt_state[1].anchor['w'], np.tile(rows(0.5, -1), (2, 1)))
  np.testing.assert_array_equal(out.opt_state[1].taken, np.zeros(2, np.int32))
  assert 'opt_state.1.taken' in report.leaves[elastic.RESET]


def test_hierarchical_topk_reshards_node_shards_conserving_the_pending_update():
  # d = 3 parameters; 2 nodes x m = 2 (shards of s = 2) -> 3 nodes x m' = 1 (s' = 3)
  def tx(m):
    return sync.hitopk_allreduce(compress.topk(ratio=0.5), node_axis='data', local_axis='sim',
                                 local_size=m)  # fmt: skip

  params = {'w': rows(0, 0, 0)}
  saved = worker_state(tx(2), params, 4)
  e = rows([1, 2], [3, 0], [5, -2], [-1, 0])  # worker i·m + j: shard j of node i's sum
  saved = saved._replace(opt_state=saved.opt_state._replace(residual=e))
  # owed E = (1/4) Σ_i concat_j e_ij = (1/4)·([1, 2, 3, 0] + [5, -2, -1, 0])[:3] = (1.5, 0, 0.5)
  out, _ = elastic.reshard(saved, template(tx(1), params, 3), 'hitopk_allreduce',
                           local_size=(2, 1))  # fmt: skip
  np.testing.assert_array_equal(out.opt_state.residual, np.tile(rows(1.5, 0, 0.5), (3, 1)))
  # and to 1 node x 4: s' = 1, each worker its element (padding 0) times m' = 4
  out, _ = elastic.reshard(saved, template(tx(4), params, 4), 'hitopk_allreduce',
                           local_size=(2, 4))  # fmt: skip
  np.testing.assert_array_equal(out.opt_state.residual, rows([6], [0], [2], [0]))


def test_tick_tock_workers_keep_a_model_of_their_wave():
  tx = sync.tick_tock(optax.sgd(0.1), axis_name=AXES, waves=2)
  params = {'w': rows(0)}
  saved = worker_state(tx, params, 4)
  saved = saved._replace(params={'w': rows([1], [2], [1], [2])})  # wave 0: 1, wave 1: 2
  out, _ = elastic.reshard(saved, template(tx, params, 6), 'tick_tock')
  np.testing.assert_array_equal(out.params['w'], rows([1], [2], [1], [2], [1], [2]))
  with pytest.raises(elastic.ReshardError, match=r'splits the workers into 2 waves'):
    elastic.check('tick_tock', 4, 3, multiple=2)


def test_resharding_is_needed_for_other_workers_or_hierarchical_topk_on_other_nodes():
  from types import SimpleNamespace

  def run(method, workers, devices):
    config = config_lib.base()
    config.sync.method = method
    return SimpleNamespace(
      method=method,
      model_name=config.model.name,
      way_asked=config.sync.per_worker,
      workers=runtime.layout(workers, devices=devices),
    )

  meta = elastic.recorded(run('allreduce', 16, 8))
  assert meta == {
    'workers': 16,
    'devices': 8,
    'method': 'allreduce',
    'model': 'cnn',
    'per_worker': 'auto',
  }
  assert not elastic.needed(meta, run('allreduce', 16, 4))  # the same rows on other devices
  assert elastic.needed(meta, run('allreduce', 8, 8))
  assert not elastic.needed({'step': 3}, run('allreduce', 8, 8))  # not recorded: as saved
  hitopk = elastic.recorded(run('hitopk_allreduce', 16, 8))  # 8 nodes x 2: shards of 1/2
  assert elastic.needed(hitopk, run('hitopk_allreduce', 16, 4))  # 4 nodes x 4: shards of 1/4
  assert not elastic.needed(hitopk, run('hitopk_allreduce', 16, 8))


@pytest.mark.parametrize('method', sorted(methods.METHODS))
def test_every_method_is_resharded_or_refused_by_name(method):
  config = config_lib.base()
  config.sync.method = method
  config.steps = 10
  tx, _ = factory.build_chain(config, runtime.layout(4))
  params = {'Dense_0': {'kernel': np.zeros((3, 2), np.float32), 'bias': rows(0, 0)}}
  saved = worker_state(tx, params, 4)
  if methods.METHODS[method].refused:
    with pytest.raises(elastic.ReshardError, match=rf'sync.method={method} cannot be resharded'):
      elastic.reshard(saved, template(tx, params, 2), method)
    return
  out, _ = elastic.reshard(saved, template(tx, params, 2), method, local_size=(2, 2))
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(saved), strict=True):
    assert a.shape == (2, *b.shape[1:]) and a.dtype == b.dtype


# --- the trainer: 8 workers, then 4 and 16 -------------------------------------------------

TOPK = {'sync.method': 'compressed_allreduce', 'compress.name': 'topk', 'compress.topk.ratio': 0.1}


def config_of(workers, steps, **overrides):
  return factory.load_config(
    f'{REPO}/configs/digits.py:runlocal,workers={workers}',
    **{'progress': False, 'steps': steps, 'checkpoint_every': 2, 'eval_every': 2,
       'noise_every': 0, **overrides},
  )  # fmt: skip


def digest(path) -> str:
  h = hashlib.sha256()
  for f in sorted(p for p in path.rglob('*') if p.is_file()):
    h.update(str(f.relative_to(path)).encode() + f.read_bytes() + str(f.stat().st_mtime).encode())
  return h.hexdigest()


@pytest.fixture(scope='module')
def trained(tmp_path_factory, data_dir):
  """A Top-k + EF run of 8 workers, 4 steps (checkpoints at 2 and 4)."""
  from jaxdist.train import trainer

  mp = pytest.MonkeyPatch()
  mp.setenv('TFDS_DATA_DIR', data_dir)
  workdir = tmp_path_factory.mktemp('elastic') / 'eight'
  trainer.train_and_evaluate(config_of(8, 4, **TOPK), str(workdir))
  yield workdir
  mp.undo()


def restored(config, workdir):
  """The state, step and metadata the trainer resumes `workdir` with (nothing trained)."""
  from jaxdist.train import resume

  exp = factory.build(config, str(workdir))
  init = step_lib.make_init(exp.model, exp.tx, exp.workers, exp.dataset.image_shape)
  ckpt = checkpoint.Checkpointer(str(workdir / 'checkpoints'), keep=2)
  try:
    state, step, meta, control = resume.restore_or_init(
      exp, ckpt, init, jax.eval_shape(init, jax.random.key(0))
    )
    assert control == {}  # resharded: the host controllers start afresh
    return state, step, meta
  finally:
    ckpt.close()


@pytest.mark.parametrize('workers', [4, 16])
def test_topk_ef_resumes_on_other_workers_conserving_the_pending_update(
  trained, tmp_path, workers, data_dir, monkeypatch
):
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  workdir = tmp_path / f'to{workers}'
  shutil.copytree(trained, workdir)
  saved, meta = checkpoint.read(str(trained / 'checkpoints'))
  assert (meta['step'], meta['workers'], meta['method']) == (4, 8, 'compressed_allreduce')
  config = config_of(workers, 6, **TOPK)
  state, start, new_meta = restored(config, workdir)
  assert start == 4 and 'compute_s' not in new_meta  # measured afresh at 128 / M per worker
  e = np.asarray(state.opt_state[0].residual[0])
  assert e.shape[0] == workers and state.opt_state[0].residual[0].sharding.spec[0] == 'data'
  # the update the model is owed, (1/M)Σ e' == (1/N)Σ e (up to its float32 rounding)
  owed = elastic.owed(saved['opt_state'][0]['residual'][0])
  assert np.abs(owed).max() > 1e-4  # there is something to conserve
  np.testing.assert_array_equal(elastic.owed(e), owed.astype(np.float32))
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(saved['params']), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.broadcast_to(b[:1], a.shape))  # BSP: kept

  summary = trainer.train_and_evaluate(config, str(workdir))
  assert summary['workers'] == workers and summary['steps_this_run'] == 2
  records = metrics.read_jsonl(str(workdir / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [1, 2, 3, 4, 5, 6]
  assert records[-1]['loss'] < records[0]['loss']  # training went on (NaN fails)
  assert summary['test_accuracy'] > 0.3
  after, meta6 = checkpoint.read(str(workdir / 'checkpoints'))
  assert meta6['step'] == 6 and meta6['workers'] == workers
  assert after['opt_state'][0]['residual'][0].shape[0] == workers
  _, meta4 = checkpoint.read(str(workdir / 'checkpoints'), 4)
  assert meta4['workers'] == 8  # the writer's checkpoint is kept as it was


def test_bad_input_is_one_clear_error_and_leaves_the_checkpoint(
  trained, tmp_path, data_dir, monkeypatch
):
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  workdir = tmp_path / 'bad'
  shutil.copytree(trained, workdir)
  before = digest(workdir)
  cases = [
    (config_of(8, 6, **TOPK, **{'model.name': 'mlp'}),
     r'its config differs in 1 key\(s\): model.name "cnn" → "mlp"; resume with the config'),
    (config_of(4, 6, **TOPK, **{'model.name': 'mlp'}), r'model.name "cnn" → "mlp"; resume'),
    (config_of(4, 6), r'compress.topk.ratio 0.1 → 0.01, '
                      r'sync.method "compressed_allreduce" → "allreduce"; resume'),
    (config_of(5, 6, batch_size=128, **TOPK), r'batch_size 128 \(global\) is not divisible by '
                                              r'workers 5'),
  ]  # fmt: skip
  for config, message in cases:
    with pytest.raises(factory.ConfigError, match=message):
      trainer.train_and_evaluate(config, str(workdir))
    assert digest(workdir) == before


def test_a_method_with_gradients_in_flight_is_refused(tmp_path, data_dir, monkeypatch):
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  ssp = {'sync.method': 'ssp', 'model.name': 'mlp'}
  workdir = tmp_path / 'ssp'
  exp = factory.build(config_of(8, 2, **ssp), str(workdir))  # its checkpoint, as the trainer saves
  init = step_lib.make_init(exp.model, exp.tx, exp.workers, exp.dataset.image_shape)
  ckpt = checkpoint.Checkpointer(str(workdir / 'checkpoints'), keep=2)
  ckpt.save(2, init(jax.random.key(0)), {'step': 2, **elastic.recorded(exp)})
  ckpt.close()
  before = digest(workdir)
  message = (
    r'cannot resume from the checkpoint at step 2 .*: sync.method=ssp cannot be resharded onto '
    r'another number of workers: its state holds gradients in flight .* Resume it with the '
    r'number of workers that wrote the checkpoint, or start afresh'
  )
  with pytest.raises(factory.ConfigError, match=message):
    trainer.train_and_evaluate(config_of(4, 4, **ssp), str(workdir))
  assert digest(workdir) == before
