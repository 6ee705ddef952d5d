"""ADOPT's runtime controller: warm-up, explorations of every candidate, re-solves.

After warm-up, one exploration runs every candidate for `explore_steps` steps
from the same saved train state; a new exploration starts when the smoothed
relative change of the gain between steps, |gain_t − gain_{t−1}| / gain_{t−1},
reaches `gain_threshold`; the ratio is re-solved, from the last exploration's
gains, only when the network (α, β) changes. `adopt` documents the state
machine; each phase is one function of the settings and the state (`_PHASES`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxdist import netmodel
from jaxdist.control.adopt.choice import CANDIDATES, _asf, _check_weights, solve
from jaxdist.control.adopt.fit import fit_comm_time, fit_gain
from jaxdist.control.adopt.price import CommCost, comm_ms

PHASES = ('warmup', 'explore', 'train')


class AdoptState(NamedTuple):
  """State of the ADOPT controller (host side).

  Python numbers, strings and tuples: `json.dumps(state._asdict())` saves it
  and `AdoptState(**json.loads(...))` restores it (lists become tuples again
  on the next `update`).

  The flags and the index are for the NEXT step: `update` observes the step
  that ran `index` and returns what to do before and during the next one.

  Attributes:
    step: updates (training steps) observed.
    phase: 'warmup', 'explore' or 'train'.
    index: the candidate the next step runs.
    collective: 'allgather' or 'allreduce' for it at the latest network.
    algorithm: the all-reduce algorithm ('ring' or 'tree') it was priced with.
    snapshot: save the train state in memory before the next step (an
      exploration starts).
    restore: restore the saved train state before the next step (another
      candidate's exploration starts, or, in 'train', the exploration ended:
      drop the copy afterwards).
    exploring_index: the candidate being explored (== index), −1 outside.
    explore_done: steps of it explored so far.
    explore_gains: its last `window` gains.
    resume_index: the candidate training goes back to after the exploration.
    gains: each candidate's smoothed gain from the last exploration (NaN before).
    comm_ms: each candidate's modelled ms, at its exploration or the last solve.
    asf: each candidate's ASF score at the last solve (NaN before).
    prev_gain: the last training gain of `index` (NaN: none to compare with).
    changes: the last `window` relative gain changes.
    latency_s: α of the network of the last solve (or of `init`).
    bandwidth: bandwidth (bytes/s) of that network.
    explorations: explorations completed.
    solves: solves done.
    solver: how the last choice was made: '' (none yet), 'nsga2', or
      'measured' (a fit failed; ASF on the measured points).
  """

  step: int
  phase: str
  index: int
  collective: str
  algorithm: str
  snapshot: bool
  restore: bool
  exploring_index: int
  explore_done: int
  explore_gains: tuple[float, ...]
  resume_index: int
  gains: tuple[float, ...]
  comm_ms: tuple[float, ...]
  asf: tuple[float, ...]
  prev_gain: float
  changes: tuple[float, ...]
  latency_s: float
  bandwidth: float
  explorations: int
  solves: int
  solver: str


class ADOPT(NamedTuple):
  """A host-side controller: `init(network)` and `update(state, *, gain, network)`.

  Attributes:
    init: `(network) -> AdoptState`, from the network in force.
    update: `(state, *, gain, network) -> AdoptState`, one step's measured
      gain and the network it ran on.
  """

  init: Callable[[netmodel.Network], AdoptState]
  update: Callable[..., AdoptState]


def smoothed(values: Sequence[float], smoothing: float = 0.01) -> float:
  """The authors' windowed EWMA: Σ_j (1 − s)^j v_j / Σ_j (1 − s)^j, j = 1 for the newest.

  Example:
    >>> smoothed([1.0, 3.0], smoothing=0.5)  # weights 1/4 (older), 1/2 (newest)
    2.333...
  """
  v = np.asarray(values, float)[::-1]
  if not v.size:
    return math.nan
  w = (1.0 - smoothing) ** np.arange(1, v.size + 1)
  return float(np.sum(w * v) / np.sum(w))


@dataclasses.dataclass(frozen=True)
class _Settings:
  """`adopt`'s arguments, checked: what every phase reads besides the state."""

  candidates: tuple[float, ...]
  num_params: int
  num_workers: int
  warmup_steps: int
  explore_steps: int
  gain_threshold: float
  window: int
  smoothing: float
  weights: tuple[float, float]  # (comm time, gain)
  seed: int
  algorithms: tuple[str, ...]
  leader: str


