"""ADOPT in the trainer: explorations from a saved train state, undone, and resumed exactly."""

import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from jaxdist import netmodel
from jaxdist.train import checkpoint, factory, ledger, metrics
from jaxdist.train import config as config_lib

from conftest import REPO, Driven

ADOPT = {
  'sync.method': 'compressed_allreduce', 'compress.name': 'topk', 'compress.topk.ratio': 0.1,
  'sync.compressed_allreduce.collective': 'auto', 'adaptive': 'adopt',
  'adopt.warmup_steps': 2, 'adopt.explore_steps': 1, 'network.profiles': 'adopt_c1@2,1gbps',
}  # fmt: skip


def run(tmp_path, name, data_dir, monkeypatch, **overrides):
  from jaxdist.train import trainer

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal,workers=3',
    **{'progress': False, 'batch_size': 96, 'noise_every': 0, 'keep_checkpoints': 10,
       **overrides},
  )  # fmt: skip
  summary = trainer.train_and_evaluate(config, str(tmp_path / name))
  records = metrics.read_jsonl(str(tmp_path / name / 'metrics.jsonl'))
  return summary, records


def params_at(tmp_path, name, step=None):
  return checkpoint.read(str(tmp_path / name / 'checkpoints'), step)[0]['params']


def saved_steps(tmp_path, name):
  return sorted(int(d) for d in os.listdir(tmp_path / name / 'checkpoints') if d.isdigit())


def test_an_exploration_is_undone_and_evaluations_and_checkpoints_wait_for_its_end(
  tmp_path, data_dir, monkeypatch
):
  from jaxdist.train import step as step_lib

  made = []  # train steps built: the run's, one worker's, and one for all six candidates
  make = step_lib.make_train_step
  monkeypatch.setattr(step_lib, 'make_train_step', lambda *a, **k: made.append(1) or make(*a, **k))
  # warm-up: steps 1-2 at candidate 0 (0.1); exploration: steps 3-7, one per candidate, from a
  # copy of the state after step 2, which the next step (here: the end) goes back to. The
  # evaluation and checkpoint due at step 4 wait for the end of the exploration.
  summary, records = run(tmp_path, 'adopt', data_dir, monkeypatch, steps=7, eval_every=4,
                         checkpoint_every=4, **ADOPT)  # fmt: skip
  assert [r['phase'] for r in records] == ['warmup'] * 2 + ['explore'] * 5
  assert [r['ratio'] for r in records[2:]] == list(jd_candidates())
  assert [r['step'] for r in records if 'test_accuracy' in r] == [7]
  assert saved_steps(tmp_path, 'adopt') == [7]
  assert summary['explorations'] == 1
  # each step is charged the measured compute of the candidate it ran (kept by the checkpoint)
  per = checkpoint.read(str(tmp_path / 'adopt' / 'checkpoints'))[1]['compute_s_candidates']
  assert len(per) == 6 and all(v > 0 for v in per)  # five ratios and dense
  assert len(made) == 3
  ratios = list(jd_candidates())
  for r in records:
    assert r['step_compute_s'] == per[ratios.index(r['ratio'])]
    assert r['modelled_s@1gbps'] == pytest.approx(r['step_compute_s'] + r['comm_s@1gbps'])
  clock = ledger.modelled_clock(records, '1gbps', compute_s=1e9)  # the records' own terms
  assert clock[-1][1] == pytest.approx(sum(r['modelled_s@1gbps'] for r in records))
  # the same config with a fixed Top-k 0.1 on all-gather, saved after step 2
  fixed = {k: v for k, v in ADOPT.items() if not k.startswith(('adopt', 'adaptive'))}
  fixed['sync.compressed_allreduce.collective'] = 'allgather'
  _, plain = run(tmp_path, 'fixed', data_dir, monkeypatch, steps=7, checkpoint_every=2, **fixed)
  assert records[0]['collective'] == 'allgather'  # what the α-β model picks at this size
  for a, b in zip(records[:2], plain[:2], strict=True):  # the warm-up is the fixed run
    assert a['loss'] == b['loss'] and a['payload_bytes'] == b['payload_bytes']
  # the run ends on the state after step 2: the exploration's updates are gone
  for a, b in zip(
    jax.tree.leaves(params_at(tmp_path, 'adopt')),
    jax.tree.leaves(params_at(tmp_path, 'fixed', 2)),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)


def jd_candidates():
  from jaxdist import control

  return control.ADOPT_CANDIDATES


