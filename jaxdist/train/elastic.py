"""Elastic restore: a checkpoint written by N workers, resharded for M workers.

Every leaf of a `TrainState` carries a leading worker axis (`jaxdist.runtime`).
`reshard` turns the N rows of each leaf of a checkpoint (read as NumPy with
`checkpoint.read`, whatever devices or processes wrote it) into the M rows a
run of M workers starts from, by one rule per leaf:

- `REPLICATED`: equal on every worker (the counts, PRNG keys, DiLoCo's anchor
  and outer optimizer state, local SGD's anchor, SMA's centre, PowerSGD's Q,
  and, for synchronous methods, the model and the optimizer's state). The N
  rows must be bitwise equal (checked: a difference is an error naming the
  leaf); every new worker gets that row.
- `MEAN`: per-worker state whose mean is what matters; every new worker gets
  the mean of the N rows (accumulated in float64, so N equal rows give that
  row exactly). For local models (local SGD, DiLoCo's inner models, SelSync,
  SMA's learners, gossip) this is the model a synchronisation would produce;
  for local optimizer states (momentum, Adam's moments, SelSync's gradient-
  norm history) the state of an average worker; for batch-norm statistics
  what evaluation uses already. For error-feedback memories it conserves the
  update the model is still owed: with mean aggregation each step applies
  (1/N) Σ_n C(g_n + e_n), and (1/N) Σ_n e_n is what has been computed but not
  yet applied; giving each of the M workers e' = (1/N) Σ_n e_n keeps
  (1/M) Σ_m e'_m = (1/N) Σ_n e_n. DeepSpeed's 1-bit Adam and LAMB reset
  their compression errors on every checkpoint load instead (their
  `load_state_dict`: only rank 0's errors are saved, and loading them would
  need the same number of GPUs), which drops that owed update. Integer leaves
  under this rule (an optimizer's step count) must agree across workers.
- `CYCLIC`: new worker m takes old worker m mod N's row. Tick-tock's
  workers hold the model of their wave (worker n is in wave n mod waves): with
  `waves` dividing N and M, worker m gets a model of its own wave, exactly.
- `RESET`: what a step writes before it reads it: `comm.Transfer` counts
  (how often each collective ran in the last step), random-k's last
  positions, the compression-gain probes. Set to zeros, as `init` does.
- `SHARDS`: hierarchical Top-k's error memory, one shard of a node's sum per
  worker (`jaxdist.sync.hitopk`). The owed update E = (1/N) Σ_i concat_j e_ij
  is cut into the new layout's m' shards and every node gets m'·E on its
  shards, so (1/M) Σ_i' concat_j' e'_i'j' = E again.

Which rule a method's model and local optimizer state take is its row's
`model` in `jaxdist.train.methods`: `REPLICATED` for the synchronous methods
(gradient delay's queue holds gradients already averaged, as the trainer
puts the all-reduce first, so it is replicated too), `MEAN` for the local
ones (gossip keeps no buffers beyond the models, which are averaged to their
consensus), `CYCLIC` for tick-tock; each jaxdist state's own fields have
theirs (the rows' `states`, merged in `FIELDS`).

PRNG keys are replicated in every jaxdist state and folded with the worker
index where workers must differ, so keeping the key gives M distinct,
deterministic streams, worker k < min(N, M) continuing worker k's.

Methods whose state holds work in flight are refused with a `ReshardError`
that says what to do (train on N workers, or start afresh): stale-synchronous
and asynchronous SGD (each worker's mailbox of gradients not yet applied,
drawn delays per worker) and the delay-tolerant OD-SGD, SSD-SGD and CD-SGD
(per-worker models one exchange behind the global one, CD-SGD's k-step
corrections). So are the host controllers whose state is per worker (dynamic
or stream batching, adaptive compression), and any jaxdist state this module
has no rule for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxdist import comm
from jaxdist.train import checkpoint, methods
from jaxdist.train.methods import CYCLIC, MEAN, REPLICATED, RESET, SHARDS
from jaxdist.train.step import TrainState

# Per jaxdist state: a rule per field. None: the field's subtree follows the method's rule
# for the model and local optimizer state (the context). Transfers are always RESET.
FIELDS = methods.state_rules()


class ReshardError(ValueError):
  """A checkpoint cannot be resharded onto this run's workers; the message says why."""


