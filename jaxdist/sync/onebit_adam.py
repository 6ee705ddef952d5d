"""1-bit Adam and 0/1 Adam: Adam whose frozen variance lets the momentum travel at 1 bit.

Both are whole optimizers (they replace the gradient all-reduce and Adam).
Their compressed all-reduce (`onebit_allreduce`) is DeepSpeed's: each worker
sends sign bits and one scale per tensor of (vector + its worker error), an
all-to-all gives worker j chunk j of every worker's signs (the "server"
role), it averages them, adds its server error, compresses again, and an
all-gather gives everyone every server's chunk. Signs are packed 8 to a
byte, so the bytes in the lowered HLO are the honest 1-bit payload.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.compress.base import pack_bits
from jaxdist.sync import _checks

ScalarOrSchedule = float | Callable[[jax.Array], jax.Array]


# --- the 1-bit compressed all-reduce with worker and server error feedback -----------------


def _chunks(params: Any, n: int) -> list[int]:
  """Per leaf, the server chunk c (a multiple of 8): the leaf is zero-padded to n·c elements."""
  return [8 * max(1, math.ceil(x.size / (8 * n))) for x in jax.tree.leaves(params)]


def _wire(params: Any, n: int) -> tuple[comm.Transfer, ...]:
  """The collectives of one compressed all-reduce of `params`, not run (count 0).

  (all-to-all of the packed worker signs, n·c/8 bytes a leaf; all-gather of
  the worker scales, 4 bytes a leaf; all-gather of the packed server signs,
  c/8 bytes a leaf; all-gather of the server scales, 4 bytes a leaf.)
  """
  chunks, leaves = _chunks(params, n), len(jax.tree.leaves(params))
  signs = sum(chunks) // 8
  return (
    comm.transfer(comm.ALL_TO_ALL, n * signs, 0),
    comm.transfer(comm.ALL_GATHER, 4 * leaves, 0),
    comm.transfer(comm.ALL_GATHER, signs, 0),
    comm.transfer(comm.ALL_GATHER, 4 * leaves, 0),
  )


def _all_to_all(x: jax.Array, axis_name: comm.AxisName) -> tuple[jax.Array, comm.Transfer]:
  """Row j of every worker's x [N, ...] to worker j: row i of the result is worker i's row j.

  Over (devices, simulated) axes the exchange runs innermost first, one
  `lax.all_to_all` per axis (on simulated workers the inner one is a
  transpose, not a collective). The payload is x's bytes.
  """
  names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  n = comm.axis_size(axis_name)
  sizes = [lax.axis_size(name) for name in names]
  if x.shape[0] != n:
    raise ValueError(f'all-to-all needs a leading axis of {n} rows, got {x.shape}')
  y = x.reshape((*sizes, *x.shape[1:]))
  for i in reversed(range(len(names))):
    y = lax.all_to_all(y, names[i], split_axis=i, concat_axis=i, tiled=True)
  return y.reshape(x.shape), comm.transfer(comm.ALL_TO_ALL, comm.tree_nbytes(x))


def _unpack_NxC(packed_NxB: jax.Array) -> jax.Array:
  """±1.0 of packed sign bits [N, B] (little end first), as [N, 8·B]."""
  bits = (packed_NxB[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & jnp.uint8(1)
  return bits.reshape(packed_NxB.shape[0], -1).astype(jnp.float32) * 2 - 1


def _rms(x: jax.Array, count: jax.Array | int) -> jax.Array:
  """‖x‖₂ / √count (the scale of a sign code: magnitude of x over magnitude of sign(x))."""
  return jnp.sqrt(jnp.sum(jnp.square(x))) / jnp.sqrt(jnp.maximum(count, 1).astype(jnp.float32))


def onebit_allreduce(
  tree: Any, worker_error: Any, server_error: jax.Array, *, axis_name: comm.AxisName
) -> tuple[Any, Any, jax.Array, tuple[comm.Transfer, ...]]:
  """The mean of `tree` over workers, sent at 1 bit per element with two error feedbacks.

  Per leaf of d elements, zero-padded to N chunks of c (`_chunks`):

    worker:  x = tree + δ_w;  s = ‖x‖/√d;  sends sgn(x) (sgn(0) = +1) and s;
             δ_w ← x − s·sgn(x)
    server j (after an all-to-all of chunk j of every worker's signs and an
             all-gather of the scales):
             y = (1/N) Σ_i s_i·sgn_i[chunk j] + δ_s;  s̄ = ‖y‖/√d_j;
             sends sgn(y) and s̄;  δ_s ← y − s̄·sgn(y)
    everyone (after an all-gather of the servers' signs and scales):
             result = concat_j s̄_j·sgn_j, padding dropped.

  d_j counts chunk j's elements that are not padding, and padding never
  enters y or δ_s (DeepSpeed counts padding zeros in √d and lets them carry
  error; here padding has no effect, so the result does not depend on how
  the leaf is padded).

  Args:
    tree: this worker's vectors (any pytree of float arrays).
    worker_error: δ_w, float32, shaped like `tree`.
    server_error: δ_s, float32 [Σ_l c_l], this worker's chunk of every leaf.
    axis_name: the worker axis (or tuple of axes).

  Returns:
    (the mean, the same on every worker, in `tree`'s dtypes; new δ_w; new
    δ_s; the four `comm.Transfer`s of `_wire`).
  """
  n = comm.axis_size(axis_name)
  leaves, treedef = jax.tree.flatten(tree)
  errors = treedef.flatten_up_to(worker_error)
  chunks = _chunks(leaves, n)
  signs, scales, new_errors = [], [], []
  for x, e, c in zip(leaves, errors, chunks, strict=True):
    x_D = x.reshape(-1).astype(jnp.float32) + e.reshape(-1)
    s = _rms(x_D, x_D.size)
    new_errors.append((x_D - s * jnp.where(x_D >= 0, 1.0, -1.0)).reshape(x.shape))
    bits = jnp.pad(x_D >= 0, (0, n * c - x_D.size), constant_values=True)
    signs.append(pack_bits(bits, 1).reshape(n, c // 8))
    scales.append(s)
  recv_NxB, sent_signs = _all_to_all(jnp.concatenate(signs, axis=1), axis_name)
  scales_NxL, sent_scales = comm.all_gather(jnp.stack(scales), axis_name)

  j = comm.axis_index(axis_name)
  server_signs, server_scales, new_server = [], [], []
  byte, at = 0, 0
  for leaf, (x, c) in enumerate(zip(leaves, chunks, strict=True)):
    sgn_NxC = _unpack_NxC(recv_NxB[:, byte : byte + c // 8])
    real_C = j * c + jnp.arange(c) < x.size
    y_C = (
      jnp.sum(scales_NxL[:, leaf, None] * sgn_NxC, axis=0) * (1.0 / n) + server_error[at : at + c]
    )
    y_C = jnp.where(real_C, y_C, 0.0)
    s = _rms(y_C, jnp.clip(x.size - j * c, 0, c))
    new_server.append(jnp.where(real_C, y_C - s * jnp.where(y_C >= 0, 1.0, -1.0), 0.0))
    server_signs.append(pack_bits(y_C >= 0, 1))
    server_scales.append(s)
    byte, at = byte + c // 8, at + c
  all_NxB, sent_server_signs = comm.all_gather(jnp.concatenate(server_signs), axis_name)
  all_NxL, sent_server_scales = comm.all_gather(jnp.stack(server_scales), axis_name)

  out, byte = [], 0
  for leaf, (x, c) in enumerate(zip(leaves, chunks, strict=True)):
    sgn_NxC = _unpack_NxC(all_NxB[:, byte : byte + c // 8])
    mean = (all_NxL[:, leaf, None] * sgn_NxC).reshape(-1)[: x.size]
    out.append(mean.reshape(x.shape).astype(x.dtype))
    byte += c // 8
  wire = (sent_signs, sent_scales, sent_server_signs, sent_server_scales)
  return (
    jax.tree.unflatten(treedef, out),
    jax.tree.unflatten(treedef, new_errors),
    jnp.concatenate(new_server),
    wire,
  )


def _masked(tree: Any, nu: Any) -> Any:
  """`tree` zeroed where v = 0: entries that never had a gradient (1 bit cannot send 0).

  DeepSpeed's user-supplied `exp_avg_mask`, read off the variance: sgn(0) = +1 would give
  such an entry ±scale, and with √v + ε = ε its step would be η·scale/ε.
  """
  return jax.tree.map(lambda x, v: jnp.where(v > 0, x, jnp.zeros_like(x)), tree, nu)


# --- shared pieces ---------------------------------------------------------------------------


def _check_common(learning_rate, num_workers, b1, b2, eps, weight_decay) -> None:
  if not callable(learning_rate):
    _checks.check('learning_rate', learning_rate, lambda v: v >= 0, '>= 0')
  _checks.check('num_workers', num_workers, lambda v: v >= 1, '>= 1')
  _checks.check('b1', b1, lambda v: 0 <= v < 1, 'in [0, 1)')
  _checks.check('b2', b2, lambda v: 0 <= v < 1, 'in [0, 1)')
  _checks.check('eps', eps, lambda v: v > 0, '> 0')
  _checks.check('weight_decay', weight_decay, lambda v: v >= 0, '>= 0')


def _workers(name: str, axis_name: comm.AxisName, num_workers: int) -> int:
  """N, checked against `num_workers`; one worker (nothing to compress) is accepted too, as
  the trainer's calibration runs the method's step on one worker to time its compute."""
  n = comm.axis_size(axis_name)
  if n not in (1, num_workers):
    raise ValueError(f'{name} was built for num_workers={num_workers}, but {axis_name} has {n}')
  return n


def _rate(learning_rate: ScalarOrSchedule, count: jax.Array) -> jax.Array:
  """The learning rate of the step after `count` steps (optax's convention)."""
  rate = learning_rate(count) if callable(learning_rate) else learning_rate
  return jnp.asarray(rate, jnp.float32)


def _errors(params: Any, n: int) -> tuple[Any, jax.Array]:
  """Zero worker error (like params, float32) and server error ([Σ_l c_l], float32)."""
  worker = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
  return worker, jnp.zeros(sum(_chunks(params, n)), jnp.float32)


class _Adam:
  """Adam's moment updates and step, as optax writes them (optax.adamw bitwise)."""

  def __init__(self, b1, b2, eps, weight_decay, bias_correction):
    self.b1, self.b2, self.eps, self.wd, self.bc = b1, b2, eps, weight_decay, bias_correction

  def momentum(self, g, mu):
    return optax.tree.update_moment(g, mu, self.b1, 1)

  def variance(self, g, nu):
    return optax.tree.update_moment_per_elem_norm(g, nu, self.b2, 2)

  def denominator(self, nu, var_count):
    """√v̂ + ε, v̂ = v/(1 − β2^k) with k the variance updates so far (or v without correction)."""
    if self.bc:
      nu = optax.tree.bias_correction(nu, self.b2, var_count)
    return jax.tree.map(lambda v: jnp.sqrt(v + 0.0) + self.eps, nu)

  def unbiased(self, mu, count):
    return optax.tree.bias_correction(mu, self.b1, count) if self.bc else mu

  def direction(self, mu, denom, count, params):
    """m̂/(√v̂ + ε) + λθ: the update before the learning rate."""
    u = jax.tree.map(jnp.divide, self.unbiased(mu, count), denom)
    if self.wd:
      u = jax.tree.map(lambda g, p: g + self.wd * p, u, params)
    return u

  def step(self, mu, denom, count, params, rate):
    """−η·(m̂/(√v̂ + ε) + λθ)."""
    d = self.direction(mu, denom, count, params)
    return jax.tree.map(lambda g: g * (-rate).astype(g.dtype), d)


# --- 1-bit Adam -------------------------------------------------------------------------------


class OneBitAdamState(NamedTuple):
  """State of `onebit_adam`.

  Attributes:
    count: steps so far. Replicated.
    mu: Adam's first moment (the momentum). Replicated: it is all-reduced,
      densely in the warm-up, at 1 bit after it.
    nu: Adam's second moment, frozen after the warm-up. Replicated.
    worker_error: δ_w of the compressed all-reduce, float32 like params.
      Per-worker.
    server_error: δ_s, float32 [Σ_l c_l]: this worker's server chunk of each
      leaf (its length depends on the number of workers). Per-worker.
    wire: (the warm-up's dense all-reduce of the gradient, then the four
      collectives of the compressed all-reduce). Per-worker.
  """

  count: jax.Array
  mu: Any
  nu: Any
  worker_error: Any
  server_error: jax.Array
  wire: tuple[comm.Transfer, ...]


def onebit_adam(
  learning_rate: ScalarOrSchedule,
  *,
  axis_name: comm.AxisName,
  num_workers: int,
  warmup_steps: int = 100_000,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  bias_correction: bool = True,
) -> optax.GradientTransformation:
  """1-bit Adam: Adam, then its frozen variance lets the momentum go at 1 bit a step.

  Warm-up (the first `warmup_steps` steps): the gradient is all-reduced
  densely and Adam runs, exactly `optax.chain(jd.sync.allreduce(...),
  optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay))`.
  Compression (after): v is frozen and each worker updates its momentum with
  its own gradient, m ← β1·m + (1 − β1)·g_n, which `onebit_allreduce`
  averages at 1 bit per element with worker and server error feedback (so
  every worker again holds the same m); the step is −η·(m̂/(√v̂ + ε) + λθ).

  Readings: with `bias_correction` (the default) m̂ = m/(1 − β1^t) and v̂ =
  v/(1 − β2^k), k = min(t, warmup_steps), so the warm-up is optax's AdamW
  and the frozen preconditioner is the one the last warm-up step used;
  DeepSpeed stores the flag but never corrects (`bias_correction=False`
  reproduces it). DeepSpeed's first call only allocates its buffers and
  drops that batch; here every call is a step. One scale per tensor, as
  DeepSpeed; padding does not count in the scales (`onebit_allreduce`). No
  momentum mask: sgn(0) = +1, so entries whose gradient is structurally
  zero receive ±scale. With one worker nothing is compressed (as
  DeepSpeed). The error buffers are state: checkpoints keep them (DeepSpeed
  zeroes them on every load).

  Bytes per worker per step: the warm-up sends the gradient (one all-reduce
  of 4·d bytes for float32); after it Σ_l n·c_l/8 (all-to-all) + Σ_l c_l/8
  (all-gather) + 8·L (scales), with c_l = 8·⌈d_l/(8N)⌉ and L leaves: about
  (1 + 1/N)·d/8 bytes, 32× less than the float32 gradient (not counting
  the all-reduce's own 2(N−1)/N factor, which the network model applies).

  Args:
    learning_rate: η, a float or an optax schedule of the step count.
    axis_name: the worker axis (or tuple of axes).
    num_workers: N, the number of workers on `axis_name` (the server error's
      length and the payload depend on it).
    warmup_steps: steps of dense Adam before the variance freezes
      (DeepSpeed's `freeze_step`; its tutorial: 15–25 % of the run).
    b1, b2, eps: Adam's.
    weight_decay: λ, decoupled (AdamW's), inside the learning rate.
    bias_correction: Adam's bias correction (DeepSpeed: none).

  Returns:
    An `optax.GradientTransformation`: the whole optimizer, gradient
    averaging included; give it the workers' own gradients.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import runtime, sync, testing
    >>> import jax.numpy as jnp, numpy as np
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.onebit_adam(0.1, axis_name=runtime.AXES, num_workers=2, warmup_steps=1)
    >>> run = testing.Run(tx, {'x': jnp.zeros(3)}, workers=2)
    >>> g = {'x': jnp.array([[1.0, -1, 2], [3, -3, -4]])}
    >>> np.round(np.asarray(run(g)['x'][0], float), 4)  # warm-up: Adam, -lr·sign(mean)
    array([-0.1,  0.1,  0.1])
    >>> np.round(np.asarray(run(g)['x'][0], float), 4)  # then the momentum goes at 1 bit
    array([-0.1796,  0.1796,  0.2593])
    >>> run.history  # per step: dense all-reduce, then the four 1-bit collectives
    [[1, 0, 0, 0, 0], [0, 1, 1, 1, 1]]

  References:
    Tang et al. 1-bit Adam: Communication Efficient Large-Scale Training with
    Adam's Convergence Speed. ICML 2021. https://arxiv.org/abs/2102.02888
  """
  _check_common(learning_rate, num_workers, b1, b2, eps, weight_decay)
  _checks.check('warmup_steps', warmup_steps, lambda v: v >= 0, '>= 0')
  adam = _Adam(b1, b2, eps, weight_decay, bias_correction)

  def init_fn(params):
    worker, server = _errors(params, num_workers)
    dense = comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0)
    return OneBitAdamState(
      count=jnp.zeros([], jnp.int32),
      mu=optax.tree.zeros_like(params),
      nu=optax.tree.zeros_like(params),
      worker_error=worker,
      server_error=server,
      wire=(dense, *_wire(params, num_workers)),
    )

  def update_fn(updates, state, params=None):
    if weight_decay:
      _checks.needs_params('onebit_adam', params)
    n = _workers('onebit_adam', axis_name, num_workers)
    count = optax.safe_increment(state.count)
    warm = comm.agree(count <= warmup_steps, axis_name)
    dense_t, *car_t = state.wire

    def dense(g, mu, nu, werr, serr):
      g, sent = comm.pmean(g, axis_name)
      wire = (sent, *comm.silence(tuple(car_t)))
      return adam.momentum(g, mu), adam.variance(g, nu), werr, serr, wire

    def compressed(g, mu, nu, werr, serr):
      mu = adam.momentum(g, mu)  # this worker's gradient
      car = comm.silence(tuple(car_t))
      if n > 1:
        mu, werr, serr, car = onebit_allreduce(mu, werr, serr, axis_name=axis_name)
        mu = _masked(mu, nu)
      return mu, nu, werr, serr, (comm.silence(dense_t), *car)

    mu, nu, werr, serr, wire = lax.cond(
      warm, dense, compressed, updates, state.mu, state.nu, state.worker_error, state.server_error
    )
    var_count = jnp.minimum(count, warmup_steps)
    rate = _rate(learning_rate, state.count)
    out = adam.step(mu, adam.denominator(nu, var_count), count, params, rate)
    return out, OneBitAdamState(count, mu, nu, werr, serr, wire)

  return optax.GradientTransformation(init_fn, update_fn)


# --- 0/1 Adam ---------------------------------------------------------------------------------


class ZeroOneAdamState(NamedTuple):
  """State of `zero_one_adam`.

  Attributes:
    count: steps so far. Replicated.
    mu: the first moment. Replicated in the first phase; per-worker between
      synchronisations in the second (re-estimated from the averaged update
      at each).
    nu: the second moment (updated on the steps of T_v only). Replicated.
    var_count: variance updates so far (Adam's bias correction of v).
      Replicated.
    var_interval: the gap between variance updates (1, doubling). Replicated.
    var_counter: variance updates at the current gap. Replicated.
    local_interval: steps between synchronisations in the second phase (1,
      doubling, at most `local_step_clipper`). Replicated.
    local_counter: second-phase steps at the current interval. Replicated.
    rates: Λ, the learning rates summed since the last synchronisation.
      Replicated.
    accumulator: u, the updates applied since the last synchronisation.
      Per-worker.
    worker_error: δ_w of the compressed all-reduce, float32 like params.
      Per-worker.
    server_error: δ_s, float32 [Σ_l c_l]. Per-worker.
    wire: (the dense all-reduce of the gradient on T_v, then the four
      collectives of the compressed all-reduce). Per-worker.
  """

  count: jax.Array
  mu: Any
  nu: Any
  var_count: jax.Array
  var_interval: jax.Array
  var_counter: jax.Array
  local_interval: jax.Array
  local_counter: jax.Array
  rates: jax.Array
  accumulator: Any
  worker_error: Any
  server_error: jax.Array
  wire: tuple[comm.Transfer, ...]


def zero_one_adam(
  learning_rate: ScalarOrSchedule,
  *,
  axis_name: comm.AxisName,
  num_workers: int,
  var_freeze_step: int = 100_000,
  var_update_scaler: int = 16,
  local_step_scaler: int = 32_768,
  local_step_clipper: int = 16,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  bias_correction: bool = True,
) -> optax.GradientTransformation:
  """0/1 Adam: Adam with variance updates ever rarer, then 1-bit synchronised local steps.

  First phase, steps t = 1 .. `var_freeze_step`: on the steps of T_v the
  gradient is all-reduced densely and m and v are updated (an Adam step);
  T_v starts with every step and its gap doubles after every
  `var_update_scaler` (κ) updates there (t ∈ T_v when t is a multiple of the
  current gap). On the other steps the worker's gradient goes through
  `onebit_allreduce` and only m is updated. Every step applies
  −η·(m̂/(√v̂ + ε) + λθ).

  Second phase (v frozen): every step is local, m ← β1·m + (1 − β1)·g_n,
  Δ = η·(m̂/(√v̂ + ε) + λθ), θ ← θ − Δ, u ← u − Δ, Λ ← Λ + η; every I steps
  (t a multiple of I) the workers synchronise: θ ← θ − u (undo the local
  steps), ū = onebit_allreduce(u·(√v̂ + ε)), m ← −ū/Λ (bias-corrected m̂ is
  re-estimated, m = m̂·(1 − β1^t)), θ ← θ + ū/(√v̂ + ε), u ← 0, Λ ← 0. I
  starts at 1 and doubles every `local_step_scaler` second-phase steps, up
  to `local_step_clipper` (H). The error buffers are zeroed when the second
  phase begins (they held gradient errors, then update errors).

  Readings (DeepSpeed's zoadam.py, the implementation the paper's numbers
  come from): the schedules follow its code (gaps 2^⌊j/κ⌋, local-step
  doubling counted in steps; its `local_step_scaler` default 32678 is read
  as 32768), but t counts real steps from 1 (DeepSpeed's first call only
  allocates buffers, which shifts its T_v by one step). Bias correction as
  `onebit_adam` (k = variance updates so far); DeepSpeed has none
  (`bias_correction=False` reproduces it). With one worker the compressed
  all-reduce is the identity (DeepSpeed skips the momentum update on those
  steps, a quirk). After a checkpoint load DeepSpeed resets u, the error
  buffers and the schedules, and may run one step of the wrong phase; here
  they are all state and a restored run continues exactly. Padding and
  scales as `onebit_allreduce`; no momentum mask.

  Bytes per worker per step: on T_v the gradient (4·d for float32); other
  first-phase steps and synchronising second-phase steps the compressed
  all-reduce (as `onebit_adam`: Σ_l (N + 1)·c_l/8 + 8·L); local steps
  nothing.

  Args:
    learning_rate: η, a float or an optax schedule of the step count.
    axis_name: the worker axis (or tuple of axes).
    num_workers: N, the number of workers on `axis_name`.
    var_freeze_step: the last step of the first phase (DeepSpeed: "usually
      the end of the learning-rate warm-up"; may exceed the run).
    var_update_scaler: κ, variance updates at each gap before it doubles.
    local_step_scaler: second-phase steps at each local interval before it
      doubles.
    local_step_clipper: H, the largest local interval.
    b1, b2, eps: Adam's.
    weight_decay: λ, decoupled (AdamW's), inside the learning rate.
    bias_correction: Adam's bias correction (DeepSpeed: none).

  Returns:
    An `optax.GradientTransformation`: the whole optimizer; give it the
    workers' own gradients. Workers hold different models between
    synchronisations of the second phase.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.zero_one_adam(0.1, axis_name=runtime.AXES, num_workers=2, var_freeze_step=1)
    >>> run = testing.Run(tx, {'x': jnp.zeros(3)}, workers=2)
    >>> g = {'x': jnp.array([[1.0, -1, 2], [3, -3, -4]])}
    >>> _ = run(g)  # step 1 is in T_v: dense all-reduce, Adam
    >>> _ = run(g)  # phase 2, local interval 1: the update u goes at 1 bit
    >>> run.history
    [[1, 0, 0, 0, 0], [0, 1, 1, 1, 1]]

  References:
    Lu et al. Maximizing Communication Efficiency for Large-scale Training
    via 0/1 Adam. ICLR 2023. https://arxiv.org/abs/2202.06009
    Tang et al. 1-bit Adam. ICML 2021. https://arxiv.org/abs/2102.02888
  """
  _check_common(learning_rate, num_workers, b1, b2, eps, weight_decay)
  _checks.check('var_freeze_step', var_freeze_step, lambda v: v >= 0, '>= 0')
  _checks.check('var_update_scaler', var_update_scaler, lambda v: v >= 1, '>= 1')
  _checks.check('local_step_scaler', local_step_scaler, lambda v: v >= 1, '>= 1')
  _checks.check('local_step_clipper', local_step_clipper, lambda v: v >= 1, '>= 1')
  adam = _Adam(b1, b2, eps, weight_decay, bias_correction)
  i32 = lambda v: jnp.asarray(v, jnp.int32)

  def init_fn(params):
    worker, server = _errors(params, num_workers)
    dense = comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0)
    zeros = optax.tree.zeros_like(params)
    return ZeroOneAdamState(
      count=i32(0),
      mu=zeros,
      nu=zeros,
      var_count=i32(0),
      var_interval=i32(1),
      var_counter=i32(0),
      local_interval=i32(1),
      local_counter=i32(0),
      rates=jnp.zeros([], jnp.float32),
      accumulator=zeros,
      worker_error=worker,
      server_error=server,
      wire=(dense, *_wire(params, num_workers)),
    )

  def update_fn(updates, state, params=None):
    _checks.needs_params('zero_one_adam', params)
    n = _workers('zero_one_adam', axis_name, num_workers)
    t = optax.safe_increment(state.count)
    rate = _rate(learning_rate, state.count)
    first = t <= var_freeze_step
    full = first & (t % state.var_interval == 0)
    sync = ~first & (t % state.local_interval == 0)
    branch = comm.agree(jnp.where(first, jnp.where(full, 0, 1), jnp.where(sync, 3, 2)), axis_name)
    dense_t, *car_t = state.wire
    quiet = (comm.silence(dense_t), *comm.silence(tuple(car_t)))
    switching = t == var_freeze_step + 1  # the second phase starts from zero errors
    werr = jax.tree.map(lambda e: jnp.where(switching, 0.0, e), state.worker_error)
    serr = jnp.where(switching, 0.0, state.server_error)
    var_count = state.var_count + full.astype(jnp.int32)

    def car(x, werr, serr, nu):
      if n == 1:
        return x, werr, serr, quiet[1:]
      x, werr, serr, sent = onebit_allreduce(x, werr, serr, axis_name=axis_name)
      return _masked(x, nu), werr, serr, sent

    def adam_step(g, mu, nu, u, werr, serr):  # T_v: dense gradient, m and v
      g, sent = comm.pmean(g, axis_name)
      mu, nu = adam.momentum(g, mu), adam.variance(g, nu)
      out = adam.step(mu, adam.denominator(nu, var_count), t, params, rate)
      return out, mu, nu, u, werr, serr, (sent, *quiet[1:])

    def onebit_step(g, mu, nu, u, werr, serr):  # 1-bit gradient, m only
      g, werr, serr, sent = car(g, werr, serr, nu)
      mu = adam.momentum(g, mu)
      out = adam.step(mu, adam.denominator(nu, var_count), t, params, rate)
      return out, mu, nu, u, werr, serr, (quiet[0], *sent)

    def local(g, mu, nu, u, werr, serr):
      mu = adam.momentum(g, mu)
      out = adam.step(mu, adam.denominator(nu, var_count), t, params, rate)
      return out, mu, nu, jax.tree.map(jnp.add, u, out), werr, serr, quiet

    def synced(g, mu, nu, u, werr, serr):
      mu = adam.momentum(g, mu)
      denom = adam.denominator(nu, var_count)
      total = jax.tree.map(jnp.add, u, adam.step(mu, denom, t, params, rate))  # u − Δ_t
      mean, werr, serr, sent = car(jax.tree.map(jnp.multiply, total, denom), werr, serr, nu)
      lam = state.rates + rate
      keep = (1.0 - b1**t) if bias_correction else 1.0  # m from the re-estimated m̂
      mu = jax.tree.map(lambda s: (-s / lam * keep).astype(s.dtype), mean)
      # back to the last synchronised model (θ − u), then its averaged update ū/(√v̂ + ε)
      out = jax.tree.map(lambda s, d, a: s / d - a, mean, denom, u)
      return out, mu, nu, optax.tree.zeros_like(u), werr, serr, (quiet[0], *sent)

    out, mu, nu, u, werr, serr, wire = lax.switch(
      branch,
      (adam_step, onebit_step, local, synced),
      updates,
      state.mu,
      state.nu,
      state.accumulator,
      werr,
      serr,
    )
    doubles = full & (state.var_counter + 1 == var_update_scaler)
    var_counter = jnp.where(full, state.var_counter + 1, state.var_counter)
    var_counter = jnp.where(doubles, 0, var_counter)
    var_interval = jnp.where(doubles, 2 * state.var_interval, state.var_interval)
    stepped = ~first & (state.local_counter + 1 == local_step_scaler)
    local_counter = jnp.where(first, 0, jnp.where(stepped, 0, state.local_counter + 1))
    local_interval = jnp.where(
      stepped, jnp.minimum(local_step_clipper, 2 * state.local_interval), state.local_interval
    )
    rates = jnp.where(first | sync, 0.0, state.rates + rate)
    return out, ZeroOneAdamState(
      t, mu, nu, var_count, var_interval, var_counter, local_interval, local_counter, rates, u,
      werr, serr, wire,
    )  # fmt: skip

  return optax.GradientTransformation(init_fn, update_fn)
