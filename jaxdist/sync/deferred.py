"""A transform's exchange taken out of its step: what runs it beside the next steps needs.

`streaming_diloco` and `diloco(eager=True)` take `exchange='deferred'`: the
step then keeps each worker's own value where the average goes (`pending`
in its state) and sends nothing, and a `DeferredExchange` says when to
average it and how (`streaming_exchange`, `diloco_exchange`), so that a
loop can run that all-reduce as a program of its own, on a thread of its
own, while the next steps compute (`jaxdist.train.overlap` does).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from jaxdist.sync import _checks

EXCHANGES = ('inline', 'deferred')


class DeferredExchange(NamedTuple):
  """How to finish the steps of a transform made with `exchange='deferred'`.

  Both functions run per worker under the worker axes (`shard_map` over the
  devices × `vmap` over a device's workers, as the step), on one worker's
  values. With `count` the transform's step count before a step (its
  state's `count`; the loop's step in a run from scratch):

  - after the step at `count` where `sent(count)` = p (not None), run
    `average(p, pending)` on the `pending` of that step's state (the field
    of the `state` class). It may run beside the next steps, which must be
    given a `pending` of the same shapes (e.g. zeros), not the buffers it
    reads.
  - its result goes back into the state's `pending` before the step at the
    `count` where `applied(count)` = p, if `merge` is None (that step reads
    it); else after that step, and `merge(p, params, state)` then finishes it
    (the outer step the inline step takes inside itself).

  Done so, the models and states are the inline run's (each transform says
  to what precision). A checkpoint taken between a send and its application
  must hold the average in `pending`, as the inline state does.

  Attributes:
    state: the transform's state class, the one holding `pending`.
    sent: count -> what the step at `count` sends for averaging (None: nothing).
    average: (p, pending) -> `pending` with what was sent as p averaged over the
      workers (one dense all-reduce of its bytes).
    applied: count -> what the step at `count` applies (None: nothing).
    merge: (p, params, state) -> (params, state) after the step that applies p,
      or None.
    keys: every p that `sent` and `applied` may give (a loop compiles a program
      for each before it starts).
  """

  state: type
  sent: Callable[[int], Hashable | None]
  average: Callable[[Any, Any], Any]
  applied: Callable[[int], Hashable | None]
  merge: Callable[[Any, Any, Any], tuple[Any, Any]] | None = None
  keys: tuple = (0,)


def check_exchange(exchange: str, delay_ok: bool, averager: Any, needs: str) -> bool:
  """Checks `exchange` against the transform's arguments; whether it is 'deferred'.

  Args:
    exchange: 'inline' or 'deferred'.
    delay_ok: whether the arguments leave steps between a send and its use.
    averager: the transform's averager (deferred: None).
    needs: what `delay_ok` asks for, for the error.

  Returns:
    Whether the exchange is deferred.
  """
  _checks.check('exchange', exchange, lambda e: e in EXCHANGES, f'one of {EXCHANGES}')
  if exchange == 'deferred' and not delay_ok:
    raise ValueError(
      f"exchange='deferred' needs {needs} (steps for the exchange to run beside); "
      "use exchange='inline'"
    )
  if exchange == 'deferred' and averager is not None:
    raise ValueError(
      "exchange='deferred' averages with one dense all-reduce; pass averager=None "
      "or use exchange='inline'"
    )
  return exchange == 'deferred'
