"""config.model.hidden: the MLP's widths from the config, checked before anything runs."""

import pytest

from jaxdist.train import factory

from conftest import REPO


def build(tmp_path, data_dir, monkeypatch, **overrides):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **overrides)
  return factory.build(config, str(tmp_path / 'never'))


def test_the_mlp_takes_its_widths(tmp_path, data_dir, monkeypatch):
  exp = build(tmp_path, data_dir, monkeypatch, **{'model.name': 'mlp', 'model.hidden': '32,16'})
  assert exp.model.hidden == (32, 16)
  assert build(tmp_path, data_dir, monkeypatch, **{'model.name': 'mlp'}).model.hidden == (256, 128)


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'model.hidden': '32'}, r"config.model.hidden sets the MLP's widths; model.name is 'cnn'"),
    ({'model.name': 'mlp', 'model.hidden': '32,x'}, r'comma-separated ints'),
    ({'model.name': 'mlp', 'model.hidden': '32,0'}, r'positive widths'),
  ],
)
def test_bad_widths_name_the_key(tmp_path, data_dir, monkeypatch, overrides, message):
  with pytest.raises(factory.ConfigError, match=message):
    build(tmp_path, data_dir, monkeypatch, **overrides)
