"""Stale-synchronous and asynchronous SGD, simulated with delayed gradients.

Each worker's gradient of step t reaches the model τ steps later (τ fixed,
drawn uniformly up to a staleness bound s, or from a truncated geometric
distribution; seeded). A worker keeps its in-flight gradients in a mailbox
of s + 1 slots; each step, what arrives from all workers is summed with one
all-reduce and applied, divided by N. Consistency rules (after Ho et al.
2013):

- every gradient older than s steps has been applied by every worker (the
  staleness bound; a real system enforces it with a barrier);
- with `read_my_writes` (SSP), a worker applies its own gradient at once and
  others' when they arrive, so workers' models differ; without it (async
  SGD through a parameter server), every worker applies the same arrivals and
  all models stay equal, each gradient computed on a model up to s steps old.

Delay 0 is synchronous SGD (BSP). Every gradient applied exactly D steps
late by every worker is `stale_sync(D, delays='fixed')`, which equals
`optax.chain(allreduce(...), gradient_delay(D))`. A simulation of the algorithm, not of the
system: every worker computes every step; wall-clock gains of not waiting are
what the network model and a straggler model would add.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm

DELAYS = ('fixed', 'uniform', 'geometric')


class StaleState(NamedTuple):
  """State of `stale_sync`.

  Attributes:
    count: steps so far. Replicated.
    key: PRNG key of the delays (raw uint32[2]). Replicated.
    mailbox: [s + 1, ...] gradients in flight, by arrival slot. Per-worker.
    wire: the all-reduce of the arrivals. Per-worker.
  """

  count: jax.Array
  key: jax.Array
  mailbox: Any
  wire: tuple


def stale_sync(
  max_delay: int,
  *,
  axis_name: comm.AxisName,
  delays: str = 'uniform',
  read_my_writes: bool = False,
  p: float = 0.5,
  seed: int = 0,
) -> optax.GradientTransformation:
  """Applies each worker's gradient τ ∈ [0, max_delay] steps late.

  Worker n's gradient of step t, g_n(t), arrives τ_n(t) ≤ s steps later;
  each step, every worker applies what arrived from all workers,

    u_n(t) = (1/N) Σ_m Σ_{t' : t' + τ_m(t') = t} g_m(t'),

  with one all-reduce of the arrivals. With `read_my_writes` (SSP), worker
  n's own term is g_n(t) at once instead of on arrival.

  Args:
    max_delay: the staleness bound s (0 = synchronous).
    axis_name: the worker axis (or tuple of axes).
    delays: 'fixed' (τ = s), 'uniform' on {0..s}, or 'geometric' (P(τ = d) ∝
      p(1 − p)^d, truncated at s).
    read_my_writes: apply a worker's own gradient at once (SSP).
    p: parameter of the geometric delays.
    seed: seed of the delays; workers and steps draw independently.

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> stale = sync.stale_sync(1, axis_name=runtime.AXES, delays='fixed')
    >>> run = testing.Run(optax.chain(stale, optax.sgd(1.0)), {'x': jnp.zeros(())}, workers=2)
    >>> run({'x': jnp.array([1.0, 3.0])})['x']  # in flight: nothing applied yet
    Array([0., 0.], dtype=float32)
    >>> run({'x': jnp.array([5.0, 7.0])})['x']  # step 1's mean, 2, arrives
    Array([-2., -2.], dtype=float32)

  References:
    Ho et al. More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server. NeurIPS 2013.
    https://proceedings.neurips.cc/paper/2013/hash/b7bb35b9c6ca2aee2df08cf09d7016c2-Abstract.html
    Zhang, Gupta, Lian, Liu. Staleness-aware Async-SGD for Distributed Deep
    Learning. IJCAI 2016. https://arxiv.org/abs/1511.05950

  (Longer than 80 lines only for its documentation; the steps are helpers.)
  """
  if max_delay < 0:
    raise ValueError(f'max_delay (staleness) must be >= 0, got {max_delay}')
  if delays not in DELAYS:
    raise ValueError(f'delays must be one of {DELAYS}, got {delays!r}')
  if not 0 < p <= 1:
    raise ValueError(f'p must be in (0, 1], got {p}')
  slots = max_delay + 1

  def draw(key):
    if delays == 'fixed' or max_delay == 0:
      return jnp.int32(max_delay)
    if delays == 'uniform':
      return jax.random.randint(key, (), 0, slots)
    logits = (
      jnp.log(p) + jnp.arange(slots) * jnp.log1p(-p)
      if p < 1
      else jnp.where(jnp.arange(slots) == 0, 0.0, -jnp.inf)
    )
    return jax.random.categorical(key, logits).astype(jnp.int32)

  def init_fn(params):
    return StaleState(
      count=jnp.zeros([], jnp.int32),
      key=jax.random.PRNGKey(seed),
      mailbox=jax.tree.map(lambda x: jnp.zeros((slots, *x.shape), x.dtype), params),
      wire=(comm.transfer(comm.ALL_REDUCE, comm.tree_nbytes(params), 0),),
    )

  def update_fn(grads, state, params=None):
    del params
    n = comm.axis_size(axis_name)
    key = jax.random.fold_in(jax.random.fold_in(state.key, state.count), comm.axis_index(axis_name))
    tau = draw(key)
    now = state.count % slots
    post = jax.nn.one_hot((state.count + tau) % slots, slots, dtype=jnp.float32)
    mailbox = jax.tree.map(
      lambda m, g: m + post.reshape((slots,) + (1,) * g.ndim).astype(g.dtype) * g,
      state.mailbox,
      grads,
    )
    arrived = jax.tree.map(lambda m: m[now], mailbox)
    mailbox = jax.tree.map(lambda m: m.at[now].set(0), mailbox)
    total, sent = comm.psum(arrived, axis_name)
    if read_my_writes:  # own gradient now, others' on arrival (own arrival already applied)
      total = jax.tree.map(lambda t, a, g: t - a + g, total, arrived, grads)
    updates = jax.tree.map(lambda t: t / n, total)
    return updates, StaleState(optax.safe_increment(state.count), state.key, mailbox, (sent,))

  return optax.GradientTransformation(init_fn, update_fn)


def ssp(staleness: int, *, axis_name: comm.AxisName, seed: int = 0) -> optax.GradientTransformation:
  """Stale-synchronous parallel: others' gradients up to `staleness` steps late, own at once.

  `stale_sync(staleness, delays='uniform', read_my_writes=True)`: worker n
  applies u_n(t) = (1/N) (g_n(t) + Σ_{m≠n} Σ_{t' : t' + τ_m(t') = t} g_m(t')),
  τ uniform on {0..staleness}, so workers' models differ by at most the
  gradients still in flight.

  Args:
    staleness: the bound s (0 = synchronous).
    axis_name: the worker axis (or tuple of axes).
    seed: seed of the delays.

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(sync.ssp(2, axis_name=runtime.AXES), optax.sgd(1.0))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> x = run.steps(4, lambda t: {'x': jnp.array([1.0, 3.0])})['x']
    >>> bool(x[0] != x[1])  # own gradients at once, others' late: models differ
    True
    >>> _ = run.steps(3, lambda t: {'x': jnp.zeros(2)})  # drain the mailboxes
    >>> run.params['x']  # every gradient applied once by everyone: 4 x mean 2
    Array([-8., -8.], dtype=float32)

  Reference:
    Ho et al. More Effective Distributed ML via a Stale Synchronous Parallel
    Parameter Server. NeurIPS 2013.
    https://proceedings.neurips.cc/paper/2013/hash/b7bb35b9c6ca2aee2df08cf09d7016c2-Abstract.html
  """
  return stale_sync(
    staleness, axis_name=axis_name, delays='uniform', read_my_writes=True, seed=seed
  )


def async_sgd(
  max_delay: int, *, axis_name: comm.AxisName, p: float = 0.5, seed: int = 0
) -> optax.GradientTransformation:
  """Asynchronous SGD through a parameter server: geometric delays up to `max_delay`.

  `stale_sync(max_delay, delays='geometric', p=p)`: every worker applies the
  same arrivals, u(t) = (1/N) Σ_m Σ_{t' : t' + τ_m(t') = t} g_m(t') with
  P(τ = d) ∝ p(1 − p)^d, d ≤ max_delay, so all models stay equal and each
  gradient was computed on a model up to `max_delay` steps old.

  Args:
    max_delay: the staleness bound.
    axis_name: the worker axis (or tuple of axes).
    p: parameter of the geometric delays.
    seed: seed of the delays.

  Returns:
    An `optax.GradientTransformation`; put it before the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(sync.async_sgd(2, axis_name=runtime.AXES), optax.sgd(1.0))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> x = run.steps(4, lambda t: {'x': jnp.array([1.0, 3.0])})['x']
    >>> bool(x[0] == x[1])  # one shared model
    True
    >>> run.steps(3, lambda t: {'x': jnp.zeros(2)})['x']  # drained: 4 x mean 2
    Array([-8., -8.], dtype=float32)

  References:
    Dean et al. Large Scale Distributed Deep Networks (Downpour SGD).
    NeurIPS 2012. https://papers.nips.cc/paper/4687-large-scale-distributed-deep-networks
    Zhang, Gupta, Lian, Liu. Staleness-aware Async-SGD for Distributed Deep
    Learning. IJCAI 2016 (the delay model). https://arxiv.org/abs/1511.05950
  """
  return stale_sync(max_delay, axis_name=axis_name, delays='geometric', p=p, seed=seed)