def adopt(
  candidates: Sequence[float] = CANDIDATES,
  *,
  num_params: int,
  num_workers: int,
  warmup_steps: int = 0,
  explore_steps: int = 10,
  gain_threshold: float = 0.1,
  window: int = 5,
  smoothing: float = 0.01,
  weights: Sequence[float] = (0.6, 0.4),
  seed: int = 1,
  algorithms: Sequence[str] = ('ring', 'tree'),
  leader: str = 'star',
) -> ADOPT:
  """ADOPT's runtime control of the compression ratio over compiled candidates.

  The trainer calls `update(state, gain=..., network=...)` after every step
  with the gain that step measured (‖C(g_e)‖ / ‖g_e‖, averaged over workers)
  and the network in force, then acts on the returned state before the next
  step: save the train state if `snapshot`, restore it if `restore`, run
  candidate `index` with `collective`.

  State machine (K candidates, E = `explore_steps`, W = `window`):

  - init: phase 'warmup' at candidate 0 (or 'explore' with `snapshot` set,
    if `warmup_steps` is 0); the init network is the solve reference.
  - 'warmup': after `warmup_steps` updates -> begin exploration.
  - begin exploration: phase 'explore', `snapshot`, resume_index = index,
    index = exploring_index = 0.
  - 'explore': each update adds the gain to the candidate's; after E of them
    its smoothed gain and modelled ms are kept, and either the next candidate
    starts (`restore`, index + 1) or, after the last, phase 'train' with
    `restore`, index = resume_index, the change window cleared, and a solve
    if the network differs from the reference.
  - 'train': the relative change |g − prev| / prev joins the window (if
    prev is known); a full window whose smoothed value is >= `gain_threshold`
    begins an exploration (a network change waits for its end); otherwise a
    network that differs from the reference is priced for every candidate
    (`comm_ms`), the fits and `solve` choose the index, and it becomes the
    reference. A changed index forgets prev.

  Worked example (`tests/control/test_adopt.py::test_the_worked_example`): K = 5,
  warmup_steps = 2, E = 2, ResNet-50 on 8 workers, the network 1 ms and
  10 Gbit/s until update 14, then 1 ms and 1 Gbit/s; explored gains
  (0.62, 0.45, 0.3, 0.2, 0.12). "Update u" observes step u.

    update  phase after  index  flags      what happened
    1       warmup       0                 warm-up (its gains are not used)
    2       explore      0      snapshot   warm-up over: save, explore c0
    3       explore      0                 c0, step 1 of 2
    4       explore      1      restore    c0 done (gain, ms kept): restore, explore c1
    5–11    explore      1..4   restore    (on 6, 8, 10) c1, c2, c3 done in turn
    12      train        0      restore    c4 done: restore, train on c0; no solve
                                           (the network is the init one)
    13      train        0                 its gain starts the change window
    14      train        2                 the network changed: solve -> c2 (0.0111),
                                           AR-Top-k over a ring; prev gain forgotten
    ...     explore      0      snapshot   the window's smoothed change >= 10%

  Args:
    candidates: the compiled ratios, strictly decreasing, in (0, 1), at least
      four (the gain fit has six parameters and two anchors); index 0 is the
      warm-up ratio.
    num_params: M, elements of the fused gradient.
    num_workers: N.
    warmup_steps: steps before the first exploration (>= 0).
    explore_steps: steps per candidate in an exploration (>= 1; the paper: 10).
    gain_threshold: the smoothed relative gain change that re-explores (> 0;
      the paper: 0.1).
    window: values in the windowed EWMAs (>= 1; the code: 5).
    smoothing: their α (weight (1 − α)^j; in [0, 1); the code: 0.01).
    weights: ASF weights of (comm time, gain), >= 0, summing to 1.
    seed: NSGA-II's seed.
    algorithms: all-reduce algorithms `comm_ms` may price.
    leader: AR-Top-k's leader rule, for pricing.

  Returns:
    `ADOPT(init, update)`.

  Example:
    >>> from jaxdist import netmodel
    >>> ctl = adopt(num_params=1_000_000, num_workers=8, warmup_steps=1, explore_steps=1)
    >>> state = ctl.init(netmodel.gbps(10, 1e-3))
    >>> state.phase, state.index
    ('warmup', 0)
    >>> state = ctl.update(state, gain=0.5, network=netmodel.gbps(10, 1e-3))
    >>> state.phase, state.index, state.snapshot
    ('explore', 0, True)
    >>> for g in (0.6, 0.45, 0.3, 0.2):  # c0..c3, one step each
    ...   state = ctl.update(state, gain=g, network=netmodel.gbps(10, 1e-3))
    >>> state.index, state.restore
    (4, True)
    >>> state = ctl.update(state, gain=0.12, network=netmodel.gbps(10, 1e-3))
    >>> state.phase, state.index, state.restore, state.solves  # back to c0, nothing solved
    ('train', 0, True, 0)
  """
  c = np.asarray(candidates, float)
  if c.ndim != 1 or c.size < 4:
    raise ValueError(f'candidates must be at least four ratios, got {candidates}')
  if not np.all(np.isfinite(c)) or c.min() <= 0 or c.max() >= 1 or np.any(np.diff(c) >= 0):
    raise ValueError(f'candidates must be strictly decreasing ratios in (0, 1), got {candidates}')
  if num_params < 1:
    raise ValueError(f'num_params must be >= 1, got {num_params}')
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  if warmup_steps < 0:
    raise ValueError(f'warmup_steps must be >= 0, got {warmup_steps}')
  if explore_steps < 1:
    raise ValueError(f'explore_steps must be >= 1, got {explore_steps}')
  if not (gain_threshold > 0 and math.isfinite(gain_threshold)):
    raise ValueError(f'gain_threshold must be finite and > 0, got {gain_threshold}')
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  if not 0.0 <= smoothing < 1.0:
    raise ValueError(f'smoothing must be in [0, 1), got {smoothing}')
  cands = tuple(float(x) for x in c)
  w = _check_weights(weights)
  probe = netmodel.Network(0.0, 1.0)  # pricing once checks algorithms and leader
  comm_ms(cands[0], probe, num_params, num_workers, algorithms=algorithms, leader=leader)
  settings = _Settings(
    candidates=cands, num_params=num_params, num_workers=num_workers,
    warmup_steps=warmup_steps, explore_steps=explore_steps, gain_threshold=gain_threshold,
    window=window, smoothing=smoothing, weights=tuple(float(x) for x in w),
    seed=seed, algorithms=tuple(algorithms), leader=leader,
  )  # fmt: skip
  return ADOPT(functools.partial(_init, settings), functools.partial(_update, settings))


