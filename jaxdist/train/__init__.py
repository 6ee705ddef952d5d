"""The training loop: the only part of jaxdist that reads a config or does I/O.

- `config`: the base config (every option and its default) and `:arg` parsing.
- `factory`: config -> dataset, model, optax chain, workers, networks.
- `trainer`: `train_and_evaluate(config, workdir)`, the loop.
- `ledger`: what each step sent and its modelled time; a run's summary.
- `step`: the jitted, sharded train and eval steps.
"""

from jaxdist.train import checkpoint, compare, config, factory, ledger, metrics, report
from jaxdist.train.factory import ConfigError, Experiment, build, load_config
from jaxdist.train.step import (
  SplitChain,
  TrainState,
  make_eval_step,
  make_init,
  make_reference_step,
  make_train_step,
)
from jaxdist.train.trainer import train_and_evaluate

__all__ = [
  'ConfigError',
  'Experiment',
  'SplitChain',
  'TrainState',
  'build',
  'checkpoint',
  'compare',
  'config',
  'factory',
  'ledger',
  'load_config',
  'make_eval_step',
  'make_init',
  'make_reference_step',
  'make_train_step',
  'metrics',
  'report',
  'train_and_evaluate',
]
