"""Host controllers that choose each step's compression ratio: GraVAC, ScaDLES's rule, ADOPT.

`compressed_allreduce(ratios=...)` compiles every candidate ratio and a dense
all-reduce as branches of one `lax.switch`, takes the branch index as optax's
extra argument `candidate`, and reports each worker's gain of every candidate
(`CompressedState.gains`, exact Top-k: ‖Top-k_r(w)‖² / ‖w‖²) and ‖w‖²
(`norms`). A controller here reads those from the fetched step metrics and
sets the candidate of the steps to come:

- 'gravac' (Tyagi & Swany, CLOUD 2023; `jd.control.gravac`): the gains of
  θ_min and θ_c, smoothed as a ratio of two EWMAs of the workers' mean
  ‖C(w)‖² and ‖w‖² (one δ_min and one δ_c, as Algorithm 1's, carried on when
  θ_min or θ_c changes), choose θ_c, θ_min or dense against ε each step, and
  every `window` steps CheckGraVAC scales the candidate with the modelled
  step time (the first network profile's `modelled_s`).
- 'scadles' (Tyagi & Swany, BigData 2022, §IV-D): send Top-k(w) iff
  |‖w‖² − ‖Top-k(w)‖²| / ‖w‖² ≤ δ, each worker on its own EWMAs of the two
  squared norms (the paper's), by majority vote (more than half the workers;
  the authors' code lets half suffice); otherwise dense, which empties the
  residual (the paper has no error feedback; the code keeps updating it on
  dense steps). Starts dense. The fraction of compressed steps is the CNC
  ratio of the summary.

- 'adopt' (Tyagi & Swany, BigData 2023; `jd.control.adopt`): after
  `adopt.warmup_steps`, every candidate runs `explore_steps` steps from the
  same in-memory copy of the train state, which the trainer saves and
  restores (`action`); the measured gains (‖C(w)‖ / ‖w‖, the workers' mean)
  and the ratio's modelled communication on the network in force are fitted,
  and NSGA-II with ASF picks the ratio and the all-gather/AR-Top-k choice
  again whenever the network (α, β) changes, or explores again when the
  gain drifts. Needs `collective='auto'` (both collectives compiled) and
  Top-k. The network is the first profile's (e.g. the schedule
  'adopt_c1@50'), read at the step that ran: a change is seen one step late,
  as a measurement would. Exploration steps are training steps (their data
  and time count; their updates are undone).

Departure from all three papers: the decision for a step is taken on the host
from the gains up to the step before (the trainer then fetches each step's
metrics before the next starts, which it otherwise does one step late); the
papers decide within the step, on its own gradient. The EWMAs make the
difference one step of smoothing. Evaluations and checkpoints that fall
inside an ADOPT exploration wait for its end (the trainer never saves or
scores a model the exploration will undo); a run that ends mid-exploration
ends on the saved state.

Each is a `jd.control.host.Controller`: its state is a `RatioState` whose
`inner` field is its rule's state; `plan` gives the chain's `candidate` (and
ADOPT's `via`) for every worker, and `observe` reads the candidate the step
ran from the record's plan and its gains from the fetched metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxdist import netmodel
from jaxdist.control.adopt import adopt
from jaxdist.control.ewma import ewma
from jaxdist.control.gravac import DENSE, candidate_factors, choose, gravac
from jaxdist.control.host import Controller, Plan, Record
from jaxdist.control.scadles import scadles_compression


class RatioState(NamedTuple):
  """State of a ratio controller.

  Attributes:
    index: the candidate of the steps to come (len(ratios): dense).
    compressed: steps observed that sent a candidate, not dense.
    steps: steps observed.
    inner: the rule's state.
  """

  index: int
  compressed: int
  steps: int
  inner: Any


class GraVACInner(NamedTuple):
  gravac: Any  # `jd.control.GraVACState`
  ewma: np.ndarray  # [3] float64: E mean ‖C_θmin(w)‖², E mean ‖C_θc(w)‖², E mean ‖w‖² (NaN: none)


# decide(inner, record, norms [K, 2], gains [K, candidates], used) -> (inner, next index)
Decide = Callable[[Any, Record, np.ndarray, np.ndarray, int], tuple[Any, int]]


def _controller(
  ratios: Sequence[float], num_workers: int, first: Callable[[Any], int], init_inner,
  decide: Decide, *, via: Callable[[Any], int] | None = None, fields=None, summary=None,
  explore=None,
) -> Controller:  # fmt: skip
  """The bookkeeping every ratio controller shares, around its rule."""
  dense = len(ratios)

  def init() -> RatioState:
    inner = init_inner()
    return RatioState(first(inner), 0, 0, inner)

  def plan(state: RatioState, t: int) -> Plan:
    args = {'candidate': np.full(num_workers, state.index, np.int32)}
    if via is not None:
      args['via'] = np.full(num_workers, via(state.inner), np.int32)
    snapshot, restore, exploring = explore(state.inner) if explore else (False, False, False)
    return Plan(tx_args=args, snapshot=snapshot, restore=restore, exploring=exploring,
                needs_last=True)  # fmt: skip

  def observe(state: RatioState, record: Record) -> tuple[RatioState, dict[str, Any]]:
    used = int(record.plan.tx_args['candidate'][0])
    gains = np.asarray(record.fetched['gains'])
    norms = np.asarray(record.fetched['norms'])
    extra = fields(state.inner, record) if fields else {}
    inner, index = decide(state.inner, record, norms, gains, used)
    state = RatioState(index, state.compressed + (used != dense), state.steps + 1, inner)
    ratio = 1.0 if used == dense else ratios[used]
    gain = 1.0 if used == dense else float(gains[:, used].mean())
    return state, {'ratio': ratio, 'gain': gain, **extra}

  def summarize(state: RatioState) -> dict[str, Any]:
    fraction = state.compressed / state.steps if state.steps else None
    return {'compressed_fraction': fraction, **(summary(state.inner) if summary else {})}

  return Controller(init, plan, observe, summarize)


def gravac_control(
  ratios: Sequence[float], num_workers: int, network: str, *, theta_min: float,
  theta_max: float, policy: str, epsilon: float, omega: float, window: int, decay: float,
  samples: int,
) -> Controller:  # fmt: skip
  """GraVAC: ε against smoothed gains every step, CheckGraVAC every window.

  δ_min and δ_c are one moving average each, as Algorithm 1's: `ewma` holds
  the EWMAs of the workers' mean ‖C_θmin(w)‖², ‖C_θc(w)‖² and ‖w‖², each step
  fed the θ_min and θ_c in force at that step, and carried on when a check
  changes θ_min or θ_c (the new CF's gains enter the average its predecessor
  built). `samples` is the global batch (GraVAC's throughput counts samples);
  `network` names the profile whose `modelled_s` times each factor.

  Args:
    ratios: the chain's candidate ratios, one per CF of
      `candidate_factors(theta_min, theta_max, policy)` (as 1/CF).
    num_workers: K.
    network: the network profile's name (the log's `modelled_s@<name>`).
    theta_min: the first floor CF (`jd.control.candidate_factors`).
    theta_max: the largest CF.
    policy: 'exponential' or 'geometric'.
    epsilon: ε, the gain a compressed step needs (`jd.control.gravac`).
    omega: ω, the relative closeness of gains and of times.
    window: steps between checks.
    decay: the EWMAs' decay, in [0, 1).
    samples: the global batch, in examples.

  Returns:
    A `Controller` whose state is a `RatioState`.
  """
  if not 0.0 <= decay < 1.0:
    raise ValueError(f'decay must be in [0, 1), got {decay}')
  factors = candidate_factors(theta_min, theta_max, policy)
  ctl = gravac(factors, epsilon=epsilon, omega=omega, window=window, policy=policy)

  def init_inner() -> GraVACInner:
    return GraVACInner(ctl.init(), np.full(3, np.nan))

  def decide(inner: GraVACInner, record: Record, norms, gains, used) -> tuple[GraVACInner, int]:
    s = inner.gravac
    sent = DENSE if used == len(ratios) else used
    if sent not in (DENSE, s.min_index, s.cand_index):  # cannot happen: decided last step
      raise AssertionError(f'GraVAC sent grid index {sent}, neither θ_min, θ_c nor dense')
    total = norms[:, 0].astype(np.float64)  # float64, as a checkpoint restores it
    kept = (gains * total[:, None]).mean(0)  # per candidate: the workers' mean ‖C_r(w)‖²
    smoothed = ewma(inner.ewma, np.array([kept[s.min_index], kept[s.cand_index], total.mean()]),
                    decay)  # fmt: skip
    gain_min, gain_cand = smoothed_gains(smoothed)
    s = ctl.update(
      s, gain_min=gain_min, gain_cand=gain_cand, sent=sent,
      step_s=float(record.fields[f'modelled_s@{network}']), samples=samples,
    )  # fmt: skip
    choice = choose(s, gain_min=gain_min, gain_cand=gain_cand, epsilon=epsilon)
    return GraVACInner(s, smoothed), len(ratios) if choice == DENSE else choice

  return _controller(ratios, num_workers, lambda inner: inner.gravac.min_index, init_inner, decide)


def smoothed_gains(smoothed: np.ndarray) -> tuple[float, float]:
  """(δ_min, δ_c): GraVAC's EWMAs of ‖C_θmin(w)‖² and ‖C_θc(w)‖² over that of ‖w‖² (1 if 0)."""
  if not smoothed[2] > 0:  # NaN (nothing seen) or 0
    return 1.0, 1.0
  return float(smoothed[0] / smoothed[2]), float(smoothed[1] / smoothed[2])


