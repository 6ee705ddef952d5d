"""Jitted, sharded training and evaluation steps over a `Workers` layout.

Every leaf of `TrainState` has a leading worker axis (one model per device with
`per_worker='device'`: a leading device axis, except the per-worker part of a
`SplitChain`'s state). The train step runs each
worker's forward/backward pass on its own slice of the global batch, then the
optax chain (which may communicate over `workers.axis_name`), all inside one
`shard_map` (devices) × `vmap` (simulated workers) program. The simulated
workers of a device compute their gradients together (`vmap`), one after the
other (`lax.map`), or with one copy of the weights (`shared`, `mean`, `device`):
see `make_train_step`'s `per_worker`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from jaxdist import comm, probes
from jaxdist.models.masked import masked_mean
from jaxdist.runtime import DATA, SIM, Workers
from jaxdist.train import micro, step_metrics, ways, xla_cpu
from jaxdist.train.task import Loss, classes, correct, cross_entropy, per_example


class TrainState(NamedTuple):
  """What a run carries from step to step.

  Attributes:
    params: model parameters. Per-worker (per device with `per_worker='device'`).
    model_state: non-trained variables, e.g. batch-norm statistics ({} if
      none). Per-worker (per device with `per_worker='device'`).
    opt_state: the optax chain's state, communication records included.
      Per-worker (per device with `per_worker='device'`; a `SplitChain`'s
      is then (per-worker state of its `workers` part, per-device state of
      its `device` part)).
  """

  params: optax.Params
  model_state: dict[str, Any]
  opt_state: optax.OptState


def _split_variables(variables: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
  variables = dict(variables)
  return variables.pop('params'), variables


@functools.cache
def _has_train(cls: type) -> bool:
  return 'train' in inspect.signature(cls.__call__).parameters


def takes_train(model: nn.Module) -> bool:
  """Whether `model.__call__` has a `train` argument, which the steps then pass.

  Read from the signature in Python (once per model class), never traced.

  Args:
    model: a Flax module.

  Returns:
    Whether it takes `train`.
  """
  return _has_train(type(model))


def _apply(model: nn.Module, variables, x, train: bool, mutable=False):
  """`model.apply(variables, x)`, with `train=train` if the model takes it."""
  kwargs = {'train': train} if takes_train(model) else {}
  return model.apply(variables, x, mutable=mutable, **kwargs)


def loss_fn(
  model: nn.Module, params, model_state, x, y, train: bool, count=None, loss: Loss = cross_entropy
):
  """Mean of `loss` over the batch (its first `count` examples if given).

  Args:
    model: the Flax module.
    params: its parameters.
    model_state: its other variables ({} if none).
    x: the inputs [B, ...].
    y: the labels, batch leading.
    train: training mode (the model state is updated).
    count: how many of the examples are real (None: all).
    loss: per-example loss, `(outputs, y) -> [B]`.

  Returns:
    (loss, (outputs, new_model_state)).
  """
  variables = {'params': params, **model_state}
  if train and model_state:
    outputs, new_state = _apply(model, variables, x, True, mutable=list(model_state))
  else:
    outputs, new_state = _apply(model, variables, x, train), model_state
  losses_B = per_example(loss, outputs, y)
  mean = jnp.mean(losses_B) if count is None else masked_mean(losses_B, count)
  return mean, (outputs, new_state)


def init_params(
  model: nn.Module, rng: jax.Array, input_shape: tuple[int, ...], input_dtype=jnp.float32
):
  """(params, model_state) of one model replica, from a batch of one example (zeros).

  Args:
    model: the Flax module.
    rng: the PRNG key.
    input_shape: one example's input shape.
    input_dtype: the inputs' (float32 images, int32 tokens).

  Returns:
    (params, model_state).
  """
  kwargs = {'train': False} if takes_train(model) else {}
  return _split_variables(model.init(rng, jnp.zeros((1, *input_shape), input_dtype), **kwargs))


@dataclasses.dataclass(frozen=True)
class SplitChain:
  """`optax.chain(workers, device)`, with a seam where `per_worker='device'` cuts it.

  Anywhere else it is that chain (its state: the two parts' states, in a
  tuple). With `make_train_step(per_worker='device')` the `workers` part
  (e.g. error feedback, compression and the collective of
  `compressed_allreduce`) runs for every worker, with per-worker state, and
  the `device` part (e.g. the momentum optimizer) runs once per device on
  the one model. Correct where every worker's output of the `workers` part
  is the same (an average over all workers: what each gets back from the
  collective), so that the device part sees what each worker's copy would.
  The `device` part must not communicate: `make_train_step` refuses one
  whose state holds a transfer.

  Attributes:
    workers: the part run for every worker (it may communicate).
    device: the part run once per device (it must not).
  """

  workers: optax.GradientTransformation
  device: optax.GradientTransformation

  def _whole(self) -> optax.GradientTransformationExtraArgs:
    return optax.chain(self.workers, self.device)

  def init(self, params: optax.Params) -> optax.OptState:
    """The whole chain's `init`.

    Args:
      params: one worker's parameters.

    Returns:
      The two parts' states, in a tuple.
    """
    return self._whole().init(params)

  def update(self, updates, state, params=None, **extra_args):
    """The whole chain's `update`.

    Args:
      updates: the gradients.
      state: the two parts' states.
      params: the parameters.
      **extra_args: optax's extra arguments.

    Returns:
      (updates, state).
    """
    return self._whole().update(updates, state, params, **extra_args)


def make_init(
  model: nn.Module,
  tx: optax.GradientTransformation,
  workers: Workers,
  input_shape: tuple[int, ...],
  per_worker: str = 'auto',
  input_dtype=jnp.float32,
) -> Callable[[jax.Array], TrainState]:
  """A jitted `rng -> TrainState`: every worker starts from the same replica.

  With `per_worker='device'` (see `make_train_step`) the state holds one
  replica per device instead of one per worker; with a `SplitChain`, the
  state of its `workers` part stays per worker.

  Args:
    model: the Flax module.
    tx: the chain (or a `SplitChain`).
    workers: the worker layout.
    input_shape: one example's input shape.
    per_worker: as `make_train_step`'s.
    input_dtype: the inputs' dtype.

  Returns:
    `(rng, start=None) -> TrainState`, sharded; `start`: a warm start's (params, model_state).
  """
  one_model = per_worker == 'device'
  replicas = workers.devices if one_model else workers.count

  def init(rng, start=None):
    params, model_state = start or init_params(model, rng, input_shape, input_dtype)
    stack = lambda t, n=replicas: jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), t)
    if one_model and isinstance(tx, SplitChain):  # per worker up to the seam, per device after
      opt_state = (jax.vmap(tx.workers.init)(stack(params, workers.count)),
                   jax.vmap(tx.device.init)(stack(params)))  # fmt: skip
    else:
      opt_state = jax.vmap(tx.init)(stack(params))
    return TrainState(stack(params), stack(model_state), opt_state)

  return jax.jit(init, out_shardings=workers.sharding)


def _metrics(loss: jax.Array, accuracy: jax.Array | None) -> dict[str, jax.Array]:
  """The step's per-worker metrics: `accuracy` only where the labels are classes."""
  return {'loss': loss} if accuracy is None else {'loss': loss, 'accuracy': accuracy}


