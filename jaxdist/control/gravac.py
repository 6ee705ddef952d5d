"""GraVAC's host-side search for a compression factor (Tyagi & Swany, CLOUD 2023).

Compression factor (CF) θ = 1 / kept fraction; dense is CF 1. The device
compiles one compressor per CF of a fixed ascending grid (`candidate_factors`;
`ratios` gives their kept fractions) and picks two of them each step by traced
index, so a new CF never recompiles. Each step the device computes, with the
residual r,

  g_o = g + r,   δ_min = E‖C_θmin(g_o)‖² / E‖g_o‖²,   δ_c = E‖C_θc(g_o)‖² / E‖g_o‖²

(E an EWMA, the gains agreed over workers), and sends C_θc(g_o) if δ_c ≥ ε,
else C_θmin(g_o) if δ_min ≥ ε, else g_o dense with r cleared (`choose`). This
controller, pure NumPy, takes each step's gains, what was sent and its time:

  T_sys = N·b / t_iter,   T_compression[θ_sent] = T_sys · δ_sent   (δ = 1 dense, θ = 1)

and every `window` steps runs CheckGraVAC (Algorithm 1), in this order:

  θ_s ← policy(θ_s)                 exponential θ_s², geometric base · θ_s
  θ_min ← θ_s · θ_min               if |δ_min − δ_c| ≤ ω · δ_min
  θ_c = θ_min · θ_s                 both capped at θ_max, the grid's last CF
  stop                              if the two largest T_compression are within ω

The search starts at θ_min = the grid's first CF and θ_s = base, so the
paper's exponential policy visits θ_c = 10·2, 10·4, 10·16, 10·256 → 20, 40,
160, 1000 (θ_max 1000), and the geometric one 20, 40, …, 1280, 2000 (θ_max
2000).

Worked example (exponential, θ_min 10, window 2, ω 0.01; grid 10, 20, 40,
160, 640, 1000 at indices 0–5): init θ_min 10, θ_c 20 (indices 0, 1), θ_s 2.
Two steps send θ_c with δ_c 0.895, δ_min 0.9, 64 samples in 0.5 s:
T_compression[20] = 128 · 0.895 = 114.56. The check: θ_s = 4; the gains are
within 1% (0.005 ≤ 0.009), so θ_min = 40 and θ_c = 160 (indices 2, 3); one CF
measured, no stop. Two steps at θ_c with δ_c 0.8, δ_min 0.9: θ_s = 16, no
raise, θ_c = 640 (index 4).

Readings of the paper, after the check in research/ALGORITHMS.md §4.2:

- Grid: the closure of every CF the policy reaches from θ_min, raises included,
  capped at θ_max; for the exponential policy that adds 640 = 40 · 16 to the
  paper's list (θ_min raised to 40 at the first check, then θ_s = 16).
- A coarser grid given to `gravac` rounds each target CF up to the nearest
  grid CF not below it (the paper's 10, 20, 40, 160, 1000 sends 1000 for 640).
- θ_min is raised to θ_s · θ_min with the θ_s just scaled (Algorithm 1's line
  order), not to the CF just evaluated (the text).
- The raise and the stop rule read the gains of the window's last step, the
  device's EWMAs (the text's ratio of two EWMAs, §4.1).
- θ_ideal is the lower CF of the two largest T_compression (the text), not
  the CF of the second-largest value (Algorithm 1, line 38) nor the higher CF
  (the authors' code); equal T go to the lower CF.
- θ_ideal below θ_min (dense included) is read as θ_min: Algorithm 1 never
  lowers θ_min, and the device's candidates are grid CFs.
- The search stops at θ_ideal (the code's `searchCF = False`): later checks
  change nothing. Algorithm 1 keeps checking, which would scale θ_s past
  θ_ideal at the next window. Scale-down still happens every step through ε.
- Time: `step_s` is the step's whole t_iter as the caller models it, charged to
  the CF sent (Algorithm 1 charges t_min + t_c on either compressed branch and
  no compression on the dense one); T_compression keeps the latest value per
  CF, never an average.
- The checks run at update calls window, 2·window, … from `init`; the stop rule
  needs two measured CFs.
- One δ_min and one δ_c, as Algorithm 1 has: each E‖C(g_o)‖² is one EWMA, fed
  the θ_min (θ_c) in force at each step and carried on when a check changes
  θ_min (θ_c), so a new CF's first gains enter the average its predecessor
  built (`jaxdist.control.ratio.gravac_control`). The authors' code does the
  same: one tracker of the current CF's norm, made once before training and
  never reset when the CF changes (sahiltyagi4/GraVAC,
  gravac_py3/run/compression_throughput.py, lines 178–180, 229–233, 311, 327–330),
  its gain a ratio of two moving averages, as here (a pandas EWM over the
  last 25 steps there, a plain EWMA here).

Reference: Tyagi & Swany. GraVAC: Adaptive Compression for Communication-
Efficient Distributed DL Training. IEEE CLOUD 2023, pp. 319–329.
https://arxiv.org/abs/2305.12201
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

POLICIES = ('exponential', 'geometric')
DENSE = -1
"""The `sent` index of a dense step (CF 1, δ = 1); its T_compression slot is the last."""

_RTOL = 1e-9  # CFs equal within it are one CF (products of floats)


def _check_policy(policy: str, base: float) -> None:
  if policy not in POLICIES:
    raise ValueError(f'policy must be one of {POLICIES}, got {policy!r}')
  if not (math.isfinite(base) and base > 1):
    raise ValueError(f'base must be finite and > 1, got {base}')


def _scale(policy: str, base: float, scale: float, theta_max: float) -> float:
  """The policy's next θ_s, capped at θ_max (θ_min ≥ 1, so a larger θ_s caps θ_c anyway)."""
  new = scale * scale if policy == 'exponential' else base * scale
  return min(new, theta_max)


