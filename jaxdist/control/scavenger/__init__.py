"""Scavenger: the cloud configuration (K, B) by time and cost models (Tyagi & Sharma, 2023).

Host-side and pure NumPy/SciPy: short profiling runs measure step times and
the gradient noise; affine models fitted to them predict, for every number of
workers K and global batch B = K·b, the time and the cost to train to a
target; a search lists the predictions and `choose` picks one.

- `noise` (Eq. 2): the meter of the gradient noise γ, the normalised γ/K
  the models use, and McCandlish's simple noise scale.
- `model` (Eqs. 3–10): the affine time, noise and epoch models and their
  least-squares fit; `Model.predict` gives the time and cost of a (K, B).
- `search`: the full and partial searches over (K, B), the Pareto front and
  the choice by time, cost or knee under caps.
- `pipeline`: a job planned in four steps (profile, train to the target, fit
  and choose, train the choice), the training given as a `measure` callable
  (`plan_job`).

Departures from the paper, after the check in research/ALGORITHMS.md §5:

- The paper's "∝" in Eqs. 7–10 are fitted here as affine models with an
  intercept (its own Fig. 9, γ/K ≈ 0.7 at 1/√B ≈ 0.045, is not a line through
  the origin); the noise in Eqs. 6–7 is the normalised γ/K.
- Partial search needs profiles at two K at least (an intercept and a slope
  of sync_s), two per-worker batches b and two B; the paper's partial search
  profiles (K_min, B_min) and (K_min, B_max) only and then "adds more VMs".
  `fit` says which is missing.
- The knee: the paper finds knees per batch size over K. Here it is the
  knee of the Pareto front of the feasible (T, C) points (x = T ascending,
  C decreasing and convex), by `kneed.KneeLocator` (Kneedle: normalise both
  to [0, 1], difference curve D = (1 − C) − T; kneed returns the first local
  maximum of D that D later falls below by S = 1 mean x-spacing). When kneed
  finds none (a front of two points, or one that never flattens) the plain
  argmax of D is taken, with a warning.
- n = e·D/B is not rounded up to whole steps.
- Not implemented: the memory-priced cost (Fig. 12, C ∝ B·T) and the no-search
  mode (a stored model of a similar job).

Reference: Tyagi & Sharma. Scavenger: A Cloud Service For Optimizing Cost and
Performance of ML Training. IEEE/ACM CCGrid 2023, pp. 403–413.
https://arxiv.org/abs/2303.06659
McCandlish, Kaplan, Amodei et al. An Empirical Model of Large-Batch Training.
https://arxiv.org/abs/1812.06162
"""

from jaxdist.control.scavenger import model, noise, pipeline, search
from jaxdist.control.scavenger.model import (
  SECONDS_PER_HOUR,
  Model,
  Prediction,
  Profile,
  TargetRun,
  fit,
  fit_epochs,
  fit_noise,
)
from jaxdist.control.scavenger.noise import (
  NoiseMeter,
  NoiseMeterState,
  gamma,
  gamma_normalized,
  noise_meter,
  noise_terms,
  simple_noise_scale,
)
from jaxdist.control.scavenger.pipeline import (
  EPOCH_NOISE,
  SEARCHES,
  JobPlan,
  Measure,
  Measurement,
  PlanError,
  plan_job,
)
from jaxdist.control.scavenger.search import (
  OBJECTIVES,
  choose,
  full_search,
  knee,
  pareto_front,
  partial_search,
)

__all__ = [
  'EPOCH_NOISE',
  'OBJECTIVES',
  'SEARCHES',
  'SECONDS_PER_HOUR',
  'JobPlan',
  'Measure',
  'Measurement',
  'Model',
  'NoiseMeter',
  'NoiseMeterState',
  'PlanError',
  'Prediction',
  'Profile',
  'TargetRun',
  'choose',
  'fit',
  'fit_epochs',
  'fit_noise',
  'full_search',
  'gamma',
  'gamma_normalized',
  'knee',
  'model',
  'noise',
  'noise_meter',
  'noise_terms',
  'pareto_front',
  'partial_search',
  'pipeline',
  'plan_job',
  'search',
  'simple_noise_scale',
]