def _accuracy(logits, y, *count):
  if not classes(logits, y):
    return None
  hits = correct(logits, y)
  return masked_mean(hits, *count) if count else jnp.mean(hits)


def _gradients(model, loss, params, model_state, x, y, *count):
  """One worker's (gradient, new model state, loss, accuracy)."""
  grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
  (mean, (logits, model_state)), grads = grad_fn(
    model, params, model_state, x, y, True, *count, loss=loss
  )
  return grads, model_state, mean, _accuracy(logits, y, *count)


def _mean_gradient(model, loss, params, model_state, x, y):
  """(the device's mean gradient, the workers' model states, losses, accuracies)."""

  def mean_loss(first):
    one = lambda ms, x, y: loss_fn(model, first, ms, x, y, True, loss=loss)
    losses, (logits, new_state) = jax.vmap(one)(model_state, x, y)
    return jnp.mean(losses), (losses, logits, new_state)

  first = jax.tree.map(lambda p: p[0], params)
  (_, (losses, logits, model_state)), grad = jax.value_and_grad(mean_loss, has_aux=True)(first)
  return grad, model_state, losses, jax.vmap(_accuracy)(logits, y)


def _update(tx, grads, opt_state, params, tx_args, *extra):  # extra: (count[, scale])
  """The chain's update of one worker, applied (`jaxdist.probes.apply_updates`)."""
  kwargs = {'weight': extra[0]} if extra else {}
  updates, opt_state = tx.update(grads, opt_state, params, **kwargs, **tx_args)
  if len(extra) > 1:
    updates = jax.tree.map(lambda u: u * extra[1].astype(u.dtype), updates)
  return probes.apply_updates(params, updates, opt_state), opt_state


