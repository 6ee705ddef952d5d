"""Warm start (`config.init_from`): a run that begins at another run's checkpoint."""

import jax
import numpy as np
import pytest

from jaxdist.train import checkpoint, factory, metrics

from conftest import REPO

# plain SGD without momentum: the optimizer keeps no state, so a BSP run warm-started from
# another's checkpoint at step 4 computes what that run computed from step 4 on
SGD = {'optimizer.momentum': 0.0, 'optimizer.nesterov': False, 'optimizer.weight_decay': 0.0}


def config_of(steps, **overrides):
  return factory.load_config(
    f'{REPO}/configs/digits.py:runlocal',
    **{'progress': False, 'steps': steps, 'checkpoint_every': 4, 'eval_every': 4,
       'noise_every': 0, 'keep_checkpoints': 3, **SGD, **overrides},
  )  # fmt: skip


def params_at(workdir, step):
  state, meta = checkpoint.read(str(workdir / 'checkpoints'), step)
  assert meta['step'] == step
  return state['params']


@pytest.fixture(scope='module')
def source(tmp_path_factory, data_dir):
  """BSP with plain SGD, 8 workers, 8 steps of a cosine schedule (checkpoints at 4 and 8)."""
  from jaxdist.train import trainer

  mp = pytest.MonkeyPatch()
  mp.setenv('TFDS_DATA_DIR', data_dir)
  workdir = tmp_path_factory.mktemp('warm') / 'bsp'
  summary = trainer.train_and_evaluate(config_of(8), str(workdir))
  assert 'init_from' not in summary and 'source_sent_bytes_per_worker' not in summary
  yield workdir
  mp.undo()


