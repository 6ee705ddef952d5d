"""The training loop: the only part of jaxdist that reads a config or does I/O."""

from jaxdist.train import checkpoint, compare, metrics, report
from jaxdist.train.step import (
  TrainState,
  make_eval_step,
  make_init,
  make_reference_step,
  make_train_step,
)
from jaxdist.train.trainer import ConfigError, Experiment, build, load_config, train_and_evaluate

__all__ = [
  'ConfigError',
  'Experiment',
  'TrainState',
  'build',
  'checkpoint',
  'compare',
  'load_config',
  'make_eval_step',
  'make_init',
  'make_reference_step',
  'make_train_step',
  'metrics',
  'report',
  'train_and_evaluate',
]