def test_adopt_resumes_from_its_checkpoint_exactly(tmp_path, data_dir, monkeypatch):
  # an uninterrupted run, and one that restarts from its checkpoint at step 8 (the controller's
  # state in the metadata): the same decisions, losses and weights
  # a given compute term: the candidates' one-worker step is not compiled and timed
  common = dict(steps=12, checkpoint_every=4, eval_every=4, **ADOPT, **{'network.compute_s': 0.01})
  _, whole = run(tmp_path, 'whole', data_dir, monkeypatch, **common)
  assert 8 in saved_steps(tmp_path, 'whole')
  os.makedirs(tmp_path / 'again' / 'checkpoints')
  shutil.copytree(tmp_path / 'whole/checkpoints/8', tmp_path / 'again/checkpoints/8')
  _, again = run(tmp_path, 'again', data_dir, monkeypatch, **common)
  assert [r['phase'] for r in whole[7:]] == ['train'] * 5  # step 8 went back to the copy
  assert [r['step'] for r in again] == list(range(9, 13))
  keys = ('loss', 'ratio', 'collective', 'phase', 'gain', 'payload_bytes')
  assert [[r.get(k) for k in keys] for r in again] == [[r.get(k) for k in keys] for r in whole[8:]]
  for a, b in zip(
    jax.tree.leaves(params_at(tmp_path, 'whole')),
    jax.tree.leaves(params_at(tmp_path, 'again')),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)


def adopt_config():
  config = config_lib.base()
  config.sync.method = 'compressed_allreduce'
  config.compress.name = 'topk'
  config.sync.compressed_allreduce.collective = 'auto'
  config.adaptive = 'adopt'
  config.adopt.update(warmup_steps=1, explore_steps=2)
  return config


def test_the_controller_feeds_adopt_the_unsquared_gain_on_the_network_that_ran():
  from jaxdist import control
  from jaxdist.train.factory import controls

  config = adopt_config()
  schedule = netmodel.adopt_c1(1)  # a new network every step
  assert controls.compiled(config) == jd_candidates()
  ctl = Driven(controls.build(config, 2, {'adopt_c1@1': schedule}, num_params=150_000))
  first_plan = ctl.controller.plan(ctl.state, 0)
  assert ctl.index == 0 and not (first_plan.snapshot or first_plan.restore)
  gains = np.full((2, 5), 0.5)
  gains[:, 0] = [0.25, 0.64]  # squared: ‖C(w)‖ / ‖w‖ = 0.5 and 0.8
  out = ctl.step(0, {}, {'norms': np.ones((2, 2)), 'gains': gains})
  plan = ctl.plans[1]
  assert plan.tx_args['candidate'].tolist() == [0, 0] and plan.tx_args['via'].tolist() == [0, 0]
  assert out == {'ratio': 0.1, 'gain': pytest.approx(0.445), 'collective': 'allgather',
                 'phase': 'warmup'}  # fmt: skip
  adopt = ctl.state.inner
  assert adopt.phase == 'explore' and ctl.controller.plan(ctl.state, 1).snapshot
  # step 1 ran on the schedule's first network: 1 ms, 25 Gbit/s
  first = schedule.at(0)
  assert (adopt.latency_s, adopt.bandwidth) == (first.latency, first.bandwidth)
  ctl.step(1, {}, {'norms': np.ones((2, 2)), 'gains': gains})
  assert ctl.state.inner.explore_gains == (pytest.approx(0.65),)  # mean(0.5, 0.8)
  next_plan = ctl.controller.plan(ctl.state, 2)  # explores c0 for a second step
  assert next_plan.exploring and not (next_plan.snapshot or next_plan.restore)
  back = ctl.saved()
  tree = lambda s: json.dumps(control.host.to_tree(s))
  assert tree(back) == tree(ctl.state)
  assert all(
    a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    for a, b in zip(back.inner, ctl.state.inner, strict=True)
    if not isinstance(a, tuple)
  )


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'sync.compressed_allreduce.collective': 'allgather'}, r"collective='auto'"),
    ({'compress.name': 'randomk'}, r"compress.name='topk'"),
    ({'sync.compressed_allreduce.ratios': '0.1,0.2,0.01,0.001'}, r'strictly decreasing'),
    ({'sync.compressed_allreduce.ratios': '0.1,0.01,0.001'}, r'at least four'),
    ({'network.profiles': ''}, r'give config.network.profiles'),
    ({'adopt.window': 0}, r'config.adopt: window must be >= 1'),
    ({'adopt.weights': '0.6,0.6'}, r'config.adopt: .*weights'),
  ],
)
def test_adopt_bad_input_names_the_key(tmp_path, data_dir, monkeypatch, overrides, message):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **{**ADOPT, **overrides})
  with pytest.raises(factory.ConfigError, match=message):
    factory.build(config, str(tmp_path / 'never'))
  assert not os.path.exists(tmp_path / 'never')


def test_the_fixed_ratio_variants_are_adopt_s_candidates():
  from jaxdist import control

  assert config_lib.ADOPT_RATIOS == control.ADOPT_CANDIDATES
  names = [f'fixed{round(1 / r)}x' for r in control.ADOPT_CANDIDATES]
  from jaxdist.train import compare

  variants = compare.load_group(f'{REPO}/configs/variants/adopt.py').variants
  assert [variants[n]['compress']['topk']['ratio'] for n in names] == list(control.ADOPT_CANDIDATES)