def model_rule(method: str) -> str:
  """The rule of the model and the local optimizer's state under `method`.

  Args:
    method: `config.sync.method`.

  Returns:
    The rule (`methods.REPLICATED`, `MEAN`, ...).

  Raises:
    ReshardError: if `method`'s state cannot be resharded.
  """
  row = methods.METHODS.get(method)
  if row is None or not row.model:
    raise ReshardError(_refusal(method))
  return row.model


def _refusal(method: str) -> str:
  row = methods.METHODS.get(method)
  why = (row and row.refused) or 'elastic restore has no resharding rule for its state'
  return (
    f'sync.method={method} cannot be resharded onto another number of workers: {why}. '
    'Resume it with the number of workers that wrote the checkpoint, or start afresh '
    'in a new --workdir'
  )


def check(method: str, saved: int, workers: int, *, multiple: int = 1) -> None:
  """Raises `ReshardError` unless `method`'s state of `saved` workers can move to `workers`.

  Args:
    method: the `config.sync.method` that wrote the checkpoint (and runs now).
    saved: N, the workers that wrote it.
    workers: M, this run's workers.
    multiple: what M must be a multiple of: the section value its row's
      `multiple_of` names (tick-tock's waves).
  """
  model_rule(method)
  if workers < 1:
    raise ReshardError(f'workers must be >= 1, got {workers}')
  if multiple > 1 and workers % multiple:
    key = methods.METHODS[method].multiple_of
    raise ReshardError(
      f'sync.method={method} splits the workers into {multiple} {key}: the {saved} workers of '
      f'the checkpoint can resume on a multiple of {multiple}, not on {workers}'
    )


def rules(template: Any, method: str) -> Any:
  """A tree like `template` (a `TrainState`) with each leaf's rule (a str) in its place.

  `Transfer` nodes keep their static fields; their count's rule is `RESET`.

  Args:
    template: the run's `TrainState` (of arrays or shapes).
    method: `config.sync.method`.

  Returns:
    A `TrainState` of rules.
  """
  context = model_rule(method)
  if not isinstance(template, TrainState):
    raise TypeError(f'rules takes a TrainState, got {type(template).__name__}')
  return TrainState(
    params=_walk(template.params, context),
    model_state=_walk(template.model_state, MEAN),
    opt_state=_walk(template.opt_state, context),
  )


def _walk(node: Any, rule: str) -> Any:
  if isinstance(node, comm.Transfer):
    return dataclasses.replace(node, count=RESET)
  if type(node) in FIELDS:
    fields = FIELDS[type(node)]
    return type(node)(
      **{k: _walk(v, rule if fields[k] is None else fields[k]) for k, v in node._asdict().items()}
    )
  if _is_namedtuple(node):
    if type(node).__module__.startswith('jaxdist.'):
      raise ReshardError(
        f'elastic restore has no resharding rule for {type(node).__name__} '
        f'({type(node).__module__}): resume with the number of workers that wrote the '
        'checkpoint, or start afresh in a new --workdir'
      )
    return type(node)(*(_walk(v, rule) for v in node))
  if isinstance(node, (tuple, list)):
    return type(node)(_walk(v, rule) for v in node)
  if isinstance(node, Mapping):
    return type(node)({k: _walk(v, rule) for k, v in node.items()})
  if node is None:
    return None
  return rule


def _is_namedtuple(node: Any) -> bool:
  return isinstance(node, tuple) and hasattr(node, '_fields')


