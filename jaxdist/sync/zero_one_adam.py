"""0/1 Adam: Adam with variance updates ever rarer, then 1-bit synchronised local steps.

A whole optimizer (it replaces the gradient all-reduce and Adam); its
compressed all-reduce is `jaxdist.sync.onebit_allreduce`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _checks
from jaxdist.sync import _frozen_adam as fa
from jaxdist.sync.onebit_allreduce import onebit_allreduce, planned_wire


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
  learning_rate: optax.ScalarOrSchedule,
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
  clip: float = 10.0,
) -> optax.GradientTransformation:
  """0/1 Adam: Adam with variance updates ever rarer, then 1-bit synchronised local steps.

  First phase, steps t = 1 .. `var_freeze_step`: on the steps of T_v the
  gradient is all-reduced densely and m and v are updated (an Adam step);
  T_v starts with every step and its gap doubles after every
  `var_update_scaler` (κ) updates there (t ∈ T_v when t is a multiple of the
  current gap). On the other steps the worker's gradient goes through
  `onebit_allreduce` and only m is updated. Every step applies
  −η·(d + λθ), d = m̂/(√v̂ + ε); d is bounded on every step but those of
  T_v (v stale or frozen): zero where v = 0, clipped to [−clip, clip], as
  `onebit_adam` explains.

  Second phase (v frozen): every step is local, m ← β1·m + (1 − β1)·g_n,
  Δ = η·(d + λθ) (d bounded), θ ← θ − Δ, u ← u − Δ, Λ ← Λ + η; every I
  steps (t a multiple of I) the workers synchronise: θ ← θ − u (undo the
  local steps), ū = onebit_allreduce(u·(√v̂ + ε)), d̄ = −ū/((√v̂ + ε)·Λ)
  bounded like d, m ← d̄·(√v̂ + ε) (bias-corrected m̂ is re-estimated, m =
  m̂·(1 − β1^t)), θ ← θ − Λ·d̄, u ← 0, Λ ← 0. I
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
  scales as `onebit_allreduce`. The bound on d is this implementation's
  (DeepSpeed has none; `clip=0` and `bias_correction=False` reproduce it,
  but for the mask of entries with v = 0).

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
    b1: Adam's decay of the first moment.
    b2: Adam's decay of the second moment.
    eps: Adam's epsilon.
    weight_decay: λ, decoupled (AdamW's), inside the learning rate.
    bias_correction: Adam's bias correction (DeepSpeed: none).
    clip: the bound on |d| per entry when v is stale or frozen (0: none).

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
  fa.check_common(learning_rate, num_workers, b1, b2, eps, weight_decay, clip)
  _checks.check('var_freeze_step', var_freeze_step, lambda v: v >= 0, '>= 0')
  _checks.check('var_update_scaler', var_update_scaler, lambda v: v >= 1, '>= 1')
  _checks.check('local_step_scaler', local_step_scaler, lambda v: v >= 1, '>= 1')
  _checks.check('local_step_clipper', local_step_clipper, lambda v: v >= 1, '>= 1')
  adam = fa.Adam(b1, b2, eps, weight_decay, bias_correction, clip)
  i32 = lambda v: jnp.asarray(v, jnp.int32)

  def init_fn(params):
    worker, server = fa.errors(params, num_workers)
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
      wire=(dense, *planned_wire(params, num_workers)),
    )

  def update_fn(updates, state, params=None):
    _checks.needs_params('zero_one_adam', params)
    n = fa.workers('zero_one_adam', axis_name, num_workers)
    t = optax.safe_increment(state.count)
    rate = fa.rate(learning_rate, state.count)
    first = t <= var_freeze_step
    full = first & (t % state.var_interval == 0)
    sync = ~first & (t % state.local_interval == 0)
    branch = comm.agree(jnp.where(first, jnp.where(full, 0, 1), jnp.where(sync, 3, 2)), axis_name)
    switching = t == var_freeze_step + 1  # the second phase starts from zero errors
    werr = jax.tree.map(lambda e: jnp.where(switching, 0.0, e), state.worker_error)
    serr = jnp.where(switching, 0.0, state.server_error)
    var_count = state.var_count + full.astype(jnp.int32)
    step = _Step(adam, axis_name, n, state, t, rate, var_count, params)
    out, mu, nu, u, werr, serr, wire = lax.switch(
      branch,
      (step.dense, step.onebit, step.local, step.synced),
      updates,
      state.mu,
      state.nu,
      state.accumulator,
      werr,
      serr,
    )
    schedules = _schedules(
      state, first, full, sync, rate, var_update_scaler, local_step_scaler, local_step_clipper
    )
    return out, ZeroOneAdamState(t, mu, nu, var_count, *schedules, u, werr, serr, wire)

  return optax.GradientTransformation(init_fn, update_fn)


