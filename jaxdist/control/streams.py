"""ScaDLES's streaming model: stream rates, buffers and batches (Tyagi & Swany, BigData 2022).

Edge device i receives a stream of S_i samples/s and trains on what streamed
in. Host-side and pure NumPy: the trainer reads each step's batches and waits
from the state and feeds the step's modelled seconds back; the device step
never recompiles, since every device holds b_max examples and a count
(`jaxdist.models.masked`), and gradients are averaged with the weights λ
(`jaxdist.sync.weighted.weighted_allreduce`).

  b_i = clip(⌊S_i · interval_s⌋, b_min, b_max)   `policy='proportional'` (ScaDLES)
  b_i = ⌊B / K⌋                                   `policy='fixed'` (conventional DDL)
  λ_i = b_i / Σ_j b_j                             Eq. 4, `weights`
  η_scaled = η · Σ_j b_j / B                      linear scaling, `lr_scale`
  w_i = max(b_i − Q_i, 0) / S_i                   the wait for data, Q_i the buffer
  Q_i ≤ ⌈S_i · interval_s⌉                        `buffer='truncation'`, O(S_i)
  Q_i += S_i · t − b_i each step                  `buffer='persistence'`, O(S_i T) (Eq. 2)

B is the base global batch and K the number of devices. Named rate sets
(`RATE_SETS`, Table I) are drawn by `stream_rates`.

One `update(state, step_s)` is one trained step. The state before it describes
the step: Q_i, the samples buffered when its batches were chosen (after
arrivals and truncation), b_i, and w_i. Then:

1. Take. Device i takes b_i samples: from its buffer at once if Q_i ≥ b_i
   (w_i = 0), else all Q_i and the next b_i − Q_i that stream in, w_i later.
   Left over: L_i = max(Q_i − b_i, 0). Samples that arrive during a wait go
   into the batch; truncation never drops them.
2. Barrier. The step is synchronous: it computes once every device holds its
   batch, W = max_j w_j after the choice, and ends `step_s` later (`step_s`:
   compute and communication, no wait). `elapsed_s` += W + step_s.
3. Arrivals. From its take to the end of the step device i receives
   A_i = S_i · (W − w_i + step_s) samples.
4. Buffer. Persistence: Q'_i = L_i + A_i. Truncation: Q'_i = min(L_i + A_i,
   ⌈S_i · interval_s⌉), the newest; the rest is counted in `dropped`. (The
   buffer only grows between takes, so capping it here equals capping it all
   the time.)
5. Choose. The next step's b'_i (rates are constant, so they do not change)
   and w'_i = max(b'_i − Q'_i, 0) / S_i.

`init` starts with empty buffers: the first step waits b_i / S_i.

Worked example: S = (10, 40), interval_s = 1, [b_min, b_max] = [8, 32], so
b = (10, 32) and the truncation caps are (10, 40).

- init: Q = (0, 0), w = (10/10, 32/40) = (1.0, 0.8).
- update(0.5): W = 1.0, L = (0, 0), A = (10 · 0.5, 40 · 0.7) = (5, 28);
  Q = (5, 28) under either buffer, w = (0.5, 0.1); elapsed 1.5 s.
- update(2.0): W = 0.5, L = (0, 0), A = (10 · 2.0, 40 · 2.4) = (20, 96).
  Persistence: Q = (20, 96). Truncation: Q = (10, 40), 10 and 56 dropped.
  w = (0, 0) under both; elapsed 4.0 s.
- update(1.0): W = 0, A = (10, 40). Persistence: L = (10, 64), Q = (20, 104):
  device 1 gains 40 − 32 = 8 samples a step for ever. Truncation: L = (0, 8),
  Q = (10, 40).

Readings and departures, after the check in research/ALGORITHMS.md §6:

- The paper trains b_i = S_i; here ⌊S_i · interval_s⌋, the whole samples of
  one interval (1 s by default), clipped to [b_min, b_max] = [8, 1024].
- λ and the lr scale use the batches trained (after clipping), as the
  authors' code does (grad · b/Σb, lr · Σb/B), not the raw rates of Eq. 4.
- Truncation keeps the newest ⌈S_i · interval_s⌉ samples, the paper's O(S_i);
  the launch code keeps t·S uncapped and the Kafka consumer the first
  max_batch of each window.
- The wait (b − q)/S is the code's; here the step also waits for the slowest
  device (the barrier W) and every stream keeps arriving meanwhile.
- Fluid model: samples arrive continuously and buffers count fractions.
- Rates are constant per device (Table I's sets); the paper's Kafka streams
  vary. `policy='fixed'` is not clipped to b_min and needs ⌊B / K⌋ ≤ b_max.
- The uniform sets are read as U[m − √3 sd, m + √3 sd] (same mean and sd); S1
  is then U[−3.6, 79.6], so draws below `min_rate` (1 sample/s) are clipped up
  to it (about 5.5% of S1's draws), not redrawn. 'S10'/'S20' are the paper's
  normal sets S′1/S′2.
- Data injection and adaptive compression (ScaDLES's other parts) are not here.

Reference: Tyagi & Swany. ScaDLES: Scalable Deep Learning over Streaming data
at the Edge. IEEE BigData 2022, pp. 2113–2122.
https://sahiltyagi4.github.io/files/scadles.pdf
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

RATE_SETS: dict[str, tuple[str, float, float]] = {
  'S1': ('uniform', 38.0, 24.0),
  'S2': ('uniform', 300.0, 112.0),
  'S10': ('normal', 64.0, 24.0),
  'S20': ('normal', 256.0, 28.0),
}
"""Table I's stream-rate sets, samples/s: name -> (distribution, mean, sd)."""

