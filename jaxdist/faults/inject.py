"""Failures injected into a simulated run: a worker that straggles, a worker that drops out.

`config.fault` (`jaxdist.train.config`) names them; the trainer applies them.
Both act on simulated workers inside one program, so no process dies (for
that, `config.fault.kill_at_step` SIGKILLs the process; see the docs' guide
"GPUs, TPUs and multiple hosts", section "A dead peer").

- A **straggle** `worker:factor@start-end` multiplies worker `worker`'s compute
  time by `factor` on steps start+1 .. end (the records' 1-based step
  numbers: it begins after step `start` is logged). It changes only the
  modelled clock (`jd.netmodel.Cluster.compute_seconds`), where each method's
  waiting rule decides who waits for it: BSP waits at every step, local SGD
  at its syncs, SSP up to its staleness, async never. Training itself is
  unchanged, as on real hardware a slow worker computes the same gradient
  late.
- A **drop** `worker@start[-end]` takes worker `worker` out of steps
  start+1 .. end (for good without an end). A dropped worker trains on no
  examples, and the weighted all-reduce (`jd.sync.weighted_allreduce`) gives
  it weight 0: the gradient is the mean over the workers that are left, so
  the global batch shrinks to theirs and the learning rate is unchanged
  (torchft's reading of a lost replica: the quorum shrinks and the average
  is taken over its participants). The examples the dropped worker would
  have drawn are lost, not handed to others. It still receives every
  step's averaged gradient, which in simulation keeps its replica equal to
  the others', so when it rejoins (after step `end`) it holds the live model
  and optimizer state, as torchft's recovering replica does after copying a
  live peer's. The ledger still prices the all-reduce for all K workers (a
  real ring would re-form with K − 1), an overestimate of one worker's share.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Straggle(NamedTuple):
  """Worker `worker` computes `factor` times slower on 0-based steps start <= t < end.

  Attributes:
    worker: the worker.
    factor: the slowdown (>= 1).
    start: the first step (0-based) is `start`.
    end: the steps end before `end`.
  """

  worker: int
  factor: float
  start: int
  end: int


class Drop(NamedTuple):
  """Worker `worker` takes no part in 0-based steps start <= t < end (end None: never returns).

  Attributes:
    worker: the worker.
    start: the first step (0-based) is `start`.
    end: the steps end before `end` (None: never returns).
  """

  worker: int
  start: int
  end: int | None


_STRAGGLE = re.compile(r'^(\d+):([0-9.eE+-]+)@(\d+)-(\d+)$')
_DROP = re.compile(r'^(\d+)@(\d+)(?:-(\d+))?$')


def _items(text: str) -> list[str]:
  return [t.strip() for t in str(text).split(',') if t.strip()]


def _check_worker(where: str, item: str, worker: int, num_workers: int) -> None:
  if worker >= num_workers:
    raise ValueError(
      f'config.fault.{where}: {item!r} names worker {worker}, but the run has '
      f'{num_workers} workers (0 .. {num_workers - 1})'
    )


def parse_straggles(text: str, num_workers: int) -> tuple[Straggle, ...]:
  """`config.fault.straggle`: comma-separated 'worker:factor@start-end'.

  Args:
    text: the setting ('' for none).
    num_workers: K; each worker must be in [0, K).

  Returns:
    A tuple of `Straggle`s.

  Raises:
    ValueError: naming the item that is malformed or out of range.

  Example:
    >>> parse_straggles('3:4@100-200, 0:2@0-10', num_workers=8)[1]
    Straggle(worker=0, factor=2.0, start=0, end=10)
  """
  out = []
  for item in _items(text):
    m = _STRAGGLE.match(item.replace(' ', ''))
    if not m:
      raise ValueError(
        f"config.fault.straggle: {item!r} is not 'worker:factor@start-end' "
        "(e.g. '3:4@100-200': worker 3 computes 4x slower on steps 101..200)"
      )
    worker, start, end = int(m[1]), int(m[3]), int(m[4])
    try:
      factor = float(m[2])
    except ValueError:
      raise ValueError(f'config.fault.straggle: {item!r}: {m[2]!r} is not a number') from None
    _check_worker('straggle', item, worker, num_workers)
    if not factor >= 1.0:
      raise ValueError(f'config.fault.straggle: {item!r}: the slowdown must be >= 1, got {factor}')
    if end <= start:
      raise ValueError(f'config.fault.straggle: {item!r}: end must be after start')
    out.append(Straggle(worker, factor, start, end))
  return tuple(out)


def parse_drops(text: str, num_workers: int) -> tuple[Drop, ...]:
  """`config.fault.drop`: comma-separated 'worker@start' or 'worker@start-end'.

  Args:
    text: the setting ('' for none).
    num_workers: K; each worker must be in [0, K).

  Returns:
    A tuple of `Drop`s.

  Raises:
    ValueError: naming a malformed item, or if the drops leave no worker.

  Example:
    >>> parse_drops('3@100-200,5@50', num_workers=8)
    (Drop(worker=3, start=100, end=200), Drop(worker=5, start=50, end=None))
  """
  out = []
  for item in _items(text):
    m = _DROP.match(item.replace(' ', ''))
    if not m:
      raise ValueError(
        f"config.fault.drop: {item!r} is not 'worker@start' or 'worker@start-end' "
        "(e.g. '3@100-200': worker 3 is gone for steps 101..200)"
      )
    worker, start, end = int(m[1]), int(m[2]), None if m[3] is None else int(m[3])
    _check_worker('drop', item, worker, num_workers)
    if end is not None and end <= start:
      raise ValueError(f'config.fault.drop: {item!r}: end must be after start')
    out.append(Drop(worker, start, end))
  for d in out:  # who is left changes only where a drop starts
    if not alive(out, num_workers, d.start).any():
      raise ValueError(
        f'config.fault.drop: {text!r} leaves no worker at step {d.start + 1}; leave at least one'
      )
  return tuple(out)


def alive(drops: Sequence[Drop], num_workers: int, step: int) -> np.ndarray:
  """[K] bool: which workers take part in 0-based step `step`.

  Args:
    drops: the `Drop`s.
    num_workers: K.
    step: the 0-based step.

  Returns:
    bool [K].

  Example:
    >>> alive(parse_drops('1@2-4', 3), 3, 2)
    array([ True, False,  True])
  """
  out = np.ones(num_workers, bool)
  for d in drops:
    if d.start <= step and (d.end is None or step < d.end):
      out[d.worker] = False
  return out
