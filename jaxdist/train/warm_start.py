"""Warm start: a run that begins at another run's checkpoint, with a method of its own.

`config.init_from` names the work directory of a finished (or running) run
and `config.init_step` one of its checkpoints (0: the latest). The new run,
in its own work directory, begins at that step:

- its parameters and model state are the checkpoint's, averaged over the
  checkpoint's workers (a dense run's workers hold one model; a periodic
  method's hold drifted copies, and their mean is the model they average
  to), every worker of the new run starting from that one replica;
- its optimizer and method state are fresh (`make_init` of its own chain
  at those parameters): the DiLoCo paper's warm start, where data-parallel
  pre-training hands its model to DiLoCo (Douillard et al., arXiv
  2311.08105), or a change of method mid-run;
- its step, its data position (a batch is a function of the seed and the
  step) and its learning-rate schedule go on from the checkpoint's step (the
  fresh optimizer counts from 0 there: `factory.chain.build_optimizer`'s
  `start`).

The new run's own checkpoints, once it has any, are what it resumes from;
the source is read once and never written. `factory.warm` reads the config:
which checkpoint, and a comparison's variants that start from another.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from jaxdist.train import checkpoint, metrics


def source_directory(init_from: str) -> str:
  """The checkpoints' directory of the run `init_from` names (its work directory, or that
  directory itself)."""
  inside = os.path.join(init_from, checkpoint.DIRECTORY)
  return os.path.abspath(inside if os.path.isdir(inside) else init_from)


def start_state(exp, init, template) -> Any:
  """The warm-started run's first state: `init` at the source checkpoint's model.

  Args:
    exp: the run (`exp.init_from`, `exp.init_step`).
    init: `make_init`'s function (`(rng, start) -> TrainState`).
    template: the run's `TrainState` of shapes.

  Returns:
    The state, placed on the run's workers.

  Raises:
    ValueError: the checkpoint's model differs from this run's.
  """
  saved, _ = checkpoint.read(exp.init_from, exp.init_step)
  start = tuple(
    _one_replica(saved.get(part, {}), getattr(template, part), f'{part} of {exp.init_from}')
    for part in ('params', 'model_state')
  )
  return init(jax.random.key(exp.seed), start)


def _one_replica(saved: Any, template: Any, where: str) -> Any:
  """`template`'s tree (without its leading worker axis) from the saved per-worker arrays:
  floats averaged over the saved workers (in float64: workers that hold one model give it
  back bit for bit), other dtypes taken from the first."""
  from jaxdist.train.elastic import _key  # the key paths the elastic restore matches by

  found = {_key(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(saved)[0]}
  wanted, treedef = jax.tree_util.tree_flatten_with_path(template)
  names = lambda keys: ', '.join('.'.join(k) for k in sorted(keys)[:3])
  missing = [_key(p) for p, _ in wanted if _key(p) not in found]
  extra = set(found) - {_key(p) for p, _ in wanted}
  if missing or extra:
    lacks = [f'it lacks {names(missing)}'] if missing else []
    has = [f'it has {names(extra)} that this run does not'] if extra else []
    raise ValueError(
      f"{where}: another model than this run's: {'; '.join(lacks + has)}. Start from a run "
      'of the same model (config.model)'
    )
  leaves = []
  for path, shape in wanted:
    x = found[_key(path)]
    if x.shape[1:] != shape.shape[1:]:
      raise ValueError(
        f'{where}: {".".join(_key(path))} is {x.shape[1:]} there and {shape.shape[1:]} here: '
        'another model size. Start from a run of the same model (config.model)'
      )
    one = x.mean(axis=0, dtype=np.float64) if np.issubdtype(x.dtype, np.floating) else x[0]
    leaves.append(one.astype(shape.dtype))
  return jax.tree.unflatten(treedef, leaves)


def provenance(exp) -> dict[str, Any]:
  """A warm-started run's summary entries: where it began (`init_from`, `init_step`) and the
  bytes each worker of the source sent up to that step (`source_sent_bytes_per_worker`, from
  its metrics; None where it has none), so that the whole token budget's bytes can be told.
  Empty for a run that began from scratch."""
  if not exp.init_from:
    return {}
  run = exp.init_from  # the checkpoints' directory; its run's metrics lie beside it
  if os.path.basename(run) == checkpoint.DIRECTORY:
    run = os.path.dirname(run)
  path = os.path.join(run, metrics.METRICS_FILE)
  records = metrics.read_jsonl(path) if os.path.exists(path) else []
  sent = [r.get('sent_bytes', 0) for r in records if r.get('step', 0) <= exp.init_step]
  return {
    'init_from': run,
    'init_step': int(exp.init_step),
    'source_sent_bytes_per_worker': float(sum(sent)) if sent else None,
  }