def _key(path) -> tuple[str, ...]:
  """A tree path as strings: NamedTuple fields, dict keys and list indices alike.

  A checkpoint read with `checkpoint.read` holds dicts and lists where the
  state had NamedTuples, dataclasses and tuples; both spell the same path.
  """
  out = []
  for k in path:
    for attr in ('name', 'key', 'idx'):
      if hasattr(k, attr):
        out.append(str(getattr(k, attr)))
        break
    else:
      out.append(str(k))
  return tuple(out)


@dataclasses.dataclass
class Report:
  """What `reshard` did: the leaves under each rule, and the workers before and after.

  Attributes:
    saved: N, the checkpoint's workers.
    workers: M, this run's.
    leaves: the leaves' dotted names, by the rule that resharded them.
  """

  saved: int
  workers: int
  leaves: dict[str, list[str]]

  def __str__(self) -> str:
    parts = [f'{len(v)} {k}' for k, v in self.leaves.items() if v]
    return f'{self.saved} -> {self.workers} workers: ' + ', '.join(parts) + ' leaves'


def reshard(
  saved: Any,
  template: Any,
  method: str,
  *,
  local_size: tuple[int, int] | None = None,
) -> tuple[Any, Report]:
  """The state of `template`'s M workers from a checkpoint's state of N workers.

  Args:
    saved: the checkpoint's state as `checkpoint.read` returns it (nested
      dicts and lists of NumPy arrays, each with a leading axis of N).
    template: this run's `TrainState` of shapes (`jax.eval_shape` of its
      init), leading axis M: the structure, shapes and dtypes to produce.
    method: `config.sync.method` (the checkpoint's and this run's).
    local_size: (m, m') workers per node before and after, for
      `hitopk_allreduce`'s sharded error memory.

  Returns:
    (the state as `template`'s structure of NumPy arrays, a `Report`).

  Raises:
    ReshardError: a method that cannot be resharded, a checkpoint whose
      leaves do not match `template` (another model or method), or a
      replicated leaf that differs between workers.
  """
  tree = rules(template, method)
  found = {_key(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(saved)[0]}
  wanted = jax.tree_util.tree_flatten_with_path(template)[0]
  rule_leaves = jax.tree.leaves(tree)
  if len(rule_leaves) != len(wanted):
    raise AssertionError('rules and template differ in structure')
  missing = [k for k in (_key(p) for p, _ in wanted) if k not in found]
  extra = set(found) - {_key(p) for p, _ in wanted}
  if missing or extra:
    show = lambda keys: ', '.join('.'.join(k) for k in sorted(keys)[:3])
    raise ReshardError(
      'the checkpoint holds another state than this run: '
      + (f'it lacks {show(missing)}' if missing else '')
      + ('; ' if missing and extra else '')
      + (f'it has {show(extra)} that this run does not' if extra else '')
      + ' (another model or sync method)'
    )
  leaf_n = {v.shape[0] for v in found.values() if v.ndim}
  if len(leaf_n) != 1:
    raise ReshardError(f'the checkpoint leaves disagree on the number of workers: {leaf_n}')
  n = leaf_n.pop()
  m = wanted[0][1].shape[0]
  report = Report(n, m, {REPLICATED: [], MEAN: [], CYCLIC: [], RESET: [], SHARDS: []})
  out = []
  for (path, shape), rule in zip(wanted, rule_leaves, strict=True):
    name = '.'.join(_key(path))
    old = found[_key(path)]
    if old.dtype != shape.dtype:
      raise ReshardError(
        f"the checkpoint's {name} is {old.dtype}, this run's {shape.dtype} "
        '(another model or sync method)'
      )
    if rule == SHARDS:
      new = _shards(old, shape, template, local_size, name)
    elif rule == RESET:  # zeros, as init writes them (hitopk's shard shapes follow the layout)
      new = np.zeros(shape.shape, shape.dtype)
    elif old.shape[1:] != tuple(shape.shape[1:]):
      raise ReshardError(
        f"the checkpoint's {name} has shape {old.shape[1:]} per worker, this run's "
        f'{tuple(shape.shape[1:])} (another model or sync method)'
      )
    else:
      new = _apply(rule, old, m, name)
    report.leaves[rule].append(name)
    out.append(new)
  return jax.tree.unflatten(jax.tree.structure(template), out), report


def _apply(rule: str, old: np.ndarray, m: int, name: str) -> np.ndarray:
  n = old.shape[0]
  if rule == CYCLIC:
    return old[np.arange(m) % n]
  exact = np.issubdtype(old.dtype, np.integer) or old.dtype == np.bool_
  if rule == REPLICATED or exact:
    if not all(np.array_equal(old[0], row, equal_nan=not exact) for row in old[1:]):
      what = 'replicated' if rule == REPLICATED else 'an integer count'
      raise ReshardError(
        f"the checkpoint's {name} is {what} but differs between its {n} workers: "
        'it cannot be resharded (resume with the number of workers that wrote it)'
      )
    return np.broadcast_to(old[:1], (m, *old.shape[1:])).copy()
  if rule == MEAN:
    mean = old.astype(np.float64).mean(axis=0).astype(old.dtype)
    return np.broadcast_to(mean, (m, *old.shape[1:])).copy()
  raise AssertionError(f'unknown rule {rule!r}')


def _shards(old, shape, template, local_size, name: str) -> np.ndarray:
  """Hierarchical Top-k's error memory (node-sum units, one shard per worker), resharded."""
  if local_size is None:
    raise ReshardError(f"{name}: resharding hitopk_allreduce needs local_size (m, m')")
  (m_old, m_new), n_workers = local_size, old.shape[0]
  d = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(template.params))
  s_old, s_new = old.shape[1], shape.shape[1]
  if n_workers % m_old or m_old * s_old < d or shape.shape[0] % m_new or m_new * s_new < d:
    raise ReshardError(
      f"{name}: the checkpoint's {n_workers} x {s_old} shards do not lay out {d} parameters "
      f"on nodes of {m_old} workers, or this run's {shape.shape[0]} x {s_new} on nodes of {m_new}"
    )
  owed = old.astype(np.float64).reshape(-1, m_old * s_old).sum(axis=0)[:d] / n_workers
  padded = np.zeros(m_new * s_new)
  padded[:d] = owed
  nodes = shape.shape[0] // m_new
  return np.tile(m_new * padded.reshape(m_new, s_new), (nodes, 1)).astype(old.dtype)