def candidate_factors(
  theta_min: float = 10,
  theta_max: float = 1000,
  policy: str = 'exponential',
  *,
  base: float = 2.0,
) -> tuple[float, ...]:
  """Every CF the policy can visit from `theta_min`, ascending: the grid the device compiles.

  θ_s starts at `base` and scales by `policy` at each check; the candidate is
  min(θ_min · θ_s, θ_max), and a check may raise θ_min to min(θ_s · θ_min,
  θ_max). The grid is θ_min and every candidate over all raise / no-raise
  sequences (the stop rule only picks CFs already measured).

  Args:
    theta_min: the first floor CF (>= 1), the paper's 10x.
    theta_max: the largest CF (>= theta_min), the paper's 1000x (exponential)
      or 2000x (geometric).
    policy: 'exponential' (θ_s = base^1, base^2, base^4, …) or 'geometric'
      (θ_s = base, base², base³, …).
    base: the policy's first θ_s (> 1); the paper's 2.

  Returns:
    The CFs, ascending, each once.

  Example:
    >>> candidate_factors()  # the paper's 10, 20, 40, 160, 1000, and 640 = 40 · 16
    (10.0, 20.0, 40.0, 160.0, 640.0, 1000.0)
    >>> candidate_factors(10, 2000, 'geometric')
    (10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2000.0)
  """
  _check_policy(policy, base)
  if not (math.isfinite(theta_min) and theta_min >= 1):
    raise ValueError(f'theta_min must be finite and >= 1, got {theta_min}')
  if not (math.isfinite(theta_max) and theta_max >= theta_min):
    raise ValueError(f'theta_max must be finite and >= theta_min ({theta_min}), got {theta_max}')
  theta_min, theta_max, base = float(theta_min), float(theta_max), float(base)
  # Every CF is θ_min · base^e: θ_s = base^s, exponential s ← 2s, geometric s ← s + 1, and
  # a raise adds s to θ_min's e. Exponents above `top` are capped at θ_max (`cap`).
  top = math.floor(math.log(theta_max / theta_min) / math.log(base) + 1e-9)
  cap = top + 1
  value = lambda e: theta_max if e >= cap else theta_min * base**e
  start = (0, min(1, cap))
  seen, todo, grid = {start}, [start], set()
  while todo:
    low, scale = todo.pop()
    grid.update((value(low), value(min(low + scale, cap))))
    scale = min(2 * scale if policy == 'exponential' else scale + 1, cap)
    for nxt in ((low, scale), (min(low + scale, cap), scale)):
      if nxt not in seen:
        seen.add(nxt)
        todo.append(nxt)
  grid = {theta_max if g >= theta_max * (1 - _RTOL) else g for g in grid}
  return tuple(sorted(grid))


def ratios(factors: Sequence[float]) -> tuple[float, ...]:
  """The kept fractions 1 / CF of `factors`, for the compressors.

  Example:
    >>> ratios((10, 20, 1000))
    (0.1, 0.05, 0.001)
  """
  return tuple(1.0 / float(f) for f in _factors(factors))


def _factors(factors: Sequence[float]) -> np.ndarray:
  f = np.asarray(factors, np.float64)
  if f.ndim != 1 or not f.size:
    raise ValueError(f'factors must be a non-empty vector of CFs, got shape {f.shape}')
  if not np.all(np.isfinite(f)) or f.min() < 1:
    raise ValueError(f'factors must all be finite and >= 1, got {f.tolist()}')
  if np.any(np.diff(f) <= 0):
    raise ValueError(f'factors must be strictly ascending, got {f.tolist()}')
  return f


