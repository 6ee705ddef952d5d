"""Local SGD and post-local SGD: workers step alone, then average every `period` steps.

A step that does not synchronise does not communicate: the collective sits
in a `lax.cond` whose predicate every worker agrees on (`comm.agree`), so XLA
skips the branch, and the byte accounting counts only the steps that
synchronised.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax
from jax import lax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks


class LocalSGDState(NamedTuple):
  """State of `local_sgd`.

  Attributes:
    count: update calls so far. Replicated.
    synced: how many of them synchronised. Replicated.
    anchor: the model of the last synchronisation (a copy of the model).
      Replicated.
    averager: the averager's state (() without one). Per-worker.
    wire: the dense all-reduce of the model (() with an averager). Per-worker.
    just_synced: whether the last update synchronised, so that `anchor` is
      the model every worker takes now. Replicated.
  """

  SYNCED_MODEL = ('anchor', 'just_synced')  # what `jd.sync.apply_updates` puts in

  count: jax.Array
  synced: jax.Array
  anchor: Any
  averager: Any
  wire: tuple
  just_synced: jax.Array


def local_sgd(
  period: int,
  *,
  axis_name: comm.AxisName,
  warmup_steps: int = 0,
  averager: optax.GradientTransformation | None = None,
) -> optax.GradientTransformation:
  """Averages parameters over `axis_name` after every `period` local steps.

  Worker n steps alone, w_n <- w_n + u_n, and after the steps that
  synchronise every worker takes the mean model, w_n <- (1/N) Σ_m w_m. With
  an `averager`, the mean is taken of the changes since the last
  synchronisation instead: a <- a + A(w_n − a), w_n <- a, where a is the
  shared anchor and A the averager (e.g. a compressed all-reduce with error
  feedback).

  Steps count from t = 0 (the first update). Step t synchronises when
  t < warmup_steps (the warm-up: every step), or when t − warmup_steps + 1
  is a multiple of `period`: every local period after the warm-up is
  `period` steps long. period=4 averages at steps 3, 7, 11, ... ((t + 1)
  mod 4 = 0, Stich's schedule); period=4, warmup_steps=2 at 0, 1 (warm-up),
  then 5, 9, 13, ... PyTorch's `PeriodicModelAverager(period, warmup_steps=w)`
  averages after steps w, w + period, w + 2·period, ... (its step counter
  from 0, `(step − w) % period == 0`), and DDP's gradient all-reduce
  (`post_localSGD_hook`, `start_localSGD_iter=w`) keeps steps 0 to w − 1
  synchronous: its step w is one more synchronising step, so its schedule
  is this one's with `warmup_steps=w + 1`.

  Put it after the optimizer, last in the chain: `optax.chain(optax.sgd(0.1),
  local_sgd(8, axis_name=...))`. Each worker's optimizer state stays its own.
  Placed before the optimizer it runs without an error and trains something
  else: it would take the raw gradient for the update, average w_n + g_n,
  and the optimizer would then scale that average's difference from w_n, so
  the workers never hold one model. Nothing can check the order (a chain's
  `update` is a closure, and a stateless optimizer leaves no trace in the
  state), so it is on the caller; the trainer builds its chains in this
  order.

  Apply the updates with `jd.sync.apply_updates(params, updates, opt_state)`
  (the library's loops do): after a synchronisation it gives every worker the
  synchronised model, bitwise, from the state's `anchor`, where
  `optax.apply_updates` rounds w + (m − w) and leaves the workers up to an ulp
  apart (see its docstring). With an averager the anchor is kept anyway;
  without one it costs one copy of the model per worker.

  Args:
    period: local steps between averages (1 = average every step).
    axis_name: the worker axis (or tuple of axes).
    warmup_steps: post-local SGD (Lin et al. 2020): average every step for
      this many steps, then after every `period` local steps counted from
      the warm-up's end.
    averager: a transform that averages over `axis_name` (e.g.
      `compressed_allreduce(topk(0.01), axis_name=...)`), applied to each
      worker's change since the last sync. None averages the models densely.

  Returns:
    An `optax.GradientTransformation`; put it after the optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(optax.sgd(1.0), sync.local_sgd(2, axis_name=runtime.AXES))
    >>> run = testing.Run(tx, {'x': jnp.zeros(())}, workers=2)
    >>> run({'x': jnp.array([1.0, 3.0])})['x']  # a local step
    Array([-1., -3.], dtype=float32)
    >>> run({'x': jnp.array([1.0, 3.0])})['x']  # a local step, then the average
    Array([-4., -4.], dtype=float32)

  References:
    Stich. Local SGD Converges Fast and Communicates Little. ICLR 2019.
    https://arxiv.org/abs/1805.09767
    Lin, Stich, Patel, Jaggi. Don't Use Large Mini-Batches, Use Local SGD.
    ICLR 2020 (post-local SGD). https://arxiv.org/abs/1808.07217
  """
  _averaging.check_period(period)
  _checks.check('warmup_steps', warmup_steps, lambda w: w >= 0, '>= 0')
  _averaging.check_averager(averager)
  sync, skip = _averaging.model_sync(averager, axis_name)

  def init_fn(params):
    return LocalSGDState(**_averaging.init_sync(params, averager))

  def update_fn(updates, state, params=None):
    _checks.needs_params('local_sgd', params)
    warm = state.count < warmup_steps
    due = warm | ((state.count - warmup_steps + 1) % period == 0)
    due = comm.agree(due, axis_name)
    updates, anchor, avg_state, wire = lax.cond(
      due, sync, skip, params, updates, state.anchor, state.averager, state.wire
    )
    count, synced = _averaging.counted(state, due)
    return updates, LocalSGDState(count, synced, anchor, avg_state, wire, due)

  return optax.GradientTransformation(init_fn, update_fn)