def _price(st: _Settings, i: int, net: netmodel.Network) -> CommCost:
  """Candidate `i`'s cheapest collective at `net`."""
  return comm_ms(
    st.candidates[i], net, st.num_params, st.num_workers, algorithms=st.algorithms,
    leader=st.leader,
  )  # fmt: skip


def _init(st: _Settings, network: netmodel.Network) -> AdoptState:
  if not isinstance(network, netmodel.Network):
    raise ValueError(f'network must be a jaxdist.netmodel.Network, got {network!r}')
  nan = (math.nan,) * len(st.candidates)
  s = AdoptState(
    step=0, phase='warmup', index=0, collective='', algorithm='', snapshot=False,
    restore=False, exploring_index=-1, explore_done=0, explore_gains=(), resume_index=0,
    gains=nan, comm_ms=nan, asf=nan, prev_gain=math.nan, changes=(),
    latency_s=float(network.latency), bandwidth=float(network.bandwidth), explorations=0,
    solves=0, solver='',
  )  # fmt: skip
  return _priced(st, _begin_exploration(s) if st.warmup_steps == 0 else s, network)


def _update(
  st: _Settings, state: AdoptState, *, gain: float, network: netmodel.Network
) -> AdoptState:
  gain = float(gain)
  if not (math.isfinite(gain) and gain >= 0):
    raise ValueError(f'gain must be finite and >= 0, got {gain}')
  if not isinstance(network, netmodel.Network):
    raise ValueError(f'network must be a jaxdist.netmodel.Network, got {network!r}')
  if state.phase not in PHASES:
    raise ValueError(f'state.phase must be one of {PHASES}, got {state.phase!r}')
  s = AdoptState(*(tuple(v) if isinstance(v, list) else v for v in state))  # from JSON
  s = s._replace(step=s.step + 1, snapshot=False, restore=False)
  s = _PHASES[s.phase](st, s, gain, network)
  return _priced(st, s, network)


