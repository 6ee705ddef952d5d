"""The training loop: the only part of jaxdist that reads a config or does I/O.

- `config`: the base config (every option and its default) and `:arg` parsing.
- `factory`: config -> dataset, model, optax chain, workers, networks.
- `trainer`: `train_and_evaluate(config, workdir)`, `train(experiment)`: a run, on `loop.run`
  (its pieces: `feed` batches and evaluation data, `calibrate` the compute term, `host`
  the host controllers, `steplog` the clock and per-step records, `resume` the work
  directory and checkpoints a run may resume from).
- `ledger`: what each step sent and its modelled time; a run's summary.
- `step`: the jitted, sharded train and eval steps.
- `report`: the console's tables and the figures; `columns`: what each table column means.
"""

import importlib
from typing import Any

# Loaded on first use, so that a binary can parse its flags (`cli`) before the training
# stack (flax, orbax, tfds, matplotlib) loads.
_MODULES = ('checkpoint', 'columns', 'compare', 'config', 'factory', 'ledger', 'metrics', 'report')
_NAMES = {
  'ConfigError': 'factory',
  'Experiment': 'factory',
  'build': 'factory',
  'load_config': 'factory',
  'SplitChain': 'step',
  'TrainState': 'step',
  'make_eval_step': 'step',
  'make_init': 'step',
  'make_reference_step': 'step',
  'make_train_step': 'step',
  'train_and_evaluate': 'trainer',
}


def __getattr__(name: str) -> Any:
  if name in _NAMES:
    return getattr(importlib.import_module(f'jaxdist.train.{_NAMES[name]}'), name)
  if name in _MODULES:
    return importlib.import_module(f'jaxdist.train.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(__all__)


__all__ = [
  'ConfigError',
  'Experiment',
  'SplitChain',
  'TrainState',
  'build',
  'checkpoint',
  'columns',
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
