"""The training loop: the only part of jaxdist that reads a config or does I/O.

- `config`: the base config (every option and its default), `:arg` parsing, and
  `config_path`: the config files that come with jaxdist, by name.
- `factory`: config -> dataset, model, optax chain, workers, networks.
- `trainer`: `train_and_evaluate(config, workdir)`, `train(experiment)`: a run, on `loop.run`
  (its pieces: `feed` batches and evaluation data, `calibrate` the compute term, `host`
  the host controllers, `steplog` the clock and per-step records, `resume` the work
  directory and checkpoints a run may resume from).
- `ledger`: what each step sent and its modelled time; a run's summary.
- `step`: the jitted, sharded train and eval steps.
- `trials`: a config trained at K workers and batch B; Scavenger's job plan on them.
- `report`: the console's tables and the figures; `columns`: what each table column means.
"""

from typing import Any

from jaxdist import _load

# Loaded on first use, so that a binary can parse its flags (`cli`) before the training
# stack (flax, orbax, tfds, matplotlib) loads.
_MODULES = (
  'checkpoint', 'columns', 'compare', 'config', 'factory', 'ledger', 'metrics', 'report',
  'trials',
)  # fmt: skip
_NAMES = {
  'ConfigError': 'factory',
  'Experiment': 'factory',
  'build': 'factory',
  'config_path': 'config',
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
    return getattr(_load(f'jaxdist.train.{_NAMES[name]}', 'train'), name)
  if name in _MODULES:
    return _load(f'jaxdist.train.{name}', 'train')
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
  'config_path',
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
  'trials',
]