BUFFERS = ('persistence', 'truncation')
POLICIES = ('proportional', 'fixed')


def _rates(rates: Sequence[float] | np.ndarray, name: str = 'rates') -> np.ndarray:
  """Checks a non-empty vector of finite rates > 0; returns it as float64."""
  s = np.asarray(rates, np.float64)
  if s.ndim != 1 or not s.size:
    raise ValueError(f'{name} must be a non-empty vector of samples/s, got shape {s.shape}')
  if not np.all(np.isfinite(s)) or s.min() <= 0:
    raise ValueError(f'{name} must all be finite and > 0 samples/s, got {s.tolist()}')
  return s


def stream_rates(
  name_or_rates: str | Sequence[float] | np.ndarray,
  num_workers: int,
  *,
  seed: int = 0,
  min_rate: float = 1.0,
) -> np.ndarray:
  """[K] stream rates, samples/s: a named set of `RATE_SETS` drawn, or given rates checked.

  A named set is drawn with `np.random.default_rng(seed)`: 'uniform' as
  U[m − √3 sd, m + √3 sd], 'normal' as N(m, sd); draws below `min_rate` are
  clipped up to it (S1 would otherwise have negative rates). Given rates are
  returned as they are, after checks.

  Args:
    name_or_rates: 'S1', 'S2', 'S10' or 'S20', or K rates > 0.
    num_workers: K, the number of devices (>= 1).
    seed: the draw's seed; the same seed gives the same rates.
    min_rate: the smallest rate a draw gives (> 0).

  Returns:
    [K] float64 samples/s.

  Example:
    >>> stream_rates([10, 40], 2)
    array([10., 40.])
    >>> bool(stream_rates('S1', 1000).min() == 1.0)  # U[-3.6, 79.6], clipped
    True
  """
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  if isinstance(name_or_rates, str):
    if name_or_rates not in RATE_SETS:
      raise ValueError(
        f'name_or_rates: unknown rate set {name_or_rates!r}; use one of {sorted(RATE_SETS)} '
        'or pass the rates themselves'
      )
    if not (math.isfinite(min_rate) and min_rate > 0):
      raise ValueError(f'min_rate must be finite and > 0 samples/s, got {min_rate}')
    dist, mean, sd = RATE_SETS[name_or_rates]
    rng = np.random.default_rng(seed)
    if dist == 'uniform':
      half = math.sqrt(3.0) * sd  # the moment-matched half-width
      s = rng.uniform(mean - half, mean + half, num_workers)
    else:
      s = rng.normal(mean, sd, num_workers)
    return np.maximum(s, min_rate)
  s = _rates(name_or_rates, 'name_or_rates')
  if s.size != num_workers:
    raise ValueError(
      f'name_or_rates must have one rate per device ({num_workers}), got {s.size}; '
      'pass num_workers=len(rates)'
    )
  return s