def _split_step(way: ways.Pass, chain, worker_chain, state: TrainState, x, y):
  """A `SplitChain`'s parts: per worker up to the seam, then once for the device's model."""
  model = jax.tree.map(lambda p: p[0], state.params)
  grads, model_state, loss, accuracy = ways.worker_gradients(way, model, state.model_state, x, y)
  worker_state, device_state = state.opt_state
  averaged, worker_state = worker_chain(grads, worker_state, model)
  averaged = jax.tree.map(lambda u: u[:1], averaged)  # every worker's is the same average
  params, device_state = chain(averaged, device_state, state.params, {})
  state = TrainState(params, model_state, (worker_state, device_state))
  return state, _metrics(loss, accuracy)


def make_train_step(
  model: nn.Module,
  tx: optax.GradientTransformation,
  workers: Workers,
  staggered: bool = False,
  counted: bool = False,
  per_worker: str = 'auto',
  loss: Loss = cross_entropy,
  replicated: bool = True,
  micro_batch: int = 0,
) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
  """A jitted `(state, x_WxBx..., y_WxB[, counts_W[, scale_W]]) -> (state, metrics)`; donates state.

  The model and loss (the same for `make_init`, `make_eval_step`,
  `jaxdist.train.noise.make_noise_step` and `make_reference_step`):

  - `model` is a Flax module whose `__call__(x_Bx...)` returns the outputs
    of a batch, `outputs_Bx...` (e.g. logits). If `__call__` has an argument
    named `train`, the steps pass `train=True` in training and
    `train=False` at `init` and evaluation; otherwise they call
    `model.apply(variables, x)` (`takes_train`, read from the signature).
    `init` sees a float32 batch of one example of `input_shape`. Variables
    besides `params` (e.g. `batch_stats`) are the model state, mutable in
    training and read-only in evaluation: a model with such state takes
    `train` (e.g. batch norm's `use_running_average=not train`).
  - `loss(outputs_Bx..., y_B...)` returns one loss per example, shape [B]
    (a mean is refused); the step minimises their mean (the mean of the
    first counts[k] with `counted`), and evaluation adds them up. The
    labels `y` are whatever `loss` takes (integer classes, one-hot rows,
    regression targets), with the batch as their leading axis. Default:
    `cross_entropy`, softmax cross-entropy on integer labels.
  - The `accuracy` metric (argmax of the outputs against the labels) is
    reported only where `y` holds integer labels of the outputs' leading
    shape (and evaluation's `correct` sum likewise).

  Each device runs its workers' forward/backward passes, then the optax
  chain (which may communicate over `workers.axis_name`) for all of them.
  How the simulated workers of a device compute their gradients is
  `per_worker`:

  - `'vmap'`, `'loop'`, `'shared'`, `'mean'` or `'device'`: see
    `jaxdist.train.ways`, which says what each costs and where it is exact.
  - `'auto'` (default): `'loop'` on the CPU when a device holds more than one
    worker or the step has micro-batches, else `'vmap'`.

  Where a way is allowed, all of them compute the same numbers, up to float
  reassociation inside the convolutions and the sums over workers. With `staggered`, the workers go
  one after the other under rematerialisation (`lax.map` over
  `jax.checkpoint`ed passes), the system form of Wavelet's tick-tock waves
  (`jd.sync.tick_tock`); `per_worker` must then be `'auto'` or `'loop'`.

  With `counted`, worker k trains on the first counts[k] of its B examples
  (per-worker batch sizes with static shapes: changing them never
  recompiles), and the chain gets the count as optax's extra argument
  `weight` (for `jd.sync.weighted_allreduce`). A `scale` multiplies each
  worker's update after the chain: the learning rate scaled for this step
  only (ScaDLES's linear scaling by Σb / B; exact for any optax optimizer,
  whose update is the learning rate times a direction). On a step where a
  model-synchronising transform (`local_sgd`, `diloco`, `selsync`) in the
  chain synchronises, the workers take its model, which the scale does not
  reach: scale the learning rate inside the chain for those.

  Keyword arguments reach the chain as optax's extra arguments, one value
  per worker (e.g. `candidate=` of `compressed_allreduce(ratios=...)`).

  Metrics, replicated: `loss` and `accuracy` (where reported, above) averaged over workers (over
  examples, with `counted`); with a compressed all-reduce in the chain,
  each worker's `norms` and `gains` (its `CompressedState`); and
  `wire`: for each `Transfer` in the optimizer state (in tree order), how many
  times it ran this step summed over workers. The per-worker figures cross
  the devices in one all-gather, beside the chain's own collectives.
  With `replicated=False` the step sends nothing of its own: it returns the
  per-worker figures as they are, sharded over the workers
  (`step_metrics.RawMetrics`), and `step_metrics.reduce_metrics` makes the
  same metrics of them on the host, after a fetch (`jax.device_get` in one
  process; `step_metrics.metrics_gather` across processes, one collective
  for many steps' figures). The trainer does so,
  so that a step of local SGD that sends nothing waits for nothing.

  Args:
    model: the Flax module (above).
    tx: the optax chain, or a `SplitChain`.
    workers: the worker layout.
    staggered: run a device's workers one after the other (above).
    counted: take per-worker counts (and a scale) (above).
    per_worker: how a device's workers compute their gradients (above).
    loss: per-example loss (above).
    replicated: return the metrics replicated (above), or per worker.
    micro_batch: with `counted`, a worker's pass loops over micro-batches of
      this many examples, only those holding its first count
      (`jaxdist.train.micro`); 0: one masked pass over all it holds.

  Returns:
    The step; with `replicated=False` its attribute `runs` is what
    `step_metrics.reduce_metrics` needs to count the transfers.
  """

  ways.check(per_worker, counted, staggered, isinstance(tx, SplitChain), micro_batch)
  on_cpu = workers.mesh.devices.flat[0].platform == 'cpu'
  if per_worker == 'auto':
    per_worker = 'loop' if on_cpu and (workers.per_device > 1 or micro_batch) else 'vmap'
  one_model = per_worker == 'device'
  split = one_model and isinstance(tx, SplitChain)
  gradients = one_worker = micro.pass_of(
    functools.partial(_gradients, model, loss), micro_batch, on_cpu
  )
  chain = jax.vmap(functools.partial(_update, tx.device if split else tx), axis_name=SIM)
  worker_chain = None
  if split:  # the workers part's own update: each worker's average, no weights applied
    worker_chain = jax.vmap(tx.workers.update, in_axes=(0, 0, None), axis_name=SIM)
  if on_cpu and (staggered or per_worker == 'loop' or split):
    one_worker = xla_cpu.rewritten(gradients, xla_cpu.conv_rule)
    if split:
      worker_chain = xla_cpu.rewritten(worker_chain, xla_cpu.sum_rule)
    else:
      chain = xla_cpu.rewritten(chain, xla_cpu.sum_rule)
  way = ways.Pass(gradients, functools.partial(_mean_gradient, model, loss), one_worker, on_cpu)
  pass_of = ways.WAYS['staggered' if staggered else per_worker]

  def device_step(state: TrainState, x, y, tx_args, *extra):  # leading: this device's workers
    if split:
      return _split_step(way, chain, worker_chain, state, x, y)
    args = (state.params, state.model_state, x, y, *extra[:1])
    grads, model_state, loss, accuracy = pass_of(way, state, args)
    params, opt_state = chain(grads, state.opt_state, state.params, tx_args, *extra)
    return TrainState(params, model_state, opt_state), _metrics(loss, accuracy)

  mapped = jax.shard_map(
    device_step, mesh=workers.mesh, in_specs=P(DATA), out_specs=P(DATA), check_vma=False
  )

  def step(state, x, y, *extra, **tx_args):
    if counted != bool(extra) or len(extra) > 2:
      raise ValueError(
        f'this step was made with counted={counted}: pass counts (and a scale) iff counted'
      )
    if one_model and tx_args:
      raise ValueError(
        f"per_worker='device' runs the chain once per device: no per-worker arguments "
        f'({", ".join(tx_args)})'
      )
    if split and comm.find_transfers(state.opt_state[1]):
      raise ValueError("a SplitChain's device part runs once per device: it must not communicate")
    state, per_worker = mapped(state, x, y, tx_args, *extra)
    if not replicated:
      return state, step_metrics.raw(state.opt_state, per_worker, extra[:1], split)
    return state, step_metrics.replicated(
      state.opt_state, per_worker, extra[:1], workers, runs, split
    )

  runs = workers.per_device if one_model else 1  # a device's transfer runs once per worker
  jitted = jax.jit(
    step,
    donate_argnums=0,
    out_shardings=(workers.sharding, workers.replicated if replicated else None),
  )
  if replicated:
    return jitted

  @functools.wraps(step)
  def raw_step(*args, **kwargs):
    return jitted(*args, **kwargs)

  raw_step.runs = step_metrics.runs_of(runs, split)
  return raw_step


