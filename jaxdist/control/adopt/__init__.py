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

The package: `fit` (the two curves), `choice` (NSGA-II and ASF: `solve`), `price`
(`comm_ms`), `controller` (`adopt`, its state and phases). Every public name
is importable from here, e.g. `from jaxdist.control.adopt import solve`.
"""

from jaxdist.control.adopt.choice import (
  CANDIDATES,
  GENERATIONS,
  OFFSPRING,
  POP_SIZE,
  Solution,
  solve,
)
from jaxdist.control.adopt.controller import ADOPT, PHASES, AdoptState, adopt, smoothed
from jaxdist.control.adopt.fit import Fit, fit_comm_time, fit_gain
from jaxdist.control.adopt.price import CommCost, comm_ms

__all__ = [
  'ADOPT',
  'CANDIDATES',
  'GENERATIONS',
  'OFFSPRING',
  'PHASES',
  'POP_SIZE',
  'AdoptState',
  'CommCost',
  'Fit',
  'Solution',
  'adopt',
  'comm_ms',
  'fit_comm_time',
  'fit_gain',
  'smoothed',
  'solve',
]
