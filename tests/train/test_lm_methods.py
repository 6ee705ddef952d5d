"""Every family of methods trains the GPT on Shakespeare unchanged, and resumes elastically."""

import math

import pytest

from jaxdist.train import checkpoint, factory, metrics, trainer

from conftest import QUICK, REPO

pytestmark = pytest.mark.slow

TOPK = {'sync.method': 'compressed_allreduce', 'compress.name': 'topk', 'compress.topk.ratio': 0.1}
METHODS = {
  'topk_ef': TOPK,
  'gravac': {**TOPK, 'adaptive': 'gravac', 'gravac.window': 2},
  'local_sgd': {'sync.method': 'local_sgd', 'sync.local_sgd.period': 2},
  'selsync': {'sync.method': 'selsync'},
  'streaming_diloco': {'sync.method': 'streaming_diloco'},
  'sparseloco': {'sync.method': 'sparseloco', 'sync.sparseloco.period': 2},
  'demo': {'sync.method': 'demo'},
  'quantized_allreduce': {'sync.method': 'quantized_allreduce'},
  'onebit_adam': {'sync.method': 'onebit_adam', 'sync.onebit_adam.warmup_steps': 2},
}
# the diloco_family notebook trains these on the GPT through the trainer too, and its test
# checks every run's validation loss (finite, below uniform guessing): here in test-all only
IN_THE_NOTEBOOK = ('streaming_diloco', 'sparseloco', 'demo', 'quantized_allreduce', 'onebit_adam')


def config_of(workers, steps, **overrides):
  return factory.load_config(
    f'{REPO}/configs/shakespeare_gpt.py:runlocal,workers={workers}',
    **{'steps': steps, 'eval_every': steps, 'checkpoint_every': 2, 'progress': False, **QUICK,
       **overrides},
  )  # fmt: skip


@pytest.mark.parametrize(
  'name',
  [
    pytest.param(n, marks=pytest.mark.extended) if n in IN_THE_NOTEBOOK else n
    for n in sorted(METHODS)
  ],
)
def test_every_method_trains_the_language_model(name, tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  # 8 steps: 1-bit Adam's first compressed steps overshoot before it settles (on the 2-block
  # GPT its validation loss is 4.79 after step 4, above uniform guessing, and 3.38 after 8)
  config = config_of(4, 8, **{'checkpoint_every': 4, **METHODS[name]})
  summary = trainer.train_and_evaluate(config, str(tmp_path))
  assert summary['unit'] == 'char' and summary['steps'] == 8
  assert math.isfinite(summary['test_loss']) and summary['test_loss'] < math.log(84) + 0.1
  records = metrics.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  assert all(math.isfinite(r['loss']) for r in records)


def test_a_language_model_resumes_on_other_workers(tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  trainer.train_and_evaluate(config_of(8, 2, **TOPK), str(tmp_path))
  summary = trainer.train_and_evaluate(config_of(4, 4, **TOPK), str(tmp_path))
  assert summary['workers'] == 4 and summary['steps_this_run'] == 2
  _, meta = checkpoint.read(str(tmp_path / 'checkpoints'))
  assert meta['step'] == 4 and meta['workers'] == 4
  records = metrics.read_jsonl(str(tmp_path / 'metrics.jsonl'))
  assert [r['step'] for r in records] == [1, 2, 3, 4]
  assert all(math.isfinite(r['loss']) for r in records)