def trained_params(state: TrainState) -> optax.Params:
  """The weights being trained: `state.params`, unless the chain hands the model others.

  `linear_weight_prediction` gives the forward pass extrapolated weights ŵ
  and keeps the true weights in its state; those are the ones to evaluate
  (`jaxdist.probes.trained_params`).

  Args:
    state: the train state.

  Returns:
    The weights, per worker.
  """
  return probes.trained_params(state.params, state.opt_state)


def make_eval_step(
  model: nn.Module, workers: Workers, loss: Loss = cross_entropy
) -> Callable[..., dict[str, jax.Array]]:
  """A jitted `(state, x_Nx..., y_N, mask_N) -> sums` on the worker-averaged model.

  The model evaluated is the mean of the workers' trained parameters
  (`trained_params`) and batch-norm statistics: for synchronous methods
  every worker holds it already; for local methods it is the consensus
  model.

  Args:
    model: the Flax module.
    workers: the worker layout.
    loss: per-example loss.

  Returns:
    The step; it gives masked sums of the loss and (for integer class
    labels) of the correct predictions, and the count, so chunks can be
    added up.
  """

  on_cpu = workers.mesh.devices.flat[0].platform == 'cpu'
  over_workers = xla_cpu.mean_over_workers if on_cpu else lambda a: jnp.mean(a, axis=0)

  def evaluate(state: TrainState, x, y, mask):
    mean = lambda t: jax.tree.map(over_workers, t)
    variables = {'params': mean(trained_params(state)), **mean(state.model_state)}
    outputs = _apply(model, variables, x, False)
    sums = {'loss': jnp.sum(per_example(loss, outputs, y) * mask), 'count': jnp.sum(mask)}
    if classes(outputs, y):
      sums['correct'] = jnp.sum(correct(outputs, y) * mask)
    return sums

  return jax.jit(evaluate, out_shardings=workers.replicated)


def make_reference_step(
  model: nn.Module, tx: optax.GradientTransformation, loss: Loss = cross_entropy
) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
  """One device, no workers: `(params, model_state, opt_state, x, y) -> (..., loss)`.

  The single-device computation every synchronous method is checked against,
  and the baseline of the step benchmark.

  Args:
    model: the Flax module.
    tx: the chain; it must not communicate.
    loss: per-example loss.

  Returns:
    The jitted step; it donates params and opt_state.
  """

  grad_fn = jax.value_and_grad(functools.partial(loss_fn, loss=loss), argnums=1, has_aux=True)

  def step(params, model_state, opt_state, x, y):
    (loss, (_, model_state)), grads = grad_fn(model, params, model_state, x, y, True)
    updates, opt_state = tx.update(grads, opt_state, params)
    return probes.apply_updates(params, updates, opt_state), model_state, opt_state, loss

  return jax.jit(step, donate_argnums=(0, 2))
