"""The training loop: a step, then hooks, until the last step.

Both of the library's trainers run it: `jd.train.trainer.train` (a run of an
`Experiment`) and `jd.train.failures.train_with_failures` (CPR's recovery
simulation). `step(t, state)` trains step t (0-based) and returns the new
state; after it, each hook sees the loop (`Loop`: the state and the steps
done) and may change it: evaluate, checkpoint, or rewind to an earlier step
(a failure's full recovery). Hooks run inside `paused()`, which keeps their
time off a training clock. Before each step `stop(loop)` may end the loop
early (Ctrl-C and preemption, `jaxdist.train.interrupt`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass
class Loop:
  """The loop's carry: the train state after `t` steps, of `steps` to train.

  Attributes:
    state: the train state.
    t: steps trained.
    steps: steps to train in all.
  """

  state: Any
  t: int
  steps: int


Hook = Callable[[Loop], None]


def run(
  loop: Loop,
  step: Callable[[int, Any], Any],
  hooks: Sequence[Hook] = (),
  paused: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
  stop: Callable[[Loop], bool] | None = None,
) -> Loop:
  """Trains from `loop.t` to `loop.steps`, running `hooks` after every step; returns `loop`.

  Args:
    loop: the state and the steps done so far, of `loop.steps`.
    step: `step(t, state)` trains step t (0-based) and returns the new state.
    hooks: called with the loop after every step, inside `paused()`.
    paused: a context manager that keeps the hooks' time off a clock.
    stop: asked before every step; True ends the loop there (`loop.t < loop.steps`).

  Returns:
    `loop`, with the state after the last step trained and `t` its count.
  """
  while loop.t < loop.steps and not (stop and stop(loop)):
    loop.state = step(loop.t, loop.state)
    loop.t += 1
    with paused():
      for hook in hooks:
        hook(loop)
  return loop


def every(period: int, action: Hook, *, last: bool = True, wait: Callable[[], bool] | None = None):
  """A hook that runs `action` after every `period`-th step (and the last, if `last`).

  While `wait()` is true an action that falls due waits, and runs after the
  first step at which it is false (the trainer's evaluations and checkpoints
  wait for an exploration to be undone).

  Args:
    period: steps between runs (0: only the last step).
    action: the hook to run, given the loop.
    last: run after the last step too.
    wait: while true, a due action waits (None: never).

  Returns:
    The hook.
  """
  due = False

  def hook(loop: Loop) -> None:
    nonlocal due
    due = due or bool(period and loop.t % period == 0) or (last and loop.t == loop.steps)
    if due and not (wait and wait()):
      due = False
      action(loop)

  return hook
