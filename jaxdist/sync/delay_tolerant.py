"""Delay-tolerant SGD of the NUDT group: OD-SGD, SSD-SGD and CD-SGD.

All three keep, on every worker, the global model that a parameter server
would hold, updated each step by a synchronous global step on the mean
gradient (here an all-reduce: every worker can compute the server's update).
A worker does not wait for that update before its next forward pass. It
runs on the previous global model plus a *local* update with its own
gradient (a separate local optimizer), so the exchange overlaps the next
step's compute: the transfers are marked `overlap` for the network model.
Warm-up steps are plain synchronous SGD. A step whose global model the
workers take at once (warm-up, delay 0, SSD-SGD's pull steps) waits for its
exchange: those transfers are charged as blocking.

- OD-SGD: one-step delay: w_local <- w_global(t-1) + local step(g_t).
- SSD-SGD: workers take the global model only every k steps; in between they
  step locally with the global-gradient local update (GLU), here DC-ASGD's
  compensation g + λ g⊙g⊙(w − w_ref) with w_ref the last global model taken.
- CD-SGD: OD-SGD whose gradient exchange is 2-bit threshold quantised with
  error feedback, with a dense correction every k steps. Delay and
  compression are independent: delay 0 takes the new global model at once
  over the same quantised exchange.

The papers' full texts were not available; these follow the authors' MXNet
code as summarised in this project's research notes (`[CODE]` there). Where
the exact rule was not verified (GLU's formula, whether CD-SGD's dense
correction carries the residual) the docstrings say what is done here.

References:
  Xu et al. OD-SGD: One-step Delay Stochastic Gradient Descent for
  Distributed Training. https://arxiv.org/abs/2005.06728
  Xu et al. SSD-SGD: Communication Sparsification for Distributed Deep
  Learning Training. https://arxiv.org/abs/2012.05396
  Yu et al. CD-SGD: Distributed Stochastic Gradient Descent with Compression
  and Delay Compensation. https://arxiv.org/abs/2106.10796
  Zheng et al. Asynchronous SGD with Delay Compensation (DC-ASGD). ICML 2017.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from jaxdist import comm
from jaxdist.compress.quantize import TwoBit
from jaxdist.sync import _checks
from jaxdist.sync.compressed import compressed_allreduce


class DelayedState(NamedTuple):
  """State of `od_sgd`, `ssd_sgd` and `cd_sgd`.

  Attributes:
    count: steps so far. Replicated.
    global_params: the server's model. Replicated.
    global_state: the global optimizer's state. Replicated.
    local_state: the local optimizer's state. Per-worker.
    reference: SSD-SGD's last global model taken (() otherwise). Per-worker.
    exchange: CD-SGD's compressed exchange state (() otherwise). Per-worker.
    wire: the gradient exchange, waited for (warm-up) and overlapped. Per-worker.
  """

  count: jax.Array
  global_params: Any
  global_state: Any
  local_state: Any
  reference: Any
  exchange: Any
  wire: tuple


def _check(name: str, value: int, low: int) -> None:
  if value < low:
    raise ValueError(f'{name} must be >= {low}, got {value}')


def _compensate(grads, here, there, lam: float):
  """DC-ASGD: g + λ g⊙g⊙(there − here), for a gradient taken at `here`, applied at `there`."""
  if not lam:
    return grads
  return jax.tree.map(lambda g, h, t: g + lam * g * g * (t - h), grads, here, there)


def _delayed(
  global_optimizer,
  local_optimizer,
  *,
  axis_name,
  warmup_steps: int,
  delay: int,
  pull_every: int,
  compensation: float,
  exchange=None,
) -> optax.GradientTransformation:
  """The shared skeleton: global step on the exchanged mean, local step with the own gradient."""
  _check('warmup_steps', warmup_steps, 0)
  _check('delay', delay, 0)
  if delay > 1:
    raise ValueError(f'delay must be 0 or 1 (one-step delay), got {delay}')
  _check('k', pull_every, 1)
  local_optimizer = local_optimizer or optax.sgd(0.1)
  ssd = pull_every > 1

  def init_fn(params):
    nbytes = comm.tree_nbytes(params)
    dense = comm.transfer(comm.ALL_REDUCE, nbytes, 0)
    wire = (dense, comm.overlapped(dense))
    return DelayedState(
      count=jnp.zeros([], jnp.int32),
      global_params=params,
      global_state=global_optimizer.init(params),
      local_state=local_optimizer.init(params),
      reference=params if ssd else (),
      exchange=exchange.init(params) if exchange is not None else (),
      wire=wire if exchange is None else (),
    )

  def update_fn(grads, state, params=None):
    _checks.needs_params('delayed SGD', params)
    warm = state.count < warmup_steps
    # take this step's global model, so the next forward waits for this step's exchange:
    # in warm-up, without delay, and on SSD-SGD's pull steps
    take = (delay == 0) | warm
    if ssd:
      take = take | ((state.count + 1) % pull_every == 0)
    take = comm.agree(take, axis_name)
    if exchange is None:
      mean, sent = comm.pmean(grads, axis_name)
      wire = (comm.ran(sent, take), comm.overlapped(comm.ran(sent, ~take)))
      ex_state = ()
    else:
      mean, ex_state = exchange.mean(grads, state.exchange, state.count, warm, take)
      wire = ()
    global_updates, global_state = global_optimizer.update(
      mean, state.global_state, state.global_params
    )
    new_global = optax.apply_updates(state.global_params, global_updates)
    if ssd:  # continue locally from here; GLU compensates against the last global model taken
      base, reference = params, state.reference
      local_grads = _compensate(grads, reference, params, compensation)
    else:  # the previous global model plus a local step (one-step delay)
      base, reference = state.global_params, ()
      local_grads = _compensate(grads, params, base, compensation)
    local_updates, local_state = local_optimizer.update(local_grads, state.local_state, base)
    stepped = optax.apply_updates(base, local_updates)
    new_local = jax.tree.map(lambda g, s: jnp.where(take, g, s), new_global, stepped)
    if ssd:
      reference = jax.tree.map(lambda g, r: jnp.where(take, g, r), new_global, reference)
    new = DelayedState(
      count=optax.safe_increment(state.count),
      global_params=new_global,
      global_state=global_state,
      local_state=local_state,
      reference=reference,
      exchange=ex_state,
      wire=wire,
    )
    return optax.tree.sub(new_local, params), new

  return optax.GradientTransformation(init_fn, update_fn)


def od_sgd(
  global_optimizer: optax.GradientTransformation,
  local_optimizer: optax.GradientTransformation | None = None,
  *,
  axis_name: comm.AxisName,
  warmup_steps: int = 200,
  delay: int = 1,
  compensation: float = 0.0,
) -> optax.GradientTransformation:
  """OD-SGD: the next forward runs on the previous global model plus a local step.

  w_global(t) = global step on mean_n g_n(t); w_local(t+1) = w_global(t-1) +
  local step(g(t)) — the worker does not wait for w_global(t). Replaces the
  optimizer in the chain (give it the global optimizer).

  Args:
    global_optimizer: the server's optimizer (e.g. SGD with momentum).
    local_optimizer: the workers' local optimizer (default SGD, lr 0.1).
    axis_name: the worker axis (or tuple of axes).
    warmup_steps: synchronous steps first (the authors' code: 200).
    delay: 1, or 0 for synchronous SGD.
    compensation: λ of a DC-ASGD correction of the local gradient for the
      gap between the weights it was computed on and the global model it is
      applied to (0 = off; the authors recommend a DC-ASGD-like local
      optimizer, λ 0.04).

  Returns:
    An `optax.GradientTransformation` in place of the optimizer (it needs
    `params`): its updates move each worker to w_global(t−1) + local step.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.od_sgd(optax.sgd(1.0), optax.sgd(0.5), axis_name=runtime.AXES, warmup_steps=1)
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> g = {'x': jnp.array([1.0, 3.0])}
    >>> run(g)['x']  # warm-up: synchronous SGD on the mean gradient 2
    Array([-2., -2.], dtype=float32)
    >>> run(g)['x']  # w_global(0) - 0.5 g_own, while w_global(1) = -2 - 2
    Array([-2.5, -3.5], dtype=float32)
    >>> run.history  # the all-reduce, [waited for, overlapped]
    [[1, 0], [0, 1]]

  References:
    Xu et al. OD-SGD: One-step Delay Stochastic Gradient Descent for
    Distributed Training. https://arxiv.org/abs/2005.06728
  """
  return _delayed(
    global_optimizer,
    local_optimizer,
    axis_name=axis_name,
    warmup_steps=warmup_steps,
    delay=delay,
    pull_every=1,
    compensation=compensation,
  )


def ssd_sgd(
  global_optimizer: optax.GradientTransformation,
  local_optimizer: optax.GradientTransformation | None = None,
  k: int = 5,
  *,
  axis_name: comm.AxisName,
  warmup_steps: int = 500,
  compensation: float = 0.04,
) -> optax.GradientTransformation:
  """SSD-SGD: gradients pushed every step; the global model taken every k steps.

  w_global(t) = global step on mean_n g_n(t), every step; a worker takes
  w_local(t+1) = w_global(t) on pull steps ((t+1) mod k = 0), and else
  w_local(t+1) = w_local(t) + local step(GLU(g(t))). Between takes, workers
  update locally with the global-gradient local update (GLU). GLU's exact
  formula was not available; this uses the DC-ASGD compensation found in
  the authors' code, g + λ g⊙g⊙(w − w_ref), w_ref the last global model
  taken. k = 1 is synchronous SGD. A pull step's all-reduce is waited for
  (the next forward needs its result); the others overlap the next step.

  Args:
    global_optimizer: the server's optimizer.
    local_optimizer: the local optimizer (default SGD, lr 0.1).
    k: steps between takes of the global model (the authors' code: 5).
    axis_name: the worker axis (or tuple of axes).
    warmup_steps: synchronous steps first (the authors' code: 500).
    compensation: λ of the GLU compensation (DC-ASGD's default 0.04).

  Returns:
    An `optax.GradientTransformation` in place of the optimizer (it needs
    `params`): its updates move each worker to its local model, and to the
    global model on pull steps.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.ssd_sgd(
    ...   optax.sgd(1.0), optax.sgd(0.5), 2, axis_name=runtime.AXES, warmup_steps=0,
    ...   compensation=0.0)
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> g = {'x': jnp.array([1.0, 3.0])}
    >>> run(g)['x']  # a local step: -0.5 g_own
    Array([-0.5, -1.5], dtype=float32)
    >>> run(g)['x']  # pull step: the global model, 0 - 2 - 2
    Array([-4., -4.], dtype=float32)
    >>> run.history  # the all-reduce, [waited for, overlapped]: the pull step waits
    [[0, 1], [1, 0]]

  References:
    Xu et al. SSD-SGD: Communication Sparsification for Distributed Deep
    Learning Training. https://arxiv.org/abs/2012.05396
    Zheng et al. Asynchronous Stochastic Gradient Descent with Delay
    Compensation. ICML 2017. https://arxiv.org/abs/1609.08326
  """
  _check('k', k, 1)
  return _delayed(
    global_optimizer,
    local_optimizer,
    axis_name=axis_name,
    warmup_steps=warmup_steps,
    delay=1 if k > 1 else 0,
    pull_every=k,
    compensation=compensation,
  )


class _Exchange(NamedTuple):
  init: Any
  mean: Any  # (grads, state, count, warm, take) -> (mean, state)


def _cd_exchange(k: int, threshold: float, axis_name, flush: bool, hidden: bool) -> _Exchange:
  """2-bit quantised exchange with error feedback; dense in warm-up and every k-th step.

  The dense correction carries the quantisation residual too if `flush`.

  State: (the quantised exchange's state, whose transfers are marked
  overlapped if `hidden` (one-step delay: the 2-bit steps come after the
  warm-up and are never waited for); (dense exchange waited for, dense
  exchange overlapped)).
  """
  quantised = compressed_allreduce(TwoBit(threshold), axis_name=axis_name, collective='allgather')
  mark = comm.overlapped if hidden else lambda tree: tree

  def init(params):
    dense = comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0)
    return mark(quantised.init(params)), (dense, comm.overlapped(dense))

  def mean(grads, state, count, warm, take):
    q_state, (blocking, overlapped) = state

    def dense(grads, q_state):
      flat, unravel = ravel_pytree(grads)
      if flush:  # the correction also sends what the quantiser held back
        total, _ = comm.pmean(flat + q_state.residual[0], axis_name)
        q_state = q_state._replace(residual=(jnp.zeros_like(flat),))
      else:
        total, _ = comm.pmean(flat, axis_name)
      q_state = q_state._replace(wire=comm.silence(q_state.wire))
      return unravel(total), q_state

    def quantise(grads, q_state):
      out, q_state = quantised.update(grads, q_state)
      return out, mark(q_state)

    dense_now = comm.agree(warm | (count % k == 0), axis_name)
    out, q_state = lax.cond(dense_now, dense, quantise, grads, q_state)
    wire = (comm.ran(blocking, dense_now & take), comm.ran(overlapped, dense_now & ~take))
    return out, (q_state, wire)

  return _Exchange(init, mean)


def cd_sgd(
  global_optimizer: optax.GradientTransformation,
  local_optimizer: optax.GradientTransformation | None = None,
  k: int = 5,
  *,
  axis_name: comm.AxisName,
  threshold: float = 0.5,
  warmup_steps: int = 1000,
  delay: int = 1,
  compensation: float = 0.0,
  flush_residual: bool = False,
) -> optax.GradientTransformation:
  """CD-SGD: OD-SGD with 2-bit threshold-quantised gradients and a dense correction every k steps.

  Gradients are quantised to ±threshold or 0 (2 bits, MXNet's `2bit`) with
  error feedback; every k-th step the dense gradient goes instead. Whether
  the authors' correction also carries (and empties) the quantisation
  residual was not verified: by default it does not (the residual keeps
  draining through the 2-bit steps); `flush_residual=True` sends it with the
  correction. The one-step delay hides the exchange behind the next step's
  compute, as in OD-SGD:

    w_global(t) = global step on mean_n ĝ_n(t), ĝ = g in warm-up and when
      t mod k = 0, else Q(g + r) with r <- g + r − Q(g + r);
    w_local(t+1) = w_global(t−1) + local step(g(t))   (delay 1)
    w_local(t+1) = w_global(t)                        (delay 0).

  Delay and compression are independent: delay 0 still quantises (except
  every k-th step), and waits for each exchange; delay 0 with k = 1 is
  synchronous SGD.

  Args:
    global_optimizer: the server's optimizer.
    local_optimizer: the local optimizer (default SGD, lr 0.1).
    k: dense correction every k steps (the authors' code: 5).
    axis_name: the worker axis (or tuple of axes).
    threshold: the 2-bit quantiser's τ (the authors' runs: 0.5).
    warmup_steps: synchronous dense steps first (the authors' code: 1000).
    delay: 1, or 0 for no delay.
    compensation: λ of a DC-ASGD correction of the local gradient.
    flush_residual: the dense correction also sends the residual.

  Returns:
    Like `od_sgd`: a transform in place of the optimizer, which needs `params`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.cd_sgd(optax.sgd(1.0), optax.sgd(0.5), 2, axis_name=runtime.AXES,
    ...   threshold=1.0, warmup_steps=0)
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> for step in range(2):  # dense (t mod 2 = 0), then 2-bit; workers: w_global(t-1) - 0.5 g_own
    ...   print(run({'x': jnp.array([0.4, 1.6])})['x'])
    [-0.2 -0.8]
    [-1.2 -1.8]
    >>> run.state.global_params['x']  # -1 - mean(Q(0.4), Q(1.6)) = -1 - (0 + 1) / 2
    Array([-1.5, -1.5], dtype=float32)
    >>> run.history  # [2-bit all-gather, dense waited for, dense overlapped]
    [[0, 0, 1], [1, 0, 0]]

  References:
    Yu et al. CD-SGD: Distributed Stochastic Gradient Descent with
    Compression and Delay Compensation. https://arxiv.org/abs/2106.10796
  """
  _check('k', k, 1)
  if threshold <= 0:
    raise ValueError(f'threshold must be > 0, got {threshold}')
  return _delayed(
    global_optimizer,
    local_optimizer,
    axis_name=axis_name,
    warmup_steps=warmup_steps,
    delay=delay,
    pull_every=1,
    compensation=compensation,
    exchange=_cd_exchange(k, threshold, axis_name, flush_residual, hidden=delay == 1),
  )
