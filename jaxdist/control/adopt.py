"""ADOPT's choice of the compression ratio (Tyagi & Swany, BigData 2023, §III-E).

Host side and pure NumPy/SciPy/pymoo. jaxdist compiles a fixed set of
candidate ratios (and collectives) once and a traced index picks one per step,
so this module chooses an index into `CANDIDATES`, never a new ratio.

Objectives, for a kept fraction c in [c_low, c_high] (Eq. 6, as in the
authors' code, which drops t_comp as "constant w.r.t. CR"):

  f1(c) = t_sync(c) = v2 · exp(v1 · c) − 1                          (ms)
  f2(c) = 1 / gain(c),   gain(c) = (e^{v1 c} − e^{−v2 c} + v5) / (e^{v3 c} + e^{−v4 c} + v6)

t_sync is fitted (`fit_comm_time`) to the modelled communication of each
candidate: the minimum over all-gather of Top-k and AR-Top-k over a ring or a
tree (`comm_ms`, priced by `jaxdist.netmodel` exactly as
`compressed_allreduce(collective='auto')` prices them). The gain, the norm
ratio ‖C(g_e)‖ / ‖g_e‖ the trainer measures, is fitted (`fit_gain`) to the
explored candidates plus the anchors (0, 0) and (1, 1). NSGA-II (pop 40, 10
offspring, SBX(0.9, η=15), PM(η=20), 40 generations, seed 1) minimises
(f1, f2); the achievement scalarising function

  ASF(c) = max_i w_i · (f_i(c) − z_i^ideal) / (z_i^nadir − z_i^ideal),   w = (0.6, 0.4)

picks one point; `solve` returns the compiled candidate with the lowest ASF.

Runtime loop (`adopt`): after warm-up, one exploration runs every candidate
for `explore_steps` steps from the same saved train state; a new exploration
starts when the smoothed relative change of the gain between steps,
|gain_t − gain_{t−1}| / gain_{t−1}, reaches `gain_threshold`; the ratio is
re-solved, from the last exploration's gains, only when the network (α, β)
changes. See `adopt` for the state machine.

Readings, after the check in research/ALGORITHMS.md §1.4 ("Corrections"):

- Candidates: c_high / 3^k rounded, (0.1, 0.0333, 0.0111, 0.0037, 0.0012);
  the code's list is (0.1, 0.033, 0.011, 0.004, 0.001).
- Communication times are in milliseconds (the fit's "− 1" makes the unit
  matter) and, per candidate, the minimum over the collectives at the
  current α, β; all-reduce over a ring or a tree, Table I / Eqs. 4–5.
- The gain is the un-squared norm ratio (the code), not the squared one of
  the paper; the trainer measures it.
- Smoothing: the code's windowed EWMA, the last `window` = 5 values weighted
  (1 − 0.01)^j, j = 1 for the newest; the gain-change trigger waits for a
  full window.
- The NSGA-II domain is [min, max] of the candidates, as in the code.
- An exploration alone never re-solves: after warm-up the ratio stays at the
  first (largest) candidate until the network first changes.
- ASF as pymoo's `ASF().do(nF, 1 / weights)` (utopian point 0): a weight of 0
  ignores its objective.

Departures:

- Restricted to the compiled candidates: the authors' code takes NSGA-II's
  continuous ratio; here the candidates are scored by ASF on the fitted
  curves, normalised by the NSGA-II front's nadir and by the ideal point of
  the front and the candidates together (so no score is below 0), and the
  lowest score wins. The front still sets the normalisation, so the scores
  match a brute-force evaluation of the candidates against the curves'
  exact extremes to about 0.01; compare scores, not ratios.
- The exploration runs in training steps on fresh batches; the trainer saves
  the train state (parameters, optimizer, error-feedback memory) in memory
  and restores it before each candidate and after the last (the code reuses
  one test batch and a checkpoint file).
- The gain-change window is cleared after an exploration (the code keeps it,
  so one jump re-explores on every step until the window forgets it), and
  the previous gain is forgotten when the chosen candidate changes (its gain
  differs by construction). Gains of the warm-up and of explorations do not
  count towards the change.
- The code's compression warm-up (ratio annealed 1.0 → 0.1 over 5 epochs)
  is not this controller's: during `warmup_steps` it keeps candidate 0, and
  the trainer may run the device transform's own sparsity warm-up.
- If a fit fails to converge (e.g. flat gains) or the fitted gain is not
  positive on the domain, the candidates are scored by ASF on the measured
  values (normalised by their own extremes); `state.solver` says which.
- curve_fit gets up to 20000 evaluations (SciPy's default for 6 parameters:
  1400).

Reference: Tyagi & Swany. Flexible Communication for Optimal Distributed
Learning over Unpredictable Networks. IEEE BigData 2023, pp. 925–935.
https://sahiltyagi4.github.io/files/adopt.pdf
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxdist import compress, netmodel
from jaxdist.sync import _choice, _exchange
from jaxdist.sync import compressed as _compressed

CANDIDATES = (0.1, 0.0333, 0.0111, 0.0037, 0.0012)  # c_high / 3^k, k = 0..4, rounded
PHASES = ('warmup', 'explore', 'train')
POP_SIZE, OFFSPRING, GENERATIONS = 40, 10, 40  # NSGA-II, as the authors' code
_MAXFEV = 20000


# --- fits --------------------------------------------------------------------


def _comm_curve(x, v1, v2):
  return v2 * np.exp(v1 * x) - 1.0


def _gain_curve(x, v1, v2, v3, v4, v5, v6):
  return (np.exp(v1 * x) - np.exp(-v2 * x) + v5) / (np.exp(v3 * x) + np.exp(-v4 * x) + v6)


_CURVES = {'comm_ms': _comm_curve, 'gain': _gain_curve}


class Fit(NamedTuple):
  """A fitted curve of the ratio; `fit(ratio)` evaluates it (scalar or array).

  Attributes:
    kind: 'comm_ms' (v2 · exp(v1 · c) − 1) or 'gain' (the rational tanh-like).
    params: (v1, v2) or (v1, ..., v6), Python floats.
  """

  kind: str
  params: tuple[float, ...]

  def __call__(self, ratio):
    return _CURVES[self.kind](np.asarray(ratio, float), *self.params)


def _points(ratios, values, name: str, n_params: int, extra: int = 0):
  x, y = np.asarray(ratios, float), np.asarray(values, float)
  if x.ndim != 1 or x.shape != y.shape:
    raise ValueError(
      f'ratios and {name} must be vectors of one length, got shapes {x.shape}, {y.shape}'
    )
  if x.size + extra < n_params:
    raise ValueError(
      f'ratios: the {name} fit has {n_params} parameters and needs at least '
      f'{n_params - extra} points, got {x.size}'
    )
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError(f'ratios and {name} must be finite, got {x.tolist()}, {y.tolist()}')
  if x.min() <= 0 or x.max() >= 1 or np.unique(x).size != x.size:
    raise ValueError(f'ratios must be distinct and in (0, 1), got {x.tolist()}')
  return x, y


def _curve_fit(kind: str, x, y) -> Fit:
  from scipy.optimize import OptimizeWarning, curve_fit

  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', OptimizeWarning)
      warnings.simplefilter('ignore', RuntimeWarning)
      params, _ = curve_fit(_CURVES[kind], x, y, maxfev=_MAXFEV)
  except RuntimeError as e:
    raise ValueError(f'the {kind} fit did not converge: {e}') from None
  fit = Fit(kind, tuple(float(p) for p in params))
  if not (np.all(np.isfinite(params)) and np.all(np.isfinite(fit(x)))):
    raise ValueError(f'the {kind} fit did not converge: parameters {fit.params}')
  return fit


def fit_comm_time(ratios: Sequence[float], ms: Sequence[float]) -> Fit:
  """Fits t(c) = v2 · exp(v1 · c) − 1 to communication times in milliseconds.

  Args:
    ratios: kept fractions in (0, 1), distinct, at least two.
    ms: the communication time of each, in milliseconds (the "− 1" makes the
      unit matter).

  Returns:
    A `Fit` of kind 'comm_ms'.

  Raises:
    ValueError: too few or invalid points, or no convergence.

  Example:
    >>> fit = fit_comm_time([0.1, 0.01, 0.001], [2 * math.exp(2.0) - 1, 2 * math.exp(0.2) - 1,
    ...                                          2 * math.exp(0.02) - 1])
    >>> [round(p, 6) for p in fit.params]  # v1 = 20, v2 = 2
    [20.0, 2.0]
  """
  x, y = _points(ratios, ms, 'ms', 2)
  return _curve_fit('comm_ms', x, y)


def fit_gain(ratios: Sequence[float], gains: Sequence[float]) -> Fit:
  """Fits the rational tanh-like gain curve, anchored with (0, 0) and (1, 1).

  g(c) = (e^{v1 c} − e^{−v2 c} + v5) / (e^{v3 c} + e^{−v4 c} + v6). Its six
  parameters are not identifiable from a few points (different ones draw
  the same curve); the curve is what counts.

  Args:
    ratios: kept fractions in (0, 1), distinct, at least four (four plus the
      two anchors for six parameters).
    gains: the measured compression gain of each (‖C(g)‖ / ‖g‖, in [0, 1]).

  Returns:
    A `Fit` of kind 'gain'.

  Raises:
    ValueError: too few or invalid points, or no convergence (flat gains do
      not converge).
  """
  x, y = _points(ratios, gains, 'gains', 6, extra=2)
  return _curve_fit('gain', np.r_[x, 1.0, 0.0], np.r_[y, 1.0, 0.0])


# --- the multi-objective choice -------------------------------------------------


class Solution(NamedTuple):
  """What `solve` chose.

  Attributes:
    ratio: the chosen candidate ratio.
    index: its position in the grid.
    asf: each grid candidate's ASF score (lower is better), Python floats.
  """

  ratio: float
  index: int
  asf: tuple[float, ...]


def _check_weights(weights) -> np.ndarray:
  w = np.asarray(weights, float)
  if w.shape != (2,) or not np.all(np.isfinite(w)) or w.min() < 0 or abs(w.sum() - 1) > 1e-9:
    raise ValueError(
      f'weights must be two finite numbers >= 0 summing to 1 (comm time, gain), got {weights}'
    )
  return w


def _asf(F, ideal, nadir, w) -> np.ndarray:
  """max_i w_i (F_i − ideal_i) / (nadir_i − ideal_i); a flat objective scores 0."""
  span = np.where(nadir - ideal > 0, nadir - ideal, 1.0)
  return np.max(w * (F - ideal) / span, axis=1)


def solve(
  comm_fit: Callable,
  gain_fit: Callable,
  *,
  low: float = 0.001,
  high: float = 0.1,
  weights: Sequence[float] = (0.6, 0.4),
  seed: int = 1,
  grid: Sequence[float] = CANDIDATES,
) -> Solution:
  """NSGA-II for (comm ms, 1/gain) on [low, high], then ASF, restricted to the compiled candidates.

  NSGA-II (pymoo; pop 40, 10 offspring, SBX(0.9, η=15), PM(η=20), 40
  generations) finds the Pareto front of f1 = `comm_fit`(c) and
  f2 = 1 / `gain_fit`(c). Its nadir and (with the grid's own points) ideal
  normalise the objectives; each grid candidate gets ASF = max_i w_i · nF_i,
  and the lowest wins (ties: the first). The code takes the front's ASF
  point instead, a continuous ratio; jaxdist compiles only the grid.

  Args:
    comm_fit: c -> communication ms (vectorised), e.g. `fit_comm_time`'s.
    gain_fit: c -> gain (vectorised), > 0 on [low, high], e.g. `fit_gain`'s.
    low: the smallest ratio, > 0.
    high: the largest, in (low, 1].
    weights: (comm time, gain) weights, >= 0, summing to 1; (1, 0) picks the
      fastest candidate, (0, 1) the highest gain.
    seed: NSGA-II's seed.
    grid: the compiled candidates, each in [low, high].

  Returns:
    `Solution(ratio, index, asf)`.

  Raises:
    ValueError: bad arguments, or a fitted gain that is not positive (or
      objectives that are not finite) on [low, high].
  """
  w = _check_weights(weights)
  if not (0 < low < high <= 1):
    raise ValueError(f'low and high must satisfy 0 < low < high <= 1, got low={low}, high={high}')
  g = np.asarray(grid, float)
  if g.ndim != 1 or not g.size or not np.all((g >= low) & (g <= high)):
    raise ValueError(f'grid must be a non-empty list of ratios in [{low}, {high}], got {grid}')

  def objectives(c):
    c = np.asarray(c, float)
    return np.stack([np.asarray(comm_fit(c), float), 1.0 / np.asarray(gain_fit(c), float)], -1)

  probe = np.r_[np.linspace(low, high, 1001), g]
  if np.any(np.asarray(gain_fit(probe), float) <= 0) or not np.all(np.isfinite(objectives(probe))):
    raise ValueError(f'gain_fit must be > 0 and both fits finite on [low, high] = [{low}, {high}]')
  front = _nsga2(objectives, low, high, seed)
  F_grid = objectives(g)
  ideal = np.minimum(front.min(0), F_grid.min(0))
  scores = _asf(F_grid, ideal, front.max(0), w)
  i = int(np.argmin(scores))
  return Solution(float(g[i]), i, tuple(float(s) for s in scores))


def _nsga2(objectives, low: float, high: float, seed: int) -> np.ndarray:
  """The objective values of NSGA-II's final non-dominated set, [P, 2]."""
  from pymoo.algorithms.moo.nsga2 import NSGA2
  from pymoo.core.problem import Problem
  from pymoo.operators.crossover.sbx import SBX
  from pymoo.operators.mutation.pm import PM
  from pymoo.operators.sampling.rnd import FloatRandomSampling
  from pymoo.optimize import minimize

  class _Ratio(Problem):
    def __init__(self):
      super().__init__(n_var=1, n_obj=2, xl=np.array([low]), xu=np.array([high]))

    def _evaluate(self, x, out, *args, **kwargs):
      out['F'] = objectives(x[:, 0])

  algorithm = NSGA2(
    pop_size=POP_SIZE,
    n_offsprings=OFFSPRING,
    sampling=FloatRandomSampling(),
    crossover=SBX(prob=0.9, eta=15),
    mutation=PM(eta=20),
    eliminate_duplicates=True,
  )
  res = minimize(_Ratio(), algorithm, ('n_gen', GENERATIONS), seed=seed, verbose=False)
  return np.atleast_2d(np.asarray(res.F, float))


# --- communication time ----------------------------------------------------------


class CommCost(NamedTuple):
  """The cheapest collective for a ratio under the α-β model.

  Attributes:
    ms: its modelled time, milliseconds.
    collective: 'allgather' (of Top-k values and indices) or 'allreduce'
      (AR-Top-k), as `compressed_allreduce`'s `collective` names them.
    algorithm: the all-reduce algorithm it was priced with ('ring', 'tree').
  """

  ms: float
  collective: str
  algorithm: str


def comm_ms(
  ratio: float,
  network: netmodel.Network,
  num_params: int,
  num_workers: int,
  *,
  algorithms: Sequence[str] = ('ring', 'tree'),
  leader: str = 'star',
) -> CommCost:
  """The fastest of all-gather Top-k and AR-Top-k (per algorithm) for `ratio`, in ms.

  Prices the transfers `compressed_allreduce` issues for a fused Top-k of
  `num_params` float32 values with `jaxdist.netmodel`, and picks per
  algorithm as its `collective='auto'` does (`_choice.cheapest`), then the cheapest
  algorithm: ADOPT's min over AG, ART-Ring (4a) and ART-Tree (4b).

  Args:
    ratio: kept fraction in (0, 1].
    network: α (seconds) and bandwidth (bytes/s).
    num_params: M, elements of the fused gradient.
    num_workers: N.
    algorithms: all-reduce algorithms to consider (`netmodel.ALGORITHMS`).
    leader: AR-Top-k's leader rule ('star', or 'var' with its extra all-gather).

  Returns:
    `CommCost(ms, collective, algorithm)`; ties go to the first algorithm
    and, within one, to the all-gather.

  Example:
    >>> from jaxdist import netmodel
    >>> net = netmodel.gbps(10, 1e-3)  # 1 ms, 10 Gbit/s
    >>> cost = comm_ms(0.1, net, 25_557_032, 8)  # ResNet-50, 8 workers
    >>> round(cost.ms, 2), cost.collective, cost.algorithm  # Table VI: 52.9 ms (64 MB buckets)
    (55.85, 'allreduce', 'ring')
    >>> comm_ms(0.001, net, 25_557_032, 8).collective  # AG wins at tiny ratios
    'allgather'
  """
  if not 0 < ratio <= 1:
    raise ValueError(f'ratio must be in (0, 1], got {ratio}')
  if num_params < 1 or num_workers < 1:
    raise ValueError(f'num_params and num_workers must be >= 1, got {num_params}, {num_workers}')
  if not algorithms or any(a not in netmodel.ALGORITHMS for a in algorithms):
    raise ValueError(
      f'algorithms must be a non-empty subset of {netmodel.ALGORITHMS}, got {algorithms}'
    )
  if leader not in _compressed.LEADERS:
    raise ValueError(f'leader must be one of {_compressed.LEADERS}, got {leader!r}')
  topk = compress.topk(ratio=ratio)
  cols = ('allgather', 'allreduce')
  wire = [_exchange.transfers(_exchange.Exchange(topk, c), (num_params,), leader) for c in cols]
  best = None
  for alg in algorithms:
    choice = _choice.per_collective(_choice.fixed(topk), cols, network, alg)
    (way,) = _choice.cheapest(choice, wire, num_workers)
    col, ts = cols[way], wire[way]
    s = netmodel.comm_time(ts, num_workers, network, alg, counts=[1] * len(ts))
    if best is None or s < best[0]:
      best = (s, col, alg)
  s, col, alg = best
  return CommCost(s * 1e3, col, alg)


# --- the runtime controller ---------------------------------------------------------


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
  """A host-side controller: `init(network)` and `update(state, *, gain, network)`."""

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

  Worked example (`tests/test_adopt.py::test_the_worked_example`): K = 5,
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
  cands = tuple(float(x) for x in c)
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
  w = _check_weights(weights)
  price = lambda i, net: comm_ms(
    cands[i], net, num_params, num_workers, algorithms=algorithms, leader=leader
  )
  price(0, netmodel.Network(0.0, 1.0))  # checks algorithms and leader
  nan = (math.nan,) * len(cands)

  def priced(s: AdoptState, net: netmodel.Network) -> AdoptState:
    cost = price(s.index, net)
    return s._replace(collective=cost.collective, algorithm=cost.algorithm)

  def explore(s: AdoptState) -> AdoptState:
    return s._replace(
      phase='explore', snapshot=True, restore=False, resume_index=s.index, index=0,
      exploring_index=0, explore_done=0, explore_gains=(),
    )  # fmt: skip

  def moved(s: AdoptState, net: netmodel.Network) -> bool:
    return (net.latency, net.bandwidth) != (s.latency_s, s.bandwidth)

  def choose(s: AdoptState, net: netmodel.Network) -> AdoptState:
    ms = tuple(price(i, net).ms for i in range(len(cands)))
    try:
      sol = solve(
        fit_comm_time(cands, ms), fit_gain(cands, s.gains), low=min(cands), high=max(cands),
        weights=w, seed=seed, grid=cands,
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

  def init(network: netmodel.Network) -> AdoptState:
    if not isinstance(network, netmodel.Network):
      raise ValueError(f'network must be a jaxdist.netmodel.Network, got {network!r}')
    s = AdoptState(
      step=0, phase='warmup', index=0, collective='', algorithm='', snapshot=False,
      restore=False, exploring_index=-1, explore_done=0, explore_gains=(), resume_index=0,
      gains=nan, comm_ms=nan, asf=nan, prev_gain=math.nan, changes=(),
      latency_s=float(network.latency), bandwidth=float(network.bandwidth), explorations=0,
      solves=0, solver='',
    )  # fmt: skip
    return priced(explore(s) if warmup_steps == 0 else s, network)

  def update(state: AdoptState, *, gain: float, network: netmodel.Network) -> AdoptState:
    gain = float(gain)
    if not (math.isfinite(gain) and gain >= 0):
      raise ValueError(f'gain must be finite and >= 0, got {gain}')
    if not isinstance(network, netmodel.Network):
      raise ValueError(f'network must be a jaxdist.netmodel.Network, got {network!r}')
    if state.phase not in PHASES:
      raise ValueError(f'state.phase must be one of {PHASES}, got {state.phase!r}')
    s = AdoptState(*(tuple(v) if isinstance(v, list) else v for v in state))  # from JSON
    s = s._replace(step=s.step + 1, snapshot=False, restore=False)
    if s.phase == 'warmup':
      if s.step >= warmup_steps:
        s = explore(s)
    elif s.phase == 'explore':
      i, done = s.exploring_index, s.explore_done + 1
      s = s._replace(explore_done=done, explore_gains=(*s.explore_gains, gain)[-window:])
      if done >= explore_steps:
        s = s._replace(
          gains=_put(s.gains, i, smoothed(s.explore_gains, smoothing)),
          comm_ms=_put(s.comm_ms, i, price(i, network).ms),
          explore_done=0, explore_gains=(), restore=True,
        )  # fmt: skip
        if i + 1 < len(cands):
          s = s._replace(index=i + 1, exploring_index=i + 1)
        else:
          s = s._replace(
            phase='train', index=s.resume_index, exploring_index=-1, changes=(),
            explorations=s.explorations + 1,
          )  # fmt: skip
          if moved(s, network):
            s = choose(s, network)
    else:
      changes = s.changes
      if math.isfinite(s.prev_gain) and s.prev_gain > 0:
        changes = (*changes, abs(gain - s.prev_gain) / s.prev_gain)[-window:]
      s = s._replace(prev_gain=gain, changes=changes)
      if len(changes) == window and smoothed(changes, smoothing) >= gain_threshold:
        s = explore(s)
      elif moved(s, network):
        s = choose(s, network)
    return priced(s, network)

  return ADOPT(init, update)


def _put(values: tuple, i: int, v: float) -> tuple:
  return tuple(float(v) if j == i else x for j, x in enumerate(values))