class StreamState(NamedTuple):
  """State of the streams (host side), describing the step about to be trained.

  Every field is per device ([K]) unless said otherwise; arrays and ints only,
  so the trainer can write it to JSON (`.tolist()`) and read it back
  (`np.asarray`).

  Attributes:
    queue: [K] float, samples buffered when this step's batches were chosen
      (after arrivals and truncation, before the batch is taken): the
      paper's buffer size Q_i.
    batches: [K] int, the examples each device trains this step.
    wait_s: [K] float, seconds a device waits for data before it holds its
      batch this step, max(b − Q, 0) / S; the step waits for max(wait_s).
    peak_queue: [K] float, the largest `queue` so far (the buffer peaks just
      before a batch is taken).
    queue_sum: [K] float, Σ of `queue` over the steps trained so far (the
      initial empty buffers not counted); mean = queue_sum / step.
    arrived: [K] float, samples streamed in so far.
    dropped: [K] float, samples truncation discarded so far.
    step: steps trained so far (`update` calls).
    elapsed_s: modelled seconds so far, Σ (max wait + step_s). Scalar float.
  """

  queue: np.ndarray
  batches: np.ndarray
  wait_s: np.ndarray
  peak_queue: np.ndarray
  queue_sum: np.ndarray
  arrived: np.ndarray
  dropped: np.ndarray
  step: int
  elapsed_s: float


class Arrivals:
  """The same streams in wall-clock: device i's samples become available at S_i a second.

  The model above moves a modelled clock; this moves the host's own. Each
  `take(batches, now_s)` takes every device's batch at `now_s` (seconds of
  any monotonic clock) and returns how long each must wait until its batch
  has streamed in: the buffer holds the leftover of the last take plus what
  arrived since that take was complete (capped by truncation), exactly the
  model's steps 1, 3 and 4 with the model's times replaced by real ones.
  Fed the times the model implies (takes at its `elapsed_s`), it gives the
  model's queues and waits. The trainer (`config.streams.realtime`) sleeps
  a process's largest wait before its step, so the input rate is real: the
  step cannot start before its data exist, and the other processes wait for
  it at the step's collective (the model's barrier W).

  Readings: the buffers start empty at the first take (a resumed run's too:
  the queues are not checkpointed); the clock keeps running through
  evaluations and checkpoints, where data keep arriving (truncation caps
  them).

  Args:
    rates: [K] samples/s of the devices this host feeds.
    cap: [K] the most samples a buffer keeps (inf: persistence).

  Example:
    >>> streams_in = Arrivals([10.0, 40.0], [10.0, 40.0])  # the module's worked example
    >>> streams_in.take([10, 32], now_s=0.0)
    array([1. , 0.8])
    >>> streams_in.take([10, 32], now_s=1.5)  # the step ran from 1.0 to 1.5
    array([0.5, 0.1])
  """

  def __init__(self, rates: Sequence[float] | np.ndarray, cap: Sequence[float] | np.ndarray):
    self.rates = _rates(rates)
    self.cap = np.asarray(cap, np.float64)
    if self.cap.shape != self.rates.shape or np.any(~(self.cap > 0)):  # NaN fails too
      raise ValueError(f'Arrivals: cap must be [K] samples > 0, got {cap}')
    self.queue = np.zeros_like(self.rates)  # left over after the last take
    self.since: np.ndarray | None = None  # when each device's last take was complete
    self.dropped = np.zeros_like(self.rates)

  def take(self, batches: Sequence[int] | np.ndarray, now_s: float) -> np.ndarray:
    """Takes each device's batch at `now_s`.

    Args:
      batches: [K] examples each device takes (>= 0).
      now_s: the time of the take, seconds on the caller's monotonic clock
        (the first take starts the streams, buffers empty).

    Returns:
      [K] seconds until each device holds its batch (0: it is buffered).
    """
    b = np.asarray(batches, np.float64)
    if b.shape != self.rates.shape or np.any(~(b >= 0)):
      raise ValueError(f'Arrivals.take: batches must be [K] examples >= 0, got {batches}')
    if self.since is None:
      self.since = np.full_like(self.rates, now_s)
    held = self.queue + self.rates * np.maximum(now_s - self.since, 0.0)
    queue = np.minimum(held, self.cap)
    self.dropped += held - queue
    wait = np.maximum(b - queue, 0.0) / self.rates
    self.queue, self.since = np.maximum(queue - b, 0.0), now_s + wait
    return wait


class Streams(NamedTuple):
  """The streaming model: `init(num_workers)` and `update(state, step_s)`, and its streams in
  wall-clock (`arrivals`).

  Attributes:
    init: `(num_workers) -> StreamState`, the first step's batches.
    update: `(state, step_s) -> StreamState`, after a step of `step_s`
      modelled seconds.
    arrivals: `(workers) -> Arrivals`, the real-time streams of the given
      workers (indices), empty.
  """

  init: Callable[[int], StreamState]
  update: Callable[[StreamState, float], StreamState]
  arrivals: Callable[[Sequence[int]], Arrivals]