def test_bsp_from_a_bsp_checkpoint_goes_on_as_the_run_that_wrote_it(source, tmp_path, data_dir,
                                                                   monkeypatch):  # fmt: skip
  """Step 4 → 8 warm-started equals the source's own steps 4 → 8: the same model, batches and
  learning rates (the cosine schedule goes on from step 4 with a fresh optimizer count)."""
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  workdir = tmp_path / 'again'
  summary = trainer.train_and_evaluate(
    config_of(8, init_from=str(source), init_step=4), str(workdir)
  )
  assert summary['steps_this_run'] == 4
  records = metrics.read_jsonl(str(workdir / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [5, 6, 7, 8]
  theirs = metrics.read_jsonl(str(source / 'metrics.jsonl'))
  # where it began, and the bytes the source sent before: BSP's fixed all-reduce, 4 steps
  assert (summary['init_from'], summary['init_step']) == (str(source), 4)
  assert theirs[0]['sent_bytes'] > 0
  assert summary['source_sent_bytes_per_worker'] == 4 * theirs[0]['sent_bytes']
  assert [r['learning_rate'] for r in records] == [r['learning_rate'] for r in theirs[4:]]
  assert 0 < records[-1]['learning_rate'] < records[0]['learning_rate']  # cosine, going on
  for mine, want in zip(jax.tree.leaves(params_at(workdir, 8)),
                        jax.tree.leaves(params_at(source, 8)), strict=True):  # fmt: skip
    np.testing.assert_allclose(mine, want, rtol=1e-6, atol=1e-7)
  pairs = zip(jax.tree.leaves(params_at(source, 8)), jax.tree.leaves(params_at(source, 4)),
              strict=True)  # fmt: skip
  # steps 5-8 changed the model: the comparison above could fail
  assert max(np.abs(a - b).max() for a, b in pairs) > 1e-3
  assert not (workdir / 'checkpoints' / '4').exists()  # nothing of the source copied


def test_another_method_starts_at_the_checkpoint_s_model_with_a_fresh_state(
  source, tmp_path, data_dir, monkeypatch
):
  """DiLoCo from BSP's step-8 checkpoint on 4 workers: every worker's model and DiLoCo's anchor
  are the source's model; the run trains from step 8 to 12."""
  from jaxdist.train import resume, trainer
  from jaxdist.train import step as step_lib

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = config_of(12, init_from=str(source), workers=4,
                     **{'sync.method': 'diloco', 'sync.diloco.period': 2})  # fmt: skip
  exp = factory.build(config, str(tmp_path / 'diloco'))
  assert (exp.init_step, exp.init_from) == (8, str(source / 'checkpoints'))  # 0: the latest
  init = step_lib.make_init(exp.model, exp.tx, exp.workers, exp.dataset.image_shape)
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'diloco' / 'checkpoints'), keep=2)
  try:
    state, start, meta, _ = resume.restore_or_init(
      exp, ckpt, init, jax.eval_shape(init, jax.random.key(0))
    )
  finally:
    ckpt.close()
  assert start == 8 and meta == {'init_from': str(source / 'checkpoints')}
  want = params_at(source, 8)
  for mine, theirs in zip(jax.tree.leaves(state.params), jax.tree.leaves(want), strict=True):
    assert mine.shape[0] == 4
    np.testing.assert_array_equal(np.asarray(mine), np.broadcast_to(theirs[:1], mine.shape))
  kernel = want['Dense_0']['kernel'][0]  # DiLoCo's anchor holds the source's model too
  anchors = [x for x in jax.tree.leaves(state.opt_state) if x.shape[1:] == kernel.shape]
  assert any(np.array_equal(np.asarray(a)[0], kernel) for a in anchors)

  summary = trainer.train_and_evaluate(config, str(tmp_path / 'diloco'))
  records = metrics.read_jsonl(str(tmp_path / 'diloco' / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [9, 10, 11, 12]
  assert summary['test_accuracy'] > 0.3 and np.isfinite(records[-1]['loss'])


def test_a_warm_start_names_what_is_wrong_before_anything_is_written(source, tmp_path, data_dir,
                                                                     monkeypatch):  # fmt: skip
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  cases = [
    ({'init_from': str(tmp_path / 'nowhere')}, 'no checkpoint in'),
    ({'init_from': str(source), 'init_step': 6}, r'has checkpoints at steps \[4, 8\]'),
    ({'init_from': str(source), 'steps': 8}, 'is not below config.steps=8'),
    ({'init_step': 4}, 'needs config.init_from'),
    ({'init_from': str(source), 'model.name': 'mlp'}, 'another model than this run'),
  ]
  for overrides, message in cases:
    workdir = tmp_path / 'refused'
    with pytest.raises(factory.ConfigError, match=message):
      trainer.train_and_evaluate(config_of(**{'steps': 12, **overrides}), str(workdir))
    assert not (workdir / 'metrics.jsonl').exists()
    assert not list((workdir / 'checkpoints').glob('[0-9]*'))  # no checkpoint written


def test_a_comparison_starts_a_variant_from_an_earlier_variant_s_run(tmp_path):
  """`init_from` naming a variant of the comparison reads that variant's work directory; one
  listed after it (it would not have trained yet) is refused by name."""
  configs = {'bsp': config_of(8), 'diloco': config_of(12, init_from='bsp'),
             'other': config_of(12, init_from='/somewhere/else')}  # fmt: skip
  assert factory.warm.sibling_sources(configs, str(tmp_path)) == {'diloco'}
  assert configs['diloco'].init_from == str(tmp_path / 'bsp')
  assert configs['other'].init_from == '/somewhere/else'  # a path stays a path
  cold = factory.warm.cold(configs['diloco'])
  assert (cold.init_from, cold.init_step) == ('', 0) and configs['diloco'].init_from
  late = {'diloco': config_of(12, init_from='bsp'), 'bsp': config_of(8)}
  with pytest.raises(ValueError, match=r"variant 'diloco' starts from variant 'bsp'.*list 'bsp'"):
    factory.warm.sibling_sources(late, str(tmp_path))
