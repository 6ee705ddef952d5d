"""Which config changes a run may resume with (`resume.resume_problem`), without training."""

import json
import os

import pytest

from jaxdist.train import factory, resume

from conftest import REPO


def digits(**overrides):
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **overrides)
  return factory.record(config)


SAVED = digits()  # 8 workers, 20 steps


@pytest.mark.parametrize(
  'step, overrides',
  [
    (20, {}),  # a finished run, rerun: its results are reported again
    (10, {}),  # a run killed after its checkpoint at step 10
    (20, {'steps': 40}),  # a finished run, trained on
    (10, {'workers': 16}),  # elastic: steps left, on other workers
    (20, {'workers': 16, 'steps': 40}),
    (10, {'devices': 4}),
    (20, {'progress': False, 'eval_every': 5, 'checkpoint_every': 5, 'keep_checkpoints': 3}),
    (10, {'noise_every': 0, 'eval_batch_size': 64}),
    (10, {'fault.kill_at_step': 0, 'dataset.data_dir': '/data'}),
    (20, {'network.compute_budget_s': 1.0}),
    (10, {'sync.per_worker': 'vmap'}),  # the same run (elastic refuses 'device' itself)
  ],
)
def test_a_run_resumes_with_its_config_and_the_changes_that_keep_it_one_run(step, overrides):
  assert resume.resume_problem(SAVED, digits(**overrides), step) is None


@pytest.mark.parametrize('step', [10, 20])
def test_a_checkpoint_whose_config_records_the_compare_binary_s_variants_resumes(step):
  # the config record of checkpoints written when the config held the variants
  saved = {
    **SAVED,
    'variants': {'dense': {'sync': {'method': 'allreduce'}}, 'powersgd2': {'sync': {
      'method': 'powersgd', 'powersgd': {'rank': 2}}}},
    'compare': 'dense,topk1_ef,artopk1,powersgd2',
  }  # fmt: skip
  assert 'variants' not in digits() and 'compare' not in digits()
  assert resume.resume_problem(saved, digits(), step) is None


def test_a_run_does_not_resume_with_another_config():
  now = digits(**{'sync.local_sgd.period': 8, 'optimizer.learning_rate': 0.05})
  assert resume.resume_problem(SAVED, now, 10) == (
    'its config differs in 2 key(s): optimizer.learning_rate 0.1 → 0.05, '
    'sync.local_sgd.period 4 → 8'
  )
  now = digits(**{'sync.method': 'local_sgd', 'steps': 40, 'workers': 4})
  assert resume.resume_problem(SAVED, now, 20) == (
    'its config differs in 1 key(s): sync.method "allreduce" → "local_sgd"'
  )
  added = {**digits(), 'new_key': 1}  # a key one side does not have
  assert 'new_key null → 1' in resume.resume_problem(SAVED, added, 10)


def test_a_finished_run_does_not_pass_for_other_workers_or_fewer_steps():
  message = resume.resume_problem(SAVED, digits(workers=16), 20)
  assert message == (
    'it is a finished run of workers=8, devices=0: nothing is left to train with '
    'workers=16, devices=0 (raise config.steps above 20 to go on with those)'
  )
  assert 'finished run of workers=8, devices=0' in resume.resume_problem(
    SAVED, digits(devices=2), 20
  )
  # the checkpoint's own record of its workers wins over a config that does not say
  assert 'finished run of workers=4' in resume.resume_problem(SAVED, digits(), 20, 4)
  assert resume.resume_problem(SAVED, digits(steps=10), 20) == 'it is past config.steps=10'
  assert resume.resume_problem(None, digits(workers=16), 20, 8).startswith('it is a finished')


def test_check_resume_reads_the_config_json_of_a_checkpoint_that_does_not_record_it(tmp_path):
  # what the trainer wrote before checkpoints held their config: config.json beside them
  ckpt = tmp_path / 'checkpoints' / '20'
  os.makedirs(ckpt / 'meta')
  (ckpt / 'meta' / 'metadata').write_text(json.dumps({'step': 20, 'workers': 8}))
  (tmp_path / 'config.json').write_text(json.dumps(SAVED))
  before = sorted(p.name for p in tmp_path.rglob('*'))
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **{'model.name': 'mlp'})
  with pytest.raises(factory.ConfigError) as e:
    resume.check_resume(factory.record(config), str(tmp_path))
  assert str(e.value) == (
    f'cannot resume from the checkpoint at step 20 in {tmp_path}: its config differs in 1 '
    'key(s): model.name "cnn" → "mlp"; resume with the config that wrote it, or start afresh '
    'with --fresh (fresh=True in Python), which deletes that run, or in a new --workdir'
  )
  assert sorted(p.name for p in tmp_path.rglob('*')) == before
  runlocal = factory.load_config(f'{REPO}/configs/digits.py:runlocal')
  resume.check_resume(factory.record(runlocal), str(tmp_path))
  resume.check_resume(factory.record(config), str(tmp_path / 'nothing_here'))  # a new run


def test_clear_run_removes_what_a_run_wrote_and_nothing_else(tmp_path):
  for name in resume.RUN_FILES:
    if '.' in name:
      (tmp_path / name).write_text('old')
    else:
      os.makedirs(tmp_path / name / 'inside')
  (tmp_path / 'notes.txt').write_text('mine')
  resume.clear_run(str(tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ['notes.txt']