def streams(
  rates: Sequence[float] | np.ndarray,
  *,
  base_batch: int,
  b_min: int = 8,
  b_max: int = 1024,
  buffer: str = 'truncation',
  policy: str = 'proportional',
  interval_s: float = 1.0,
) -> Streams:
  """Devices fed by streams of `rates` samples/s, with ScaDLES's batches and buffers.

  See the module docstring for the update order, a worked example and where
  this departs from the paper. The paper's conventional-DDL baseline is
  `policy='fixed', buffer='persistence'`; ScaDLES is the defaults.

  Args:
    rates: [K] samples/s per device (> 0), e.g. from `stream_rates`.
    base_batch: B, the base global batch (>= 1): `policy='fixed'` trains
      ⌊B / K⌋ per device; `lr_scale` divides by it.
    b_min: the smallest proportional batch (>= 1).
    b_max: the largest batch (>= b_min), the static shape each device holds.
    buffer: 'truncation' keeps the newest ⌈S_i · interval_s⌉ samples,
      'persistence' every unconsumed one.
    policy: 'proportional' (ScaDLES) trains clip(⌊S_i · interval_s⌋, b_min,
      b_max); 'fixed' (conventional DDL) trains ⌊B / K⌋ on every device.
    interval_s: seconds of stream a proportional batch and a truncated
      buffer hold (> 0).

  Returns:
    `Streams(init, update, arrivals)`. `init(num_workers)` gives the first step's state
    (empty buffers); `update(state, step_s)` trains that step, `step_s` its
    modelled compute-and-communication seconds (>= 0), and gives the next
    step's state; `arrivals(workers)` the same streams of those workers in
    wall-clock (`Arrivals`).

  Example:
    >>> model = streams([10, 40], base_batch=64, b_max=32)
    >>> state = model.init(2)
    >>> state.batches, state.wait_s
    (array([10, 32]), array([1. , 0.8]))
    >>> state = model.update(state, 0.5)
    >>> state.queue, state.wait_s
    (array([ 5., 28.]), array([0.5, 0.1]))
    >>> state = model.update(state, 2.0)
    >>> state.queue, state.dropped, state.elapsed_s
    (array([10., 40.]), array([10., 56.]), 4.0)
  """
  s = _rates(rates)
  k = s.size
  if base_batch < 1:
    raise ValueError(f'base_batch must be >= 1, got {base_batch}')
  if b_min < 1:
    raise ValueError(f'b_min must be >= 1, got {b_min}')
  if b_min > b_max:
    raise ValueError(f'b_min must be <= b_max, got b_min={b_min} > b_max={b_max}')
  if buffer not in BUFFERS:
    raise ValueError(f'buffer must be one of {BUFFERS}, got {buffer!r}')
  if policy not in POLICIES:
    raise ValueError(f'policy must be one of {POLICIES}, got {policy!r}')
  if not (math.isfinite(interval_s) and interval_s > 0):
    raise ValueError(f'interval_s must be finite and > 0 seconds, got {interval_s}')
  if policy == 'fixed':
    per_device = base_batch // k
    if not 1 <= per_device <= b_max:
      raise ValueError(
        f'policy=fixed trains base_batch // K = {base_batch} // {k} = {per_device} per device; '
        f'it must be in [1, b_max] = [1, {b_max}]: change base_batch or b_max'
      )
    batches = np.full(k, per_device, np.int64)
  else:
    batches = np.clip(np.floor(s * interval_s + 1e-9), b_min, b_max).astype(np.int64)
  cap = np.ceil(s * interval_s - 1e-9) if buffer == 'truncation' else np.full(k, np.inf)

  def waits(queue: np.ndarray) -> np.ndarray:
    return np.maximum(batches - queue, 0.0) / s

  def init(num_workers: int) -> StreamState:
    if num_workers != k:
      raise ValueError(
        f'num_workers must equal the number of rates ({k}), got {num_workers}; '
        'pass num_workers=len(rates)'
      )
    zero = np.zeros(k)
    return StreamState(zero, batches.copy(), waits(zero), zero, zero, zero, zero, 0, 0.0)

  def update(state: StreamState, step_s: float) -> StreamState:
    if np.shape(state.queue) != (k,):
      raise ValueError(f'state must be for {k} devices, got queue of shape {np.shape(state.queue)}')
    if not (math.isfinite(step_s) and step_s >= 0):
      raise ValueError(f'step_s must be finite and >= 0 seconds, got {step_s}')
    queue = np.asarray(state.queue, np.float64)
    wait = np.asarray(state.wait_s, np.float64)
    left = np.maximum(queue - np.asarray(state.batches), 0.0)  # 1. take
    barrier = float(wait.max())  # 2. the slowest device's wait
    arrived = s * (barrier - wait + step_s)  # 3. since each device's take
    held = left + arrived
    new_queue = np.minimum(held, cap)  # 4. truncation keeps the newest
    return StreamState(
      queue=new_queue,
      batches=batches.copy(),  # 5. constant rates: constant batches
      wait_s=waits(new_queue),
      peak_queue=np.maximum(np.asarray(state.peak_queue, np.float64), new_queue),
      queue_sum=np.asarray(state.queue_sum, np.float64) + new_queue,
      arrived=np.asarray(state.arrived, np.float64) + arrived,
      dropped=np.asarray(state.dropped, np.float64) + (held - new_queue),
      step=int(state.step) + 1,
      elapsed_s=float(state.elapsed_s) + barrier + float(step_s),
    )

  def arrivals(workers: Sequence[int]) -> Arrivals:
    index = np.asarray(workers, int)
    return Arrivals(s[index], cap[index])

  return Streams(init, update, arrivals)


