"""The config's side of a warm start (`jaxdist.train.warm_start`): which checkpoint a run
begins at, and a comparison's variants that begin at another variant's run."""

from __future__ import annotations

import os

import ml_collections

from jaxdist.train import checkpoint, warm_start


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with `init_step` set to the step a warm start begins at (a copy), or `config`.

  Raises:
    ValueError: `init_from` holds no checkpoint, or not the one `init_step` names, or
      `init_step` is not below `steps`.
  """
  if not config.init_from:
    if config.init_step:
      raise ValueError(
        f'config.init_step={config.init_step} needs config.init_from (the work directory of '
        'the run to start from); drop init_step, or name that run'
      )
    return config
  directory = warm_start.source_directory(config.init_from)
  steps = checkpoint.steps(directory)
  if not steps:
    raise ValueError(
      f'config.init_from={config.init_from!r}: no checkpoint in {directory}; name the work '
      'directory of a run that saved one (config.checkpoint_every)'
    )
  step = int(config.init_step) or steps[-1]
  if step not in steps:
    raise ValueError(
      f'config.init_step={step}: {directory} has checkpoints at steps {steps}; use one of '
      'them, or 0 for the latest'
    )
  if step >= config.steps:
    raise ValueError(
      f'config.init_step={step} is not below config.steps={config.steps}: the run would '
      'train nothing; raise steps (the run goes on from that step to steps)'
    )
  out = ml_collections.ConfigDict(config.to_dict())
  out.init_step = step
  return out


def sibling_sources(configs: dict[str, ml_collections.ConfigDict], workdir: str) -> set[str]:
  """The variants of a comparison whose `init_from` names another of its variants: it is set
  to that variant's work directory (workdir/<name>), which must come before it (it trains
  first). Returns their names.

  Raises:
    ValueError: a variant starts from one listed after it.
  """
  names = list(configs)
  warm = set()
  for i, (name, config) in enumerate(configs.items()):
    source = config.init_from
    if source in configs:
      if names.index(source) >= i:
        raise ValueError(
          f'variant {name!r} starts from variant {source!r} (init_from), which comes after it: '
          f'list {source!r} first, so that it trains first'
        )
      config.init_from = os.path.join(workdir, source)
      warm.add(name)
  return warm


def cold(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` without its warm start (checked before its source has trained)."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.init_from, out.init_step = '', 0
  return out
