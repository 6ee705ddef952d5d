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

  Reference: Ho et al. More Effective Distributed ML via a Stale Synchronous
  Parallel Parameter Server. NeurIPS 2013.
  """
  return stale_sync(
    staleness, axis_name=axis_name, delays='uniform', read_my_writes=True, seed=seed
  )


def async_sgd(
  max_delay: int, *, axis_name: comm.AxisName, p: float = 0.5, seed: int = 0
) -> optax.GradientTransformation:
  """Asynchronous SGD through a parameter server: geometric delays up to `max_delay`.

  Reference: Dean et al. Large Scale Distributed Deep Networks (Downpour
  SGD). NeurIPS 2012; delays modelled as in Zhang et al.'s staleness-aware
  async SGD (IJCAI 2016).
  """
  return stale_sync(max_delay, axis_name=axis_name, delays='geometric', p=p, seed=seed)
