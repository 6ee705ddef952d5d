"""The sync methods the trainer runs: one row each.

A method's factory arguments are its config section (`config.sync.<name>`,
`jaxdist.train.config`); its row says the rest of what the trainer must know:

- `optimizer`: where the local optimizer goes: 'before' the transform (it
  averages gradients), 'after' it (it averages models), passed 'in' as
  its first argument (it wraps the optimizer), or 'own': the method is the
  whole optimizer (DeMo, 1-bit Adam), and takes `config.optimizer`'s
  learning-rate schedule as its `learning_rate` (the rest of that section,
  its name and weight decay, is the method's own section's business).
- `supplies`: the arguments the trainer supplies from the run rather than
  the section (`factory.SUPPLIES`): the worker axis, the number of workers,
  the compressor of `config.compress`, hierarchical Top-k's node layout.
  `convert` turns a section value into the argument (a bucket size in bytes
  into a bucket plan); an `*optimizer` key (an optimizer section) and an
  `averager` key (a transform's name) are built for every method that has one.
- `weighted`: the factory that replaces `make` when the workers' batches
  differ (dynamic batching, dropped workers): the mean weighted by batch.
- `one_model`, `mean_only`, `device`: which of `make_train_step`'s per-worker
  ways are exact for it: one copy of the weights for every worker's forward
  pass ('shared': every worker applies the same update to one model); one
  backward pass of the device's mean loss ('mean': the update sees the
  gradients only through their sum); one model per device ('device':
  'model' runs the chain once per device, 'split' each worker's gradient
  through the transform and the optimizer once per device).
- `wait`: the modelled clock's waiting rule (`jd.netmodel.WorkerClock`).
- `model`, `refused`, `states`, `multiple_of`, `shards`: elastic restore's
  rules (`jaxdist.train.elastic`): how the model and local optimizer state
  move to another number of workers (`REPLICATED`, `MEAN` or `CYCLIC`; '' and
  `refused` saying why for state that cannot move), a rule per field of each
  jaxdist state the method keeps, a section key the new number of workers
  must be a multiple of, and whether its state is cut in shards by node.

Adding a method: its `jaxdist/sync/<name>.py`, a row here, its section in
`jaxdist.train.config.sync`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax

from jaxdist import netmodel, sync

# elastic restore's rules for a leaf (see jaxdist.train.elastic)
REPLICATED = 'replicated'
MEAN = 'mean'
CYCLIC = 'cyclic'
RESET = 'reset'
SHARDS = 'shards'

Rules = Mapping[type, Mapping[str, str | None]]


# --- waiting rules: WorkerClock arguments from the method's section and the workers --------


def bsp(section: Mapping[str, Any], num_workers: int) -> dict[str, Any]:
  """Every worker waits for all at every step (bulk-synchronous).

  Args:
    section: the method's config section (unused).
    num_workers: K (unused).

  Returns:
    `netmodel.WorkerClock`'s arguments.
  """
  return {'wait': 'bsp'}


def periodic(section: Mapping[str, Any], num_workers: int) -> dict[str, Any]:
  """Workers wait for all only at the steps that synchronise.

  Args:
    section: the method's config section (unused).
    num_workers: K (unused).

  Returns:
    `netmodel.WorkerClock`'s arguments.
  """
  return {'wait': 'periodic'}


def asynchronous(section: Mapping[str, Any], num_workers: int) -> dict[str, Any]:
  """No worker waits.

  Args:
    section: the method's config section (unused).
    num_workers: K (unused).

  Returns:
    `netmodel.WorkerClock`'s arguments.
  """
  return {'wait': 'async'}


def ssp(key: str) -> Callable[[Mapping[str, Any], int], dict[str, Any]]:
  """The fastest worker runs at most `section[key]` steps ahead of the slowest.

  Args:
    key: the section's key of the staleness bound.

  Returns:
    The waiting rule, `(section, num_workers) -> WorkerClock arguments`.
  """
  return lambda section, num_workers: {'wait': 'ssp', 'staleness': section[key]}


def neighbours(section: Mapping[str, Any], num_workers: int) -> dict[str, Any]:
  """A worker waits for the neighbours it mixes with at that step (gossip).

  Args:
    section: the method's config section (its `topology` and `rows`).
    num_workers: K.

  Returns:
    `netmodel.WorkerClock`'s arguments: the mixing matrix by step.
  """
  topology, rows = section['topology'], section['rows']
  mixing = lambda t: sync.mixing_matrix(topology, num_workers, rows, step=t)
  return {'wait': 'neighbours', 'neighbours': mixing}


# --- section values the factory takes in another form --------------------------------------


def delay(value: Any, where: str) -> int | str:
  """gradient_delay's `delay`: an int, or a name ('stages').

  Args:
    value: the section's value.
    where: the section's key, for errors (unused).

  Returns:
    The int, or the name as a str.
  """
  return int(value) if str(value).lstrip('-').isdigit() else str(value)


def bucket_plan(nbytes: int, where: str) -> Callable[[Any], list[list[int]]]:
  """DDP-style buckets of `nbytes` bytes, last leaves first (backward order of flax's naming).

  Args:
    nbytes: bytes per bucket (> 0).
    where: the section's key, for errors.

  Returns:
    The plan: `params -> buckets` (`netmodel.threshold_buckets`).
  """
  if nbytes <= 0:
    raise ValueError(f'config.{where}.buckets (bytes per bucket) must be > 0, got {nbytes}')

  def plan(tree):
    sizes = [x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)]
    return netmodel.threshold_buckets(sizes, nbytes)

  return plan


# --- the table -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Method:
  """What the trainer knows of one sync method (the module docstring says more of each field).

  Attributes:
    make: the method's factory, called with its section and what the
      trainer supplies.
    optimizer: where the local optimizer goes: 'before', 'after', 'in' or
      'own'.
    supplies: the arguments the trainer supplies from the run.
    convert: per section key, `(value, where) -> argument`.
    weighted: the factory when the workers' batches differ, or None.
    one_model: 'shared' is exact for it.
    mean_only: 'mean' is exact for it.
    device: 'device' is exact for it: 'model', 'split' or '' (not).
    wait: the modelled clock's waiting rule, `(section, num_workers) ->
      WorkerClock arguments`.
    model: elastic restore's rule of the model and local optimizer state
      ('' refuses).
    refused: why elastic restore refuses it, where `model` is ''.
    states: elastic restore's rule per field of each jaxdist state it keeps.
    multiple_of: a section key the new number of workers must be a multiple
      of ('' for none).
    shards: its state is cut in shards by node.
    compensations: it takes config.sync.compensation (gradient_delay).
  """

  make: Callable[..., optax.GradientTransformation]
  optimizer: str
  supplies: tuple[str, ...] = ('axis_name',)
  convert: Mapping[str, Callable[[Any, str], Any]] = dataclasses.field(default_factory=dict)
  weighted: Callable[..., optax.GradientTransformation] | None = None
  one_model: bool = False
  mean_only: bool = False
  device: str = ''
  wait: Callable[[Mapping[str, Any], int], dict[str, Any]] = bsp
  model: str = ''
  refused: str = ''
  states: Rules = dataclasses.field(default_factory=dict)
  multiple_of: str = ''
  shards: bool = False
  compensations: bool = False


_IN_FLIGHT = 'its state holds gradients in flight (a per-worker mailbox of delayed gradients)'
_DELAYED = (
  'its workers keep local models one exchange behind the global model (a one-step delay pipeline)'
)
_COUNTED = {'count': REPLICATED, 'key': REPLICATED}
_SYNCED = {'count': REPLICATED, 'synced': REPLICATED, 'anchor': REPLICATED, 'averager': None,
           'wire': RESET, 'just_synced': REPLICATED}  # fmt: skip

# fmt: off
METHODS: Mapping[str, Method] = {
  # gradient averaging: every worker applies the same update to one model
  'allreduce': Method(
    sync.allreduce, 'before', weighted=sync.weighted_allreduce, one_model=True, mean_only=True,
    device='model', model=REPLICATED,
    states={sync.AllReduceState: {'wire': RESET}, sync.WeightedState: {'wire': RESET}},
  ),
  'compressed_allreduce': Method(
    sync.compressed_allreduce, 'before', supplies=('axis_name', 'compressor'), one_model=True,
    device='split', model=REPLICATED,
    states={sync.CompressedState: {
      **_COUNTED, 'residual': MEAN, 'momentum': MEAN, 'compressor_state': RESET, 'wire': RESET,
      'norms': RESET, 'gains': RESET,
    }},
  ),
  'hitopk_allreduce': Method(
    sync.hitopk_allreduce, 'before', supplies=('hierarchy',), one_model=True, model=REPLICATED,
    shards=True,
    states={sync.HiTopKState: {
      **_COUNTED, 'residual': SHARDS, 'compressor_state': RESET, 'intra': RESET, 'inter': RESET,
    }},
  ),
  'powersgd': Method(
    sync.powersgd, 'before', one_model=True, mean_only=True, device='model', model=REPLICATED,
    states={sync.PowerSGDState: {**_COUNTED, 'residual': MEAN, 'qs': REPLICATED, 'wire': RESET}},
  ),
  'quantized_allreduce': Method(
    sync.quantized_allreduce, 'before', supplies=('axis_name', 'num_workers'), one_model=True,
    model=REPLICATED, states={sync.QuantizedState: {'wire': RESET}},
  ),
  'bucketed_allreduce': Method(
    sync.bucketed_allreduce, 'before', convert={'buckets': bucket_plan}, one_model=True,
    mean_only=True, model=REPLICATED,
    states={sync.BucketedState: {'buckets': None, 'wire': RESET}},
  ),
  # the whole optimizer: every worker applies the same sign step of the exchanged momentum
  'demo': Method(
    sync.demo, 'own', model=REPLICATED,
    states={sync.DeMoState: {'count': REPLICATED, 'exchange': None}},  # ChunkedState: sparseloco
  ),
  # whole optimizers (Adam with a frozen variance; the trainer passes config.optimizer's
  # schedule as learning_rate). Elastic: the moments are replicated (1-bit Adam: all-reduced
  # every step; 0/1 Adam: v is, m and the local-step accumulator u are averaged like the local
  # models); the worker error is averaged (it conserves the owed update, as compressed EF);
  # the server error is this worker's chunk of a layout that depends on the number of
  # workers, so it restarts at zero (one step's server rounding, not carried over; a restore
  # on the same workers keeps it exactly).
  'onebit_adam': Method(
    sync.onebit_adam, 'own', supplies=('axis_name', 'num_workers'), model=REPLICATED,
    states={sync.OneBitAdamState: {
      'count': REPLICATED, 'mu': REPLICATED, 'nu': REPLICATED, 'worker_error': MEAN,
      'server_error': RESET, 'wire': RESET,
    }},
  ),
  'zero_one_adam': Method(
    sync.zero_one_adam, 'own', supplies=('axis_name', 'num_workers'), wait=periodic, model=MEAN,
    states={sync.ZeroOneAdamState: {
      'count': REPLICATED, 'mu': MEAN, 'nu': REPLICATED, 'var_count': REPLICATED,
      'var_interval': REPLICATED, 'var_counter': REPLICATED, 'local_interval': REPLICATED,
      'local_counter': REPLICATED, 'rates': REPLICATED, 'accumulator': MEAN,
      'worker_error': MEAN, 'server_error': RESET, 'wire': RESET,
    }},
  ),
  # stale and asynchronous gradients
  'stale_sync': Method(sync.stale_sync, 'before', wait=ssp('max_delay'), refused=_IN_FLIGHT),
  'ssp': Method(sync.ssp, 'before', wait=ssp('staleness'), refused=_IN_FLIGHT),
  'async_sgd': Method(sync.async_sgd, 'before', wait=asynchronous, refused=_IN_FLIGHT),
  # pipelined backprop: the trainer all-reduces first; its queue holds averaged gradients
  'gradient_delay': Method(
    sync.gradient_delay, 'before', supplies=(), convert={'delay': delay}, model=REPLICATED,
    compensations=True,
    states={sync.GradientDelayState: {'queue': None}, sync.SpikeState: {'velocity': None},
            sync.PredictionState: {'weights': None}},
  ),
  # model averaging: a model per worker, averaged now and then
  'local_sgd': Method(
    sync.local_sgd, 'after', wait=periodic, model=MEAN, states={sync.LocalSGDState: _SYNCED}
  ),
  'diloco': Method(
    sync.diloco, 'after', wait=periodic, model=MEAN,
    states={
      sync.DiLoCoState: {**_SYNCED, 'outer_state': REPLICATED},
      # by_steps: each worker's steps this round count again from a resize (the fastest
      # takes the round's last step, so the weights never all vanish)
      sync.StepsDiLoCoState: {
        'count': REPLICATED, 'synced': REPLICATED, 'anchor': REPLICATED, 'outer_state': REPLICATED,
        'wire': RESET, 'just_synced': REPLICATED, 'taken': RESET,
      },
      # eager: each worker's outer model, state and share; the average in flight
      sync.EagerDiLoCoState: {
        'count': REPLICATED, 'synced': REPLICATED, 'anchor': MEAN, 'outer_state': MEAN,
        'wire': RESET, 'pending': REPLICATED, 'mine': MEAN, 'just_synced': REPLICATED,
      },
    },
  ),
  # fragments on a staggered schedule; `pending` (delay >= 2) is the averaged pseudo-gradient
  'streaming_diloco': Method(
    sync.streaming_diloco, 'after', wait=periodic, model=MEAN,
    states={sync.StreamingDiLoCoState: {
      **_SYNCED, 'outer_state': REPLICATED, 'pending': REPLICATED,
    }},
  ),
  # DiLoCo with outer SGD on an error-fed, Top-k-per-tile, 2-bit pseudo-gradient (all-gathered)
  'sparseloco': Method(
    sync.sparseloco, 'after', wait=periodic, model=MEAN,
    states={sync.ChunkedState: {'error': MEAN, 'wire': RESET}},  # and DiLoCoState's (diloco)
  ),
  'gossip': Method(
    sync.gossip, 'after', supplies=('axis_name', 'num_workers'), wait=neighbours, model=MEAN,
    states={sync.GossipState: {'count': REPLICATED, 'wire': RESET}},
  ),
  'sma': Method(
    sync.sma, 'after', model=MEAN,
    states={sync.SMAState: {'center': REPLICATED, 'previous': REPLICATED, 'wire': RESET}},
  ),
  # methods that wrap the local optimizer
  'selsync': Method(
    # every step all-reduces the workers' flags: all wait for the slowest each step (Alg. 1)
    sync.selsync, 'in', wait=bsp, model=MEAN,
    states={sync.SelSyncState: {
      **_SYNCED, 'inner': None, 'norms': MEAN, 'deltas': MEAN, 'smoothed': MEAN,
    }},
  ),
  'tick_tock': Method(
    sync.tick_tock, 'in', model=CYCLIC, multiple_of='waves',
    states={sync.TickTockState: {'weights': REPLICATED, 'inner': REPLICATED, 'wire': RESET}},
  ),
  'od_sgd': Method(sync.od_sgd, 'in', refused=_DELAYED),
  'ssd_sgd': Method(sync.ssd_sgd, 'in', refused=_DELAYED),
  'cd_sgd': Method(
    sync.cd_sgd, 'in', refused=_DELAYED + ' and per-worker compressed-exchange corrections'
  ),
}
# fmt: on


def get(name: str) -> Method:
  """The row of `name`; a ValueError naming the methods there are otherwise.

  Args:
    name: `config.sync.method`.

  Returns:
    The `Method`.
  """
  if name not in METHODS:
    raise ValueError(f'unknown sync.method {name!r}; choose one of {sorted(METHODS)}')
  return METHODS[name]


def having(attribute: str, value: Any = True) -> tuple[str, ...]:
  """The methods whose row has `attribute` equal to `value` (in the table's order).

  Args:
    attribute: a `Method` field.
    value: the value to match.

  Returns:
    The methods' names.
  """
  return tuple(n for n, m in METHODS.items() if getattr(m, attribute) == value)


def state_rules() -> dict[type, Mapping[str, str | None]]:
  """Every jaxdist state's rule per field, over all methods (averagers nest other states).

  Returns:
    The rules, by state class.
  """
  rules: dict[type, Mapping[str, str | None]] = {}
  for m in METHODS.values():
    rules.update(m.states)
  return rules