def _warmup(st: _Settings, s: AdoptState, gain: float, network: netmodel.Network) -> AdoptState:
  """Warm-up: its gains are not used; after `warmup_steps` updates, explore."""
  del gain, network
  return _begin_exploration(s) if s.step >= st.warmup_steps else s


def _explore(st: _Settings, s: AdoptState, gain: float, network: netmodel.Network) -> AdoptState:
  """One step of the candidate being explored; at its end, the next one or training."""
  i, done = s.exploring_index, s.explore_done + 1
  s = s._replace(explore_done=done, explore_gains=(*s.explore_gains, gain)[-st.window :])
  if done < st.explore_steps:
    return s
  s = s._replace(
    gains=_put(s.gains, i, smoothed(s.explore_gains, st.smoothing)),
    comm_ms=_put(s.comm_ms, i, _price(st, i, network).ms),
    explore_done=0, explore_gains=(), restore=True,
  )  # fmt: skip
  if i + 1 < len(st.candidates):
    return s._replace(index=i + 1, exploring_index=i + 1)
  s = s._replace(
    phase='train', index=s.resume_index, exploring_index=-1, changes=(),
    explorations=s.explorations + 1,
  )  # fmt: skip
  return _choose(st, s, network) if _moved(s, network) else s


def _train(st: _Settings, s: AdoptState, gain: float, network: netmodel.Network) -> AdoptState:
  """A training step: a large smoothed gain change explores, else a new network re-solves."""
  changes = s.changes
  if math.isfinite(s.prev_gain) and s.prev_gain > 0:
    changes = (*changes, abs(gain - s.prev_gain) / s.prev_gain)[-st.window :]
  s = s._replace(prev_gain=gain, changes=changes)
  if len(changes) == st.window and smoothed(changes, st.smoothing) >= st.gain_threshold:
    return _begin_exploration(s)
  return _choose(st, s, network) if _moved(s, network) else s


_PHASES: dict[str, Callable[[_Settings, AdoptState, float, netmodel.Network], AdoptState]] = {
  'warmup': _warmup,
  'explore': _explore,
  'train': _train,
}


def _priced(st: _Settings, s: AdoptState, net: netmodel.Network) -> AdoptState:
  """The collective and algorithm of the next step's candidate at `net`."""
  cost = _price(st, s.index, net)
  return s._replace(collective=cost.collective, algorithm=cost.algorithm)


def _begin_exploration(s: AdoptState) -> AdoptState:
  return s._replace(
    phase='explore', snapshot=True, restore=False, resume_index=s.index, index=0,
    exploring_index=0, explore_done=0, explore_gains=(),
  )  # fmt: skip


def _moved(s: AdoptState, net: netmodel.Network) -> bool:
  """Whether `net` differs from the network of the last solve (or of `init`)."""
  return (net.latency, net.bandwidth) != (s.latency_s, s.bandwidth)


def _choose(st: _Settings, s: AdoptState, net: netmodel.Network) -> AdoptState:
  """Prices every candidate at `net`, fits, solves; `net` becomes the reference."""
  cands, w = st.candidates, np.asarray(st.weights, float)
  ms = tuple(_price(st, i, net).ms for i in range(len(cands)))
  try:
    sol = solve(
      fit_comm_time(cands, ms), fit_gain(cands, s.gains), low=min(cands), high=max(cands),
      weights=w, seed=st.seed, grid=cands,
    )  # fmt: skip
    index, scores, how = sol.index, sol.asf, 'nsga2'
  except ValueError:
    F = np.stack([np.asarray(ms), 1.0 / np.maximum(np.asarray(s.gains), 1e-300)], -1)
    scores = tuple(float(x) for x in _asf(F, F.min(0), F.max(0), w))
    index, how = int(np.argmin(scores)), 'measured'
  return s._replace(
    index=index, comm_ms=ms, asf=scores, latency_s=float(net.latency),
    bandwidth=float(net.bandwidth), solves=s.solves + 1, solver=how,
    prev_gain=s.prev_gain if index == s.index else math.nan,
  )  # fmt: skip


def _put(values: tuple, i: int, v: float) -> tuple:
  return tuple(float(v) if j == i else x for j, x in enumerate(values))