def owed(residual: np.ndarray) -> np.ndarray:
  """(1/N) Σ_n e_n of an error-feedback memory [N, ...]: the update not yet applied.

  Args:
    residual: [N, ...] every worker's memory.

  Returns:
    float64 [...].
  """
  return np.asarray(residual, np.float64).mean(axis=0)


def describe(method: str) -> str:
  """What `reshard` does to `method`'s state, in a line (for the log).

  Args:
    method: `config.sync.method`.

  Returns:
    The line (why it refuses, for a method it cannot reshard).
  """
  rule = methods.METHODS[method].model if method in methods.METHODS else ''
  return _DESCRIBED.get(rule) or _refusal(method)


_DESCRIBED = {
  REPLICATED: 'the model and optimizer state kept (equal on every worker), error memories averaged',
  MEAN: 'local models and optimizer states averaged, anchors and outer state kept',
  CYCLIC: 'each worker takes a model of its wave, the shared model and optimizer kept',
}


# --- the trainer's side: checks on the checkpoint's metadata, and the restore ------------

# What a checkpoint's metadata records of the run that wrote it (`trainer.train_and_evaluate`).
RECORDED = ('workers', 'devices', 'method', 'model', 'per_worker')
# Metadata measured at the writer's per-worker batch: measured afresh after a resize.
REMEASURED = ('compute_s', 'compute_s_candidates', 'noise')