def _batches(batches: Sequence[int] | np.ndarray) -> np.ndarray:
  b = np.asarray(batches, np.float64)
  if b.ndim != 1 or not b.size:
    raise ValueError(f'batches must be a non-empty vector, got shape {b.shape}')
  if not np.all(np.isfinite(b)) or b.min() < 0 or b.sum() <= 0:
    raise ValueError(f'batches must be finite, >= 0 and not all 0, got {b.tolist()}')
  return b


def weights(batches: Sequence[int] | np.ndarray) -> np.ndarray:
  """λ_k = b_k / Σ_j b_j, the aggregation weights of Eq. 4 (on the batches trained).

  Args:
    batches: [K] examples each worker trained.

  Returns:
    [K] float weights summing to 1.

  Example:
    >>> weights([10, 30])
    array([0.25, 0.75])
  """
  b = _batches(batches)
  return b / b.sum()


def lr_scale(batches: Sequence[int] | np.ndarray, base_batch: int) -> float:
  """η_scaled / η = Σ_k b_k / B, the linear learning-rate scale of this step.

  Args:
    batches: [K] examples each worker trains.
    base_batch: B, the batch the learning rate is set for (>= 1).

  Returns:
    The scale, a float.

  Example:
    >>> lr_scale([10, 30], 64)
    0.625
  """
  if base_batch < 1:
    raise ValueError(f'base_batch must be >= 1, got {base_batch}')
  return float(_batches(batches).sum() / base_batch)


def buffer_report(state: StreamState, *, bytes_per_sample: int = 3072) -> dict:
  """Buffer sizes so far: per device and in total, in samples and bytes.

  Compare two runs by their totals, e.g. persistence's `peak_total` over
  truncation's (the paper's Table IV reports 848×–9429×).

  Args:
    state: a `StreamState` after some steps.
    bytes_per_sample: bytes one buffered sample takes (CIFAR's 32·32·3 = 3072,
      as the paper's Table II).

  Returns:
    A JSON-friendly dict: `steps`; per device (lists) `peak`, `mean`, `now`
    (samples); totals over devices `peak_total`, `mean_total`, `now_total`,
    `peak_bytes`, `mean_bytes`, `arrived_total`, `dropped_total`.

  Example:
    >>> model = streams([10, 40], base_batch=64, b_max=32, buffer='persistence')
    >>> state = model.update(model.update(model.init(2), 0.5), 2.0)
    >>> report = buffer_report(state)
    >>> report['peak'], report['mean'], report['peak_total']
    ([20.0, 96.0], [12.5, 62.0], 116.0)
  """
  steps = int(state.step)
  peak = np.asarray(state.peak_queue, np.float64)
  mean = np.asarray(state.queue_sum, np.float64) / max(steps, 1)
  now = np.asarray(state.queue, np.float64)
  return {
    'steps': steps,
    'peak': peak.tolist(),
    'mean': mean.tolist(),
    'now': now.tolist(),
    'peak_total': float(peak.sum()),
    'mean_total': float(mean.sum()),
    'now_total': float(now.sum()),
    'peak_bytes': float(peak.sum() * bytes_per_sample),
    'mean_bytes': float(mean.sum() * bytes_per_sample),
    'arrived_total': float(np.sum(state.arrived)),
    'dropped_total': float(np.sum(state.dropped)),
  }
