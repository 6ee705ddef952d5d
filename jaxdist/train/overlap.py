"""Executed overlap: the DiLoCo family's outer all-reduce on its own thread, beside the steps.

With `exchange: deferred` (Streaming DiLoCo, and DiLoCo with eager updates)
the train step keeps each worker's pseudo-gradient in the state and sends
nothing; `Overlap` runs the rest of the exchange (a `jd.sync.DeferredExchange`)
as programs of their own:

- after the step that sends, the all-reduce (`average`), dispatched and
  waited for on a thread of its own; the next steps get a zeroed `pending`
  in its place, so no step donates the buffer the all-reduce reads;
- when the average is due (Streaming DiLoCo: after the step τ later, which
  then takes the fragment's outer step in `merge`; eager DiLoCo: before the
  next outer step, H steps later, which reads it), its result goes into the
  state's `pending`.

Why a thread: a CPU program dispatched from one Python thread waits for the
last one that thread dispatched, so the steps and an all-reduce dispatched
from the same thread run one after the other. From a second thread, with
one CPU device per process, the runtime runs them at once (measured by
`experiments/overlap_probe.py`: 0.78 to 0.94 of a 100 Mbit/s exchange
hidden; with two devices a process, programs are chained across threads too
and 0.03 is; inside one program, -0.08). The step has no collective of its own between processes
(DiLoCo's inner steps are local), and every other collective the loop
dispatches between processes (the per-worker metrics' gather, the
evaluation, a checkpoint's state, the gradient noise's measurement) either
goes through the same thread after the exchange (`submit`) or waits for it
(`settle`): two collectives at once on one communicator pair the wrong
messages (a run hangs until the coordination service's heartbeat ends it).

The loop's state between a send and its merge holds the zeroed `pending`;
`settle` puts the average in first, so an evaluation or checkpoint sees the
state the inline run has, and a run resumed from it merges at the step the
schedule says. On a GPU the same programs run from the same threads; there
XLA's asynchronous collectives could also overlap inside one program, which
is not tried here.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist import sync
from jaxdist.runtime import Workers


class Overlap:
  """Runs a deferred exchange's programs around the train steps (see the module docstring).

  Args:
    exchange: the transform's deferred exchange (`jd.sync.streaming_exchange`,
      `jd.sync.diloco_exchange`), or None: nothing to do (every method then
      behaves as before).
    workers: the worker layout of the train state.
    state: the `TrainState` the loop starts from: the programs are compiled
      for its shapes and shardings here, before the loop's clock starts.
  """

  def __init__(self, exchange: sync.DeferredExchange | None, workers: Workers, state):
    self.exchange, self.workers = exchange, workers
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='jaxdist-exchange')
    self._inflight: concurrent.futures.Future | None = None
    self._offset: int | None = None  # the transform's count minus the loop's step
    self._average: dict[Any, Callable] = {}
    self._merge: dict[Any, Callable] = {}
    self._zeros: Callable | None = None
    if exchange is not None:
      self._compile(state)

  def _compile(self, state) -> None:
    """Compiles the exchange's programs for states like `state`, before the clock starts."""
    ex = self.exchange
    pending = self._found(state.opt_state).pending
    for p in ex.keys:
      average = lambda x, p=p: ex.average(p, x)
      self._average[p] = jax.jit(self.workers.map(average, (0,))).lower(pending).compile()
      if ex.merge is not None:
        self._merge[p] = self._merge_fn(p, state)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), pending)
    zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    self._zeros = jax.jit(zeros, out_shardings=self.workers.sharding).lower().compile()

  def after(self, t: int, state) -> Any:
    """The state after the loop's step `t`, with the exchange's programs due after it run.

    Args:
      t: the step just dispatched (0-based).
      state: its `TrainState`.

    Returns:
      The state the next step takes.
    """
    ex = self.exchange
    if ex is None:
      return state
    if self._offset is None:  # read once: a warm start's transform counts from its own 0
      count = self._found(state.opt_state).count
      self._offset = int(np.asarray(count.addressable_shards[0].data).ravel()[0]) - (t + 1)
    count = self._offset + t
    if ex.merge is not None and (p := ex.applied(count)) is not None:
      state = self._merge[p](self.settle(state))
    if (p := ex.sent(count)) is not None:
      pending, average = self._found(state.opt_state).pending, self._average[p]
      self._inflight = self._pool.submit(lambda: jax.block_until_ready(average(pending)))
      state = self._with_pending(state, self._zeros())
    if ex.merge is None and ex.applied(count + 1) is not None:  # the next step reads it
      state = self.settle(state)
    return state

  def settle(self, state) -> Any:
    """`state` with the exchange in flight, if any, waited for and put into `pending`.

    Args:
      state: the `TrainState`.

    Returns:
      The state as the inline run has it after the same step.
    """
    if self._inflight is None:
      return state
    mean, self._inflight = self._inflight.result(), None
    return self._with_pending(state, mean)

  def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
    """Runs `fn` (a collective between processes) where the exchange runs, after it.

    Without an exchange, here and now: the steps' own collectives run on this
    thread, and one on another thread could run at once with them.

    Args:
      fn: what to run.

    Returns:
      Its future.
    """
    if self.exchange is not None:
      return self._pool.submit(fn)
    done = concurrent.futures.Future()
    done.set_result(fn())
    return done

  def settled(self, action: Callable[[Any], None]) -> Callable[[Any], None]:
    """A loop hook that settles the loop's state (`settle`) before running `action` on it.

    Args:
      action: a hook (`loop.Hook`) that reads the state: an evaluation, a checkpoint.

    Returns:
      The hook.
    """

    def hook(loop) -> None:
      loop.state = self.settle(loop.state)
      action(loop)

    return hook

  def close(self) -> None:
    """Waits for what runs on the thread, and ends it."""
    self._pool.shutdown(wait=True)

  def _merge_fn(self, p: Any, state) -> Callable:
    def merge(params, opt_state):
      params, found = self.exchange.merge(p, params, self._found(opt_state))
      return params, self._replaced(opt_state, found)

    mapped = jax.jit(self.workers.map(merge, (0, 0)), donate_argnums=(0, 1))
    compiled = mapped.lower(state.params, state.opt_state).compile()

    def run(state):
      params, opt_state = compiled(state.params, state.opt_state)
      return state._replace(params=params, opt_state=opt_state)

    return run

  def _is_state(self, x) -> bool:
    return isinstance(x, self.exchange.state)

  def _found(self, opt_state):
    """The one state of the exchange's transform in `opt_state`."""
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=self._is_state) if self._is_state(x)]
    if len(found) != 1:
      name = self.exchange.state.__name__
      raise ValueError(f'a deferred exchange needs one {name} in the chain, found {len(found)}')
    return found[0]

  def _replaced(self, opt_state, new):
    """`opt_state` with its state of the exchange's transform replaced by `new`."""
    return jax.tree.map(lambda x: new if self._is_state(x) else x, opt_state,
                        is_leaf=self._is_state)  # fmt: skip

  def _with_pending(self, state, pending):
    """The `TrainState` `state` with its transform state's `pending` replaced."""
    found = self._found(state.opt_state)._replace(pending=pending)
    return state._replace(opt_state=self._replaced(state.opt_state, found))
