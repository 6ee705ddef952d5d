"""How a device's simulated workers compute their gradients: `make_train_step`'s `per_worker`.

- `'vmap'`: together, one batched program. Every worker has its own
  weights, so each convolution becomes a grouped convolution, which XLA
  runs far slower than a dense one (on the CPU, 8 workers on one device at
  a third of the samples/s of one plain batch: `experiments/bench_step.py`).
- `'loop'`: one after the other (`lax.map`, one loop body whatever the
  number of workers), each worker's convolutions dense; only one worker's
  activations are alive at a time. On the CPU the convolutions in the loop
  are given the NHWC/HWIO layout that XLA's CPU backend needs to call its
  Eigen kernels (it rewrites layouts only outside loops; see `xla_cpu.conv_rule`),
  and the chain's sums over workers are written as dots (`xla_cpu.sum_rows`).
- `'shared'`: together, like `'vmap'`, but every worker's pass reads the
  weights of the device's first worker: the forward and input-gradient
  convolutions are dense ones over all the device's examples, and only
  the weight gradients (one per worker) stay grouped. Correct only for
  methods whose workers hold one model (all-reduce, compressed all-reduce,
  PowerSGD: the same update on every worker); with local SGD, DiLoCo,
  gossip or stale methods the workers' weights differ and it would train
  the wrong model. Opt-in: `'auto'` never picks it.
- `'mean'`: for chains that see the workers' gradients only through their
  equal-weight sum (all-reduce; PowerSGD, linear in that sum). One
  backward pass of the mean of the device's workers' losses, with one
  copy of the weights: every convolution is dense, as in one batch. Each
  worker is handed the device's mean gradient, so the sum over all
  workers is that of every worker's own gradient (to float
  reassociation). Per-worker batch-norm statistics, losses and accuracies
  stay per worker. Wrong for anything that treats a worker's own gradient
  nonlinearly (Top-k or quantisation, clipping, weights per worker): not
  with `counted`. This function's `'auto'` never
  picks it; the trainer's does off the CPU where it is exact
  (`jaxdist.train.factory.per_worker`).
- `'device'`: `'mean'`'s gradient, and one model per device in the train
  state (`make_init(..., per_worker='device')`): the chain runs once per
  device, on the device's mean gradient, under a `vmap` of one (so its
  collectives over the worker axes sum over devices, and a mean over them
  is the mean over workers, the devices holding equal numbers). A device's
  workers' batch-norm statistics are averaged into its one copy, which is
  what the evaluation's mean over workers sees in the other ways (the
  running averages are linear). The state's memory does not grow with the
  simulated workers. Exact where `'mean'` is and the chain's means over
  workers are means (tested: plain all-reduce with momentum, PowerSGD,
  whose one residual per device is the mean of its workers'). Not with `counted` or
  per-worker keyword arguments; `wire` counts a device's transfers once
  per worker, as the other ways do. The trainer uses it where
  `config.sync.per_worker='device'`; it resumes only a checkpoint of the
  same workers, devices and per_worker (no elastic resizing).
  With a `SplitChain` (compressed all-reduce with error feedback: each
  worker compresses its own gradient, so no mean will do), each worker's
  gradient is taken at the device's one model (one after the other on
  the CPU, as `'loop'`; together with the weights shared elsewhere, as
  `'shared'`) and the chain's `workers` part runs per worker, with its
  state (residuals) per worker; every worker gets the same average back
  from its collective, and the `device` part (the optimizer) runs once on
  it for the device's one model. The state holds a model and optimizer
  state per device and only what the method keeps per worker (tested
  against `'vmap'` and `'loop'` on the CPU: Top-k, and DGC with momentum
  correction and warm-up, with error feedback and SGD momentum; the
  gradients' path off the CPU, `vmap` over workers with the weights
  shared, has not been run on an accelerator).
- `'auto'` (default): `'loop'` on the CPU when a device holds more than one
  worker or the step has micro-batches (their loop's convolutions, rewritten
  for XLA's CPU backend, stay dense), else `'vmap'`.

`WAYS` maps each way (and
`'staggered'`: Wavelet's tick-tock waves, one worker after the other under
rematerialisation) to its function of a `Pass`, the train state and the
step's per-worker arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PER_WORKER = ('auto', 'vmap', 'loop', 'shared', 'mean', 'device')
TOGETHER = ('vmap', 'shared', 'mean', 'device')  # run a device's workers at once
MEAN_GRADIENT = ('mean', 'device')  # every worker of a device is handed one mean gradient
# the ways as an error message lists them: "'auto', ... or 'device'"
NAMES = ', '.join(map(repr, PER_WORKER[:-1])) + f' or {PER_WORKER[-1]!r}'


def check(per_worker: str, counted: bool, staggered: bool, split: bool, micro_batch: int = 0):
  """Raises ValueError where `make_train_step`'s arguments contradict one another.

  Args:
    per_worker: the way asked for.
    counted: per-worker counts.
    staggered: the workers one after the other.
    split: the chain is a `SplitChain`.
    micro_batch: the micro-batch of a counted step (0: none).
  """
  if per_worker not in PER_WORKER:
    raise ValueError(f'per_worker must be {NAMES}, got {per_worker!r}')
  if counted and per_worker in MEAN_GRADIENT:
    raise ValueError(
      "per_worker='device' with a SplitChain takes uniform batches: not with counted"
      if split
      else f'per_worker={per_worker!r} hands every worker one mean gradient: not with counted'
    )
  if staggered and per_worker in TOGETHER:
    raise ValueError(
      f'staggered runs workers one after the other: per_worker={per_worker!r} contradicts it'
    )
  if micro_batch < 0 or (micro_batch and not counted):
    raise ValueError(
      f'micro_batch={micro_batch}: micro-batches cut a counted step (counted=True) into '
      'passes of that many examples; give an int >= 1 with counted, or 0'
    )


class Pass(NamedTuple):
  """A worker's forward and backward pass, as the ways combine them.

  Attributes:
    gradients: `(params, model_state, x, y[, count]) -> (grads, model_state,
      loss, accuracy)` of one worker.
    mean_gradient: `(params, model_state, x, y)` of a device's workers ->
      (the gradient of their mean loss at the first worker's weights, their
      model states, losses and accuracies).
    one_worker: `gradients`, rewritten for XLA's CPU backend where it runs in
      a loop (`jaxdist.train.xla_cpu`).
    on_cpu: whether the devices are CPUs.
  """

  gradients: Callable[..., Any]
  mean_gradient: Callable[..., Any]
  one_worker: Callable[..., Any]
  on_cpu: bool


def spread(tree, workers_here: int):
  """The device's one copy of `tree`, broadcast to its workers.

  Args:
    tree: leaves with a leading axis of one.
    workers_here: the device's workers.

  Returns:
    The tree, each leaf's leading axis `workers_here`.
  """
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (workers_here, *a.shape[1:])), tree)


def gathered(model_state):
  """The device's workers' statistics, averaged into its one copy.

  Args:
    model_state: leaves with a leading axis of the device's workers.

  Returns:
    The mean, leading axis one, in each leaf's dtype.
  """
  return jax.tree.map(lambda a: jnp.mean(a, axis=0, keepdims=True).astype(a.dtype), model_state)


def vmap(p: Pass, state, args):
  """Together, one batched program: every worker with its own weights.

  Args:
    p: the passes.
    state: the device's train state (unused).
    args: (params, model_state, x, y[, count]), the device's workers leading.

  Returns:
    (grads, model_state, loss, accuracy), per worker.
  """
  return jax.vmap(p.gradients)(*args)


def loop(p: Pass, state, args):
  """One worker after the other (`lax.map`), each convolution dense.

  Args:
    p: the passes.
    state: the device's train state (unused).
    args: (params, model_state, x, y[, count]), the device's workers leading.

  Returns:
    (grads, model_state, loss, accuracy), per worker.
  """
  return jax.lax.map(lambda args: p.one_worker(*args), args)


def staggered(p: Pass, state, args):
  """`loop` with each worker's pass rematerialised: Wavelet's tick-tock waves.

  Args:
    p: the passes.
    state: the device's train state (unused).
    args: (params, model_state, x, y[, count]), the device's workers leading.

  Returns:
    (grads, model_state, loss, accuracy), per worker.
  """
  wave = jax.checkpoint(lambda args: p.one_worker(*args))
  return jax.lax.map(wave, args)


def mean(p: Pass, state, args):
  """One backward pass of the workers' mean loss, its gradient handed to each worker.

  Args:
    p: the passes.
    state: the device's train state (unused).
    args: (params, model_state, x, y), the device's workers leading.

  Returns:
    (grads, model_state, loss, accuracy), per worker; every worker's
    gradient is the mean.
  """
  y = args[3]
  grad, *rest = p.mean_gradient(*args)
  return jax.tree.map(lambda g: jnp.broadcast_to(g, (y.shape[0], *g.shape)), grad), *rest


def device(p: Pass, state, args):
  """`mean`'s gradient from the device's one model; its workers' statistics averaged into it.

  Args:
    p: the passes.
    state: the device's train state: one model, leading axis one.
    args: (params, model_state, x, y); x and y have the workers leading.

  Returns:
    (grads, model_state, loss, accuracy): the gradient and model state with
    a leading axis of one, losses and accuracies per worker.
  """
  x, y = args[2], args[3]
  model_state = spread(state.model_state, y.shape[0])
  grad, model_state, loss, accuracy = p.mean_gradient(state.params, model_state, x, y)
  return jax.tree.map(lambda g: g[None], grad), gathered(model_state), loss, accuracy


def shared(p: Pass, state, args):
  """Together, every worker's pass reading the first worker's weights, unbatched.

  Args:
    p: the passes.
    state: the device's train state (its first worker's weights are read).
    args: (params, model_state, x, y[, count]), the device's workers leading.

  Returns:
    (grads, model_state, loss, accuracy), per worker.
  """
  first = jax.tree.map(lambda a: a[0], state.params)
  in_axes = (None,) + (0,) * (len(args) - 1)
  return jax.vmap(p.gradients, in_axes)(first, *args[1:])


WAYS = {
  'vmap': vmap,
  'loop': loop,
  'staggered': staggered,
  'mean': mean,
  'device': device,
  'shared': shared,
}


def worker_gradients(p: Pass, model, model_state, x, y):
  """Each worker's gradient at the device's one model; their statistics averaged into it.

  For a `SplitChain`'s per-worker part.

  Args:
    p: the passes.
    model: the device's one model's parameters (no leading axis).
    model_state: its model state, leading axis one.
    x: the device's workers' inputs, workers leading.
    y: their labels, workers leading.

  Returns:
    (grads per worker, the averaged model state, losses, accuracies).
  """
  args = (spread(model_state, y.shape[0]), x, y)
  if p.on_cpu:  # one after the other, each convolution dense (as 'loop')
    grads, model_state, loss, accuracy = jax.lax.map(lambda a: p.one_worker(model, *a), args)
  else:  # together, every pass reading the one copy of the weights (as 'shared')
    grads, model_state, loss, accuracy = jax.vmap(p.gradients, (None, 0, 0, 0))(model, *args)
  return grads, gathered(model_state), loss, accuracy