def scadles_control(
  ratios: Sequence[float], num_workers: int, *, delta: float, decay: float
) -> Controller:
  """ScaDLES's compress-or-not rule (`jd.control.scadles_compression`): Top-k or dense.

  Starts dense.

  Args:
    ratios: the chain's candidate ratios; the first is the Top-k sent.
    num_workers: K.
    delta: δ, as `scadles_compression`'s.
    decay: the EWMAs' decay, as `scadles_compression`'s.

  Returns:
    A `Controller` whose state is a `RatioState`.
  """
  rule = scadles_compression(num_workers, delta=delta, decay=decay)

  def decide(inner, record, norms, gains, used):
    inner, compress = rule.update(inner, norms[:, 0], gains[:, 0])
    return inner, 0 if compress else len(ratios)

  return _controller(ratios, num_workers, lambda inner: len(ratios), rule.init, decide)


COLLECTIVES = ('allgather', 'allreduce')  # ADOPT's `via` indices for Top-k


def adopt_control(
  ratios: Sequence[float], num_workers: int, network, *, num_params: int, warmup_steps: int,
  explore_steps: int, gain_threshold: float, window: int, smoothing: float,
  weights: Sequence[float], seed: int, algorithms: Sequence[str], leader: str,
) -> Controller:  # fmt: skip
  """ADOPT: explore every candidate, fit, and choose by NSGA-II + ASF (the module docstring).

  Args:
    ratios: the chain's candidate ratios, `jd.control.adopt`'s `candidates`.
    num_workers: N.
    network: the profile or schedule in force (`netmodel.network_at`).
    num_params: M, elements of the fused gradient.
    warmup_steps: steps before the first exploration.
    explore_steps: steps per candidate in an exploration.
    gain_threshold: the smoothed relative gain change that re-explores.
    window: values in the windowed EWMAs.
    smoothing: their α.
    weights: ASF weights of (comm time, gain).
    seed: NSGA-II's seed.
    algorithms: all-reduce algorithms the cost model may price.
    leader: AR-Top-k's leader rule, for pricing.

  Returns:
    A `Controller` whose state is a `RatioState`; its plan sets `candidate`
    and `via` (the collective).
  """
  ctl = adopt(
    ratios, num_params=num_params, num_workers=num_workers, warmup_steps=warmup_steps,
    explore_steps=explore_steps, gain_threshold=gain_threshold, window=window,
    smoothing=smoothing, weights=weights, seed=seed, algorithms=algorithms, leader=leader,
  )  # fmt: skip

  def decide(inner, record, norms, gains, used):
    gain = float(np.sqrt(gains[:, used].astype(np.float64)).mean())  # ‖C(w)‖ / ‖w‖
    ran_on = netmodel.network_at(network, record.step - 1)  # the step that ran
    inner = ctl.update(inner, gain=gain, network=ran_on)
    return inner, inner.index

  def fields(inner, record):  # the phase the step ran in, and its collective
    via = int(record.plan.tx_args['via'][0])
    return {'collective': COLLECTIVES[via], 'phase': inner.phase}

  return _controller(
    ratios, num_workers, lambda inner: inner.index,
    lambda: ctl.init(netmodel.network_at(network, 0)), decide,
    via=lambda inner: COLLECTIVES.index(inner.collective), fields=fields,
    summary=lambda s: {'explorations': s.explorations, 'solves': s.solves},
    explore=lambda s: (bool(s.snapshot), bool(s.restore), s.phase == 'explore'),
  )  # fmt: skip
