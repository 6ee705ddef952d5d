"""Ctrl-C and preemption: SIGINT or SIGTERM end a run with a checkpoint at the step it reached.

A scheduler that preempts a TPU or GPU job sends SIGTERM first (and SIGKILL a
grace period later); Ctrl-C sends SIGINT. While a run trains, `Stop` turns
either into a request: the loop finishes the step it is on, every process
agrees on the step to stop at (`Stop.due`), the run saves its checkpoint
there and raises `Interrupted`. The binaries end with one line and the
shell's status for the signal (130 for SIGINT, 143 for SIGTERM); the same
command resumes from that step, its metrics with no gap and no step twice.
A second signal while the first is handled acts as it would without jaxdist
(Ctrl-C twice: a `KeyboardInterrupt` at once).

With several processes the signal may reach one process or all of them, at
different steps. The processes agree through the coordination service's
key-value store (`jax.distributed`), so no step pays a collective for it:
a process that receives a signal posts a request; a thread in every process
watches for it and posts the number of steps its process may have dispatched
(the loop takes no further step once a request is seen); every process
stops at the largest of those numbers.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from typing import Any

import jax

SIGNALS = (signal.SIGINT, signal.SIGTERM)
AGREE_TIMEOUT_S = 120  # how long a process waits for the others' steps once a stop is asked
_POLL_S = 0.2  # how often the watcher thread looks for a request
_runs = itertools.count()  # every process starts its runs in the same order: one key per run


class Interrupted(KeyboardInterrupt):
  """A run stopped by SIGINT or SIGTERM after saving its checkpoint at `step`.

  A `KeyboardInterrupt`, so that a notebook shows it as an interruption.

  Attributes:
    step: the steps trained, and the checkpoint's step (0: nothing was trained).
    signum: the signal that asked for the stop.
  """

  def __init__(self, step: int, signum: int):
    self.step, self.signum = step, signum
    super().__init__(self.message())

  def message(self) -> str:
    """The line the binaries print: where the run stopped and how to go on.

    Returns:
      e.g. `interrupted at step 151; checkpoint saved; rerun the same command to resume`.
    """
    if self.step == 0:
      return 'interrupted before the first step; rerun the same command to start'
    return f'interrupted at step {self.step}; checkpoint saved; rerun the same command to resume'

  @property
  def exit_status(self) -> int:
    """The shell's status for a process ended by the signal: 128 + its number."""
    return 128 + self.signum


class Stop:
  """SIGINT and SIGTERM as a request to stop, for the duration of a `with` block.

  The training loop asks `stops_at(t)` before it dispatches step t + 1 (t
  steps done), and `settle()` after its last step. Outside the main thread
  (where Python cannot install signal handlers) it installs none, and only
  another process's request stops the run.

  Args:
    steps: the run's last step: no process is allowed past it.
  """

  def __init__(self, steps: int):
    self.steps = steps
    self.signum: int | None = None
    self._allowed = 0  # steps this process may have dispatched
    self._lock = threading.Lock()
    self._previous: dict[int, Any] = {}
    self._stop_at: int | None = None
    self._client = _coordination_client()
    self._key = f'jaxdist/stop/{next(_runs)}'
    self._posted = False
    self._closed = threading.Event()
    self._watcher: threading.Thread | None = None

  def __enter__(self) -> Stop:
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
    if self._client is not None:
      self._watcher = threading.Thread(target=self._watch, name='jaxdist-stop', daemon=True)
      self._watcher.start()
    return self

  def __exit__(self, *exc) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._closed.set()
    if self._watcher is not None:
      self._watcher.join()

  @property
  def asked(self) -> bool:
    """Whether a stop was asked (a signal here, or a request from another process)."""
    return self.signum is not None

  def stops_at(self, t: int) -> bool:
    """Whether the loop, t steps done, stops here instead of dispatching another step.

    Before a stop is asked, records that t + 1 steps may be dispatched and
    returns False; once it is asked, whether t reached the step every process
    stops at (`due`).

    Args:
      t: the steps done.

    Returns:
      Whether to stop.
    """
    with self._lock:
      if self.signum is None:
        self._allowed = min(t + 1, self.steps)
        return False
    return t >= self.due(t)

  def due(self, t: int) -> int:
    """The step every process stops at, once a stop is asked (t: this process's steps done).

    One process: t. Several: the most steps any of them may have dispatched
    when it learnt of the stop, so that none has to go back.

    Args:
      t: this process's steps done when it asks.

    Returns:
      The step to stop at (the same on every process, and on every call).
    """
    if self._stop_at is None:
      if self._client is None:
        self._stop_at = t
      else:
        self._post_allowed()
        self._stop_at = max(int(self._wait_for(f'at/{p}')) for p in range(jax.process_count()))
    return self._stop_at

  def settle(self) -> bool:
    """At the run's last step: whether any process was asked to stop (then all stop there).

    One process: `asked`. Several: each posts whether it was asked and reads
    the others', once per run, so that all of them go on or none does.

    Returns:
      Whether the run stops here (the same on every process).
    """
    if self._client is not None:
      me = jax.process_index()
      self._client.key_value_set(f'{self._key}/end/{me}', '1' if self.asked else '0')
      ends = [self._wait_for(f'end/{p}') for p in range(jax.process_count())]
      if '1' in ends and self.signum is None:
        self.signum = int(self._wait_for('asked'))
    return self.asked

  def _handle(self, signum: int, frame) -> None:
    del frame
    for s, handler in self._previous.items():  # a second signal acts as without jaxdist
      signal.signal(s, handler)
    with self._lock:
      self.signum = self.signum or signum
    if self._client is not None:
      self._client.key_value_set(f'{self._key}/asked', str(signum), allow_overwrite=True)

  def _watch(self) -> None:
    """Watches the store for a request; posts this process's allowed steps when one comes."""
    while not self._closed.wait(_POLL_S):
      try:
        signum = int(self._client.key_value_try_get(f'{self._key}/asked'))
      except Exception:  # NOT_FOUND: nobody asked yet
        continue
      with self._lock:
        self.signum = self.signum or signum
      self._post_allowed()
      return

  def _post_allowed(self) -> None:
    with self._lock:
      if self._posted:
        return
      self._posted = True
      allowed = self._allowed
    self._client.key_value_set(f'{self._key}/at/{jax.process_index()}', str(allowed))

  def _wait_for(self, key: str) -> str:
    """The value another process posts at `key` (under this run's), waiting for it."""
    deadline = time.monotonic() + AGREE_TIMEOUT_S
    while True:
      try:
        return self._client.blocking_key_value_get(f'{self._key}/{key}', 1000)
      except Exception:  # DEADLINE_EXCEEDED: not posted yet
        if time.monotonic() > deadline:
          raise RuntimeError(
            f'no process posted {key!r} within {AGREE_TIMEOUT_S} s of a stop being asked'
          ) from None


def _coordination_client():
  """The coordination service's client of a multi-process run, else None."""
  if jax.process_count() == 1:
    return None
  from jax._src import distributed  # the client jax.distributed.initialize made (no public API)

  return distributed.global_state.client