def recorded(exp) -> dict[str, Any]:
  """The `RECORDED` fields of a run (`factory.Experiment`), for its checkpoints' metadata.

  Args:
    exp: the run.

  Returns:
    workers, devices, method, model and per_worker, by name.
  """
  w = exp.workers
  return {
    'workers': w.count,
    'devices': w.devices,
    'method': exp.method,
    'model': exp.model_name,
    'per_worker': exp.way_asked,
  }


def check_same_run(meta: Mapping[str, Any], exp) -> None:
  """Raises `ReshardError` if a run of one model per device would change workers.

  That is if the checkpoint (its metadata) or this run holds one model per
  device (`sync.per_worker='device'`, which is not resharded) and the two
  differ in workers, devices or per_worker. (Another method or model is
  refused before, with every other config change:
  `jaxdist.train.resume.check_resume`.)

  Args:
    meta: the checkpoint's metadata.
    exp: this run.
  """
  now = recorded(exp)
  layout = ('workers', 'devices', 'per_worker')
  if 'device' in (meta.get('per_worker'), now['per_worker']) and any(
    meta.get(k) != now[k] for k in layout
  ):
    them = ', '.join(f'{k}={meta.get(k)}' for k in layout)
    raise ReshardError(
      f"it was written by {them}; with sync.per_worker='device' the state holds one model "
      'per device, which is not resharded: resume with the workers, devices and per_worker '
      'that wrote it, or start afresh in a new --workdir'
    )


def needed(meta: Mapping[str, Any], exp) -> bool:
  """Whether the checkpoint (its metadata) must be resharded for `exp`'s workers.

  Another number of workers; or, for `hitopk_allreduce`, whose error memory
  is cut in shards of a node's sum, other nodes. A checkpoint that does not
  record its workers (written before elastic restore) is restored as saved.

  Args:
    meta: the checkpoint's metadata.
    exp: this run.

  Returns:
    Whether to reshard.
  """
  now = recorded(exp)
  if 'workers' not in meta:
    return False
  if meta['workers'] != now['workers']:
    return True
  return methods.get(now['method']).shards and meta.get('devices') != now['devices']


def restore(exp, directory: str, step: int, template: Any, meta: dict[str, Any]):
  """(state, metadata, report): checkpoint `step` of other workers, resharded for `exp`'s.

  Reads the checkpoint as NumPy (whatever devices or processes wrote it),
  reshards it (`reshard`) and places every leaf as a restore would (the
  worker axis sharded over the mesh's `data` axis). The metadata loses what
  was measured at the writer's per-worker batch (`REMEASURED`). Nothing in
  `directory` is written.

  Args:
    exp: this run.
    directory: the checkpoints' directory.
    step: the checkpoint's step.
    template: this run's `TrainState` of shapes.
    meta: the checkpoint's metadata.

  Returns:
    (the state placed on this run's workers, the metadata, the `Report`).

  Raises:
    ReshardError: the method, this run's workers or the checkpoint's host
      controllers cannot be resharded.
  """
  workers, method, saved = exp.workers, exp.method, int(meta['workers'])
  check(method, saved, workers.count, multiple=exp.reshard_multiple)
  control = checkpoint.read_control(directory, step)
  host = [k for k in ('batching', 'adaptive') if control.get(k)]
  if host:
    raise ReshardError(
      f'its host controllers ({", ".join(host)}: config.batching, config.adaptive) keep '
      f'state per worker for {saved} workers, which elastic restore does not reshard. Resume '
      'with the number of workers that wrote it, or start afresh in a new --workdir'
    )
  state, _ = checkpoint.read(directory, step)
  local = None
  if methods.get(method).shards:  # a node's sum in shards: the nodes' sizes, saved and now
    local = (saved // int(meta['devices']), workers.per_device)
  arrays, report = reshard(state, template, method, local_size=local)
  put = lambda a: jax.make_array_from_callback(a.shape, workers.sharding, lambda i: a[i])
  placed = jax.tree.map(put, arrays)
  return placed, {k: v for k, v in meta.items() if k not in REMEASURED}, report