class GraVACState(NamedTuple):
  """State of the GraVAC controller (host side; the same on every worker).

  Ints, floats, a bool and arrays only: the trainer can write it to JSON
  (`.tolist()`, NaN as null) and read it back (`np.asarray`).

  Attributes:
    min_index: grid index of θ_min, the floor CF the device compresses at.
    cand_index: grid index of θ_c, the candidate CF (>= min_index).
    scale: θ_s, the policy's scale; θ_c = min(θ_min · θ_s, θ_max) before
      rounding up to the grid (θ_ideal / θ_min once the search stopped).
    searching: False once the stop rule fixed θ_c = θ_ideal.
    t_compression: [F + 1] float, the latest T_sys · δ per grid CF, samples/s;
      the last slot is dense (CF 1); NaN where never sent.
    sent_steps: [F + 1] int, steps sent at each grid CF; the last slot dense.
    step: `update` calls so far.
  """

  min_index: int
  cand_index: int
  scale: float
  searching: bool
  t_compression: np.ndarray
  sent_steps: np.ndarray
  step: int


class GraVAC(NamedTuple):
  """A host-side controller: `init()` and `update(state, *, gain_min, gain_cand, sent, ...)`.

  Attributes:
    init: `() -> GraVACState`.
    update: `(state, *, gain_min, gain_cand, sent, step_s, samples) ->
      GraVACState`, one training step (see `gravac`).
  """

  init: Callable[[], GraVACState]
  update: Callable[..., GraVACState]


def choose(state: GraVACState, *, gain_min: float, gain_cand: float, epsilon: float = 0.7) -> int:
  """The grid index to send this step (`DENSE` = -1 for dense), Algorithm 1's branch.

  A reference for the device, which takes the same decision on its agreed
  gains: θ_c if δ_c ≥ ε, else θ_min if δ_min ≥ ε, else dense.

  Example:
    >>> state = gravac(candidate_factors()).init()
    >>> choose(state, gain_min=0.8, gain_cand=0.6), choose(state, gain_min=0.6, gain_cand=0.5)
    (0, -1)
  """
  if gain_cand >= epsilon:
    return int(state.cand_index)
  return int(state.min_index) if gain_min >= epsilon else DENSE


@dataclasses.dataclass(frozen=True, eq=False)
class _Settings:
  """`gravac`'s arguments, checked: what `init`, `update` and the check read besides the state."""

  grid: np.ndarray  # [F] the CFs, ascending
  omega: float
  window: int
  policy: str
  base: float

  @property
  def size(self) -> int:
    return self.grid.size

  @property
  def theta_max(self) -> float:
    return float(self.grid[-1])


def gravac(
  factors: Sequence[float],
  *,
  epsilon: float = 0.7,
  omega: float = 0.01,
  window: int = 500,
  policy: str = 'exponential',
  base: float = 2.0,
) -> GraVAC:
  """GraVAC's search for the CF (Tyagi & Swany, 2023, Algorithm 1), over a fixed grid.

  See the module docstring for the rule, a worked example and each reading of
  the paper.

  Args:
    factors: the grid of CFs the device compiled, strictly ascending, each
      >= 1, e.g. `candidate_factors(...)` of the same policy and base;
      θ_min starts at the first, θ_max is the last.
    epsilon: ε in (0, 1], the gain a compressed step needs (the device's
      threshold, see `choose`; checked here with the rest).
    omega: ω in (0, 1], the relative closeness of the gains (raise θ_min) and
      of the two best T_compression (stop).
    window: steps between checks (>= 1); the paper's 500 (exponential) or
      2000 (geometric).
    policy: 'exponential' (θ_s ← θ_s²) or 'geometric' (θ_s ← base · θ_s).
    base: the first θ_s (> 1); the paper's 2.

  Returns:
    `GraVAC(init, update)`. `init()` gives θ_min = factors[0] and θ_c the
    policy's first candidate. `update(state, *, gain_min, gain_cand, sent,
    step_s, samples)` records one training step: the device's agreed EWMA
    gains δ_min and δ_c, the grid index it sent (`DENSE` = -1 for dense), the
    step's modelled seconds t_iter (> 0) and the N·b samples it trained;
    every `window` calls it runs CheckGraVAC and may change `min_index` and
    `cand_index`, the indices the next steps compress at.

  Example:
    >>> ctl = gravac(candidate_factors(), window=2)
    >>> state = ctl.init()
    >>> state.min_index, state.cand_index, state.scale
    (0, 1, 2.0)
    >>> step = dict(gain_min=0.9, gain_cand=0.895, sent=1, step_s=0.5, samples=64)
    >>> state = ctl.update(ctl.update(state, **step), **step)
    >>> state.min_index, state.cand_index, state.scale  # θ_s 4, θ_min 40, θ_c 160
    (2, 3, 4.0)
    >>> float(state.t_compression[1])  # CF 20: 64 / 0.5 · 0.895
    114.56
  """
  grid = _factors(factors)
  if not (0 < epsilon <= 1):
    raise ValueError(f'epsilon must be in (0, 1], got {epsilon}')
  if not (0 < omega <= 1):
    raise ValueError(f'omega must be in (0, 1], got {omega}')
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  _check_policy(policy, base)
  settings = _Settings(grid, omega=omega, window=window, policy=policy, base=base)
  return GraVAC(functools.partial(_init, settings), functools.partial(_update, settings))