class _Step:
  """The four kinds of step of `zero_one_adam`, as `lax.switch` branches of the same arguments
  (gradient, m, v, u, worker error, server error) and results (update, m, v, u, errors, wire).

  dense: a step of T_v (dense gradient, m and v). onebit: the rest of the first phase (the
  gradient at 1 bit, m only). local: a second-phase step without communication. synced: a
  second-phase step that ends with the 1-bit average of the interval's update. Every step but
  dense uses a stale or frozen v, so its direction is `fa.Adam.bounded`.
  """

  def __init__(self, adam, axis_name, n, state, t, rate, var_count, params):
    self.adam, self.axis_name, self.n, self.state = adam, axis_name, n, state
    self.t, self.rate, self.var_count, self.params = t, rate, var_count, params
    dense_t, *car_t = state.wire
    self.quiet = (comm.silence(dense_t), *comm.silence(tuple(car_t)))

  def car(self, x, werr, serr, nu):
    if self.n == 1:
      return x, werr, serr, self.quiet[1:]
    x, werr, serr, sent = onebit_allreduce(x, werr, serr, axis_name=self.axis_name)
    return fa.masked(x, nu), werr, serr, sent

  def dense(self, g, mu, nu, u, werr, serr):
    a = self.adam
    g, sent = comm.pmean(g, self.axis_name)
    mu, nu = a.momentum(g, mu), a.variance(g, nu)
    out = a.step(mu, a.denominator(nu, self.var_count), self.t, self.params, self.rate)
    return out, mu, nu, u, werr, serr, (sent, *self.quiet[1:])

  def onebit(self, g, mu, nu, u, werr, serr):
    a = self.adam
    g, werr, serr, sent = self.car(g, werr, serr, nu)
    mu = a.momentum(g, mu)
    out = a.step(mu, a.denominator(nu, self.var_count), self.t, self.params, self.rate, nu)
    return out, mu, nu, u, werr, serr, (self.quiet[0], *sent)

  def local(self, g, mu, nu, u, werr, serr):
    a = self.adam
    mu = a.momentum(g, mu)
    out = a.step(mu, a.denominator(nu, self.var_count), self.t, self.params, self.rate, nu)
    return out, mu, nu, jax.tree.map(jnp.add, u, out), werr, serr, self.quiet

  def synced(self, g, mu, nu, u, werr, serr):
    a, t = self.adam, self.t
    mu = a.momentum(g, mu)
    denom = a.denominator(nu, self.var_count)
    total = jax.tree.map(jnp.add, u, a.step(mu, denom, t, self.params, self.rate, nu))  # u − Δ_t
    mean, werr, serr, sent = self.car(jax.tree.map(jnp.multiply, total, denom), werr, serr, nu)
    lam = self.state.rates + self.rate  # Λ
    per_rate = jnp.where(lam > 0, lam, 1.0)
    # the interval's averaged direction d̄ = −ū/((√v̂ + ε)·Λ), bounded like one step's
    d = a.bounded(jax.tree.map(lambda s, e: -s / e / per_rate, mean, denom), nu)
    keep = (1.0 - a.b1**t) if a.bc else 1.0  # m from the re-estimated m̂ = d̄·(√v̂ + ε)
    mu = jax.tree.map(lambda x, e: (x * e * keep).astype(x.dtype), d, denom)
    # back to the last synchronised model (θ − u), then the averaged update −Λ·d̄
    out = jax.tree.map(lambda x, b: (-lam * x - b).astype(b.dtype), d, u)
    return out, mu, nu, optax.tree.zeros_like(u), werr, serr, (self.quiet[0], *sent)


def _schedules(state, first, full, sync, rate, var_update_scaler, local_scaler, local_clipper):
  """The new (var_interval, var_counter, local_interval, local_counter, rates) of the state."""
  doubles = full & (state.var_counter + 1 == var_update_scaler)
  var_counter = jnp.where(full, state.var_counter + 1, state.var_counter)
  var_counter = jnp.where(doubles, 0, var_counter)
  var_interval = jnp.where(doubles, 2 * state.var_interval, state.var_interval)
  stepped = ~first & (state.local_counter + 1 == local_scaler)
  local_counter = jnp.where(first, 0, jnp.where(stepped, 0, state.local_counter + 1))
  local_interval = jnp.where(
    stepped, jnp.minimum(local_clipper, 2 * state.local_interval), state.local_interval
  )
  rates = jnp.where(first | sync, 0.0, state.rates + rate)
  return var_interval, var_counter, local_interval, local_counter, rates