def _index(st: _Settings, target: float) -> int:
  """The grid index of the smallest CF not below `target` (<= θ_max)."""
  return int(np.searchsorted(st.grid, min(target, st.theta_max) * (1 - _RTOL), side='left'))


def _init(st: _Settings) -> GraVACState:
  scale = min(float(st.base), st.theta_max)
  return GraVACState(
    min_index=0,
    cand_index=_index(st, st.grid[0] * scale),
    scale=scale,
    searching=True,
    t_compression=np.full(st.size + 1, np.nan),
    sent_steps=np.zeros(st.size + 1, np.int64),
    step=0,
  )


def _check(st: _Settings, state: GraVACState, gain_min: float, gain_cand: float) -> GraVACState:
  """CheckGraVAC: scale θ_s, maybe raise θ_min, maybe stop at θ_ideal."""
  grid, size, omega = st.grid, st.size, st.omega
  scale = _scale(st.policy, st.base, float(state.scale), st.theta_max)
  low = int(state.min_index)
  if abs(gain_min - gain_cand) <= omega * gain_min:
    low = _index(st, scale * grid[low])
  cand = _index(st, grid[low] * scale)
  t = np.asarray(state.t_compression, np.float64)
  measured = np.flatnonzero(~np.isnan(t))  # grid indices ascending, then dense
  if measured.size >= 2:
    cf = np.where(measured == size, 1.0, grid[np.minimum(measured, size - 1)])
    order = np.lexsort((cf, -t[measured]))  # largest T first; equal T: lower CF first
    best, second = t[measured[order[0]]], t[measured[order[1]]]
    if best - second <= omega * second:
      ideal = float(min(cf[order[0]], cf[order[1]]))
      cand = max(_index(st, ideal), low) if ideal > 1 else low
      return state._replace(
        min_index=low, cand_index=cand, scale=float(grid[cand] / grid[low]), searching=False
      )
  return state._replace(min_index=low, cand_index=cand, scale=scale)


def _update(
  st: _Settings,
  state: GraVACState,
  *,
  gain_min: float,
  gain_cand: float,
  sent: int,
  step_s: float,
  samples: float,
) -> GraVACState:
  size = st.size
  if np.shape(state.t_compression) != (size + 1,):
    raise ValueError(
      f'state must be for a grid of {size} CFs (t_compression of shape ({size + 1},)), '
      f'got shape {np.shape(state.t_compression)}'
    )
  for name, gain in (('gain_min', gain_min), ('gain_cand', gain_cand)):
    if not (math.isfinite(gain) and gain >= 0):
      raise ValueError(f'{name} must be finite and >= 0, got {gain}')
  if not (math.isfinite(step_s) and step_s > 0):
    raise ValueError(f'step_s must be finite and > 0 seconds, got {step_s}')
  if not (math.isfinite(samples) and samples > 0):
    raise ValueError(f'samples must be finite and > 0, got {samples}')
  low, cand = int(state.min_index), int(state.cand_index)
  if sent not in (DENSE, low, cand):
    raise ValueError(
      f'sent must be the candidate index {cand}, the floor index {low} or {DENSE} (dense), '
      f'got {sent}'
    )
  slot = size if sent == DENSE else int(sent)
  gain = 1.0 if sent == DENSE else (gain_cand if sent == cand else gain_min)
  t = np.array(state.t_compression, np.float64)
  t[slot] = samples / step_s * gain
  counts = np.array(state.sent_steps, np.int64)
  counts[slot] += 1
  step = int(state.step) + 1
  state = state._replace(t_compression=t, sent_steps=counts, step=step)
  if state.searching and step % st.window == 0:
    state = _check(st, state, float(gain_min), float(gain_cand))
  return state
