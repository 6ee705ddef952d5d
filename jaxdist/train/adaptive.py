"""Host-side controllers that choose each step's compression ratio (`config.adaptive`).

Built from the config by `jaxdist.train.factory.controls`.

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
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from jaxdist import control, netmodel
from jaxdist.control.ewma import ewma
from jaxdist.control.gravac import DENSE, choose
from jaxdist.train import checkpoint


class RatioControl:
  """The candidate of the steps to come, and what the records say about it.

  Args:
    ratios: the compiled candidates; index len(ratios) is dense.
    num_workers: K.
    first: the index of the first steps.
  """

  def __init__(self, ratios: tuple[float, ...], num_workers: int, first: int):
    self.ratios, self.k = ratios, num_workers
    self.dense = len(ratios)
    self.index = first
    self.used: collections.OrderedDict[int, int] = collections.OrderedDict()
    self.compressed = self.steps = 0

  def args(self) -> dict[str, np.ndarray]:
    """The chain's extra arguments for the next step: the candidate, one per worker."""
    return {'candidate': np.full(self.k, self.index, np.int32)}

  def tx_args(self, t: int) -> dict[str, np.ndarray]:
    """Step t's extra arguments (`args`), remembered for its record."""
    self.used[t + 1] = self.index  # records are numbered from 1
    while len(self.used) > 8:
      self.used.popitem(last=False)
    return self.args()

  def candidate_of(self, step: int) -> int:
    """The candidate step `step` (1-based, one of the last eight) ran."""
    return self.used.get(step, self.index)

  def action(self) -> str | None:
    """What the trainer does to the train state before the next step: None, 'snapshot'
    (keep a copy) or 'restore' (go back to the copy; drop it unless `exploring`)."""
    return None

  @property
  def exploring(self) -> bool:
    """Whether the next steps will be undone (the trainer keeps its copy of the state)."""
    return False

  def observe(self, record: dict[str, Any], fetched: dict[str, Any]) -> dict[str, Any]:
    """Takes one step's record and fetched metrics; returns fields for the record."""
    used = self.candidate_of(record['step'])
    self.steps += 1
    self.compressed += used != self.dense
    gains = np.asarray(fetched['gains'])
    self.decide(record, np.asarray(fetched['norms']), gains, used)
    ratio = 1.0 if used == self.dense else self.ratios[used]
    gain = 1.0 if used == self.dense else float(gains[:, used].mean())
    return {'ratio': ratio, 'gain': gain}

  def decide(self, record, norms: np.ndarray, gains: np.ndarray, used: int) -> None:
    raise NotImplementedError

  def summary(self) -> dict[str, Any]:
    return {'compressed_fraction': self.compressed / self.steps if self.steps else None}

  def to_json(self) -> dict[str, Any]:
    return {'index': self.index, 'compressed': self.compressed, 'steps': self.steps}

  def restore(self, saved: dict[str, Any]) -> None:
    if saved:
      self.index, self.compressed, self.steps = saved['index'], saved['compressed'], saved['steps']


class GraVACControl(RatioControl):
  """GraVAC: ε against smoothed gains every step, CheckGraVAC every window (module docstring).

  δ_min and δ_c are one moving average each, as Algorithm 1's: `ewma` holds the
  EWMAs of the workers' mean ‖C_θmin(w)‖², ‖C_θc(w)‖² and ‖w‖², each step fed
  the θ_min and θ_c in force at that step, and carried on when a check changes
  θ_min or θ_c (the new CF's gains enter the average its predecessor built).
  """

  def __init__(
    self, ratios, num_workers: int, network: str, *, theta_min: float, theta_max: float,
    policy: str, epsilon: float, omega: float, window: int, decay: float, samples: int,
  ):  # fmt: skip
    if not 0.0 <= decay < 1.0:
      raise ValueError(f'decay must be in [0, 1), got {decay}')
    factors = control.candidate_factors(theta_min, theta_max, policy)
    self.ctl = control.gravac(factors, epsilon=epsilon, omega=omega, window=window, policy=policy)
    self.state = self.ctl.init()
    self.epsilon, self.decay, self.network = epsilon, decay, network
    self.samples = samples  # the global batch: GraVAC's throughput counts samples
    self.ewma = None  # [3] float64: E mean ‖C_θmin(w)‖², E mean ‖C_θc(w)‖², E mean ‖w‖²
    super().__init__(ratios, num_workers, self.state.min_index)

  @property
  def gains(self) -> tuple[float, float]:
    """(δ_min, δ_c): the EWMAs of ‖C_θmin(w)‖² and ‖C_θc(w)‖² over that of ‖w‖² (1 if 0)."""
    if self.ewma is None or not self.ewma[2] > 0:
      return 1.0, 1.0
    return float(self.ewma[0] / self.ewma[2]), float(self.ewma[1] / self.ewma[2])

  def decide(self, record, norms, gains, used) -> None:
    s = self.state
    sent = DENSE if used == self.dense else used
    if sent not in (DENSE, s.min_index, s.cand_index):  # cannot happen: decided last step
      raise AssertionError(f'GraVAC sent grid index {sent}, neither θ_min, θ_c nor dense')
    total = norms[:, 0].astype(np.float64)  # float64, as a checkpoint restores it
    kept = (gains * total[:, None]).mean(0)  # per candidate: the workers' mean ‖C_r(w)‖²
    new = np.array([kept[s.min_index], kept[s.cand_index], total.mean()])
    self.ewma = ewma(self.ewma, new, self.decay)
    gain_min, gain_cand = self.gains
    self.state = self.ctl.update(
      s, gain_min=gain_min, gain_cand=gain_cand, sent=sent,
      step_s=float(record[f'modelled_s@{self.network}']), samples=self.samples,
    )  # fmt: skip
    choice = choose(self.state, gain_min=gain_min, gain_cand=gain_cand, epsilon=self.epsilon)
    self.index = self.dense if choice == DENSE else choice

  def to_json(self) -> dict[str, Any]:
    ewma = None if self.ewma is None else self.ewma.tolist()
    return {**super().to_json(), 'gravac': checkpoint.state_to_json(self.state), 'ewma': ewma}

  def restore(self, saved: dict[str, Any]) -> None:
    if not saved:
      return
    super().restore(saved)
    self.state = checkpoint.state_from_json(self.state, saved['gravac'])
    ewma = saved.get('ewma')
    if 'ewma' not in saved and saved.get('sums') is not None:
      # a checkpoint that kept an EWMA of every candidate's ‖C_r(w)‖² (then ‖w‖², last):
      # θ_min's and θ_c's carry on
      sums = saved['sums']
      ewma = [sums[self.state.min_index], sums[self.state.cand_index], sums[-1]]
    self.ewma = None if ewma is None else np.asarray(ewma, np.float64)


class ScaDLESControl(RatioControl):
  """ScaDLES's compress-or-not rule (`jd.control.scadles_compression`): Top-k or dense."""

  def __init__(self, ratios, num_workers: int, *, delta: float, decay: float):
    self.rule = control.scadles_compression(num_workers, delta=delta, decay=decay)
    self.state = self.rule.init()
    super().__init__(ratios, num_workers, len(ratios))

  def decide(self, record, norms, gains, used) -> None:
    del record, used
    self.state, compress = self.rule.update(self.state, norms[:, 0], gains[:, 0])
    self.index = 0 if compress else self.dense

  def to_json(self) -> dict[str, Any]:
    sums = self.state.sums
    return {**super().to_json(), 'sums': None if np.isnan(sums).all() else sums.tolist()}

  def restore(self, saved: dict[str, Any]) -> None:
    if saved:
      super().restore(saved)
      if saved['sums'] is not None:
        self.state = control.ScaDLESState(np.asarray(saved['sums'], np.float64))


class AdoptControl(RatioControl):
  """ADOPT: explore every candidate, fit, and choose by NSGA-II + ASF (module docstring)."""

  COLLECTIVES = ('allgather', 'allreduce')  # `via`'s indices for Top-k

  def __init__(
    self, ratios, num_workers: int, network, *, num_params: int, warmup_steps: int,
    explore_steps: int, gain_threshold: float, window: int, smoothing: float,
    weights: tuple[float, ...], seed: int, algorithms: tuple[str, ...], leader: str,
  ):  # fmt: skip
    """The arguments after `network` are `jd.control.adopt`'s."""
    self.ctl = control.adopt(
      ratios, num_params=num_params, num_workers=num_workers, warmup_steps=warmup_steps,
      explore_steps=explore_steps, gain_threshold=gain_threshold, window=window,
      smoothing=smoothing, weights=weights, seed=seed, algorithms=algorithms, leader=leader,
    )  # fmt: skip
    self.network = network
    self.state = self.ctl.init(netmodel.network_at(network, 0))
    self.via_used: collections.OrderedDict[int, int] = collections.OrderedDict()
    super().__init__(ratios, num_workers, self.state.index)

  @property
  def via(self) -> int:
    return self.COLLECTIVES.index(self.state.collective)

  def args(self) -> dict[str, np.ndarray]:
    return {**super().args(), 'via': np.full(self.k, self.via, np.int32)}

  def tx_args(self, t: int) -> dict[str, np.ndarray]:
    self.via_used[t + 1] = self.via
    while len(self.via_used) > 8:
      self.via_used.popitem(last=False)
    return super().tx_args(t)

  def action(self) -> str | None:
    return 'snapshot' if self.state.snapshot else 'restore' if self.state.restore else None

  @property
  def exploring(self) -> bool:
    return self.state.phase == 'explore'

  def observe(self, record, fetched) -> dict[str, Any]:
    phase = self.state.phase  # the phase the step ran in
    via = self.via_used.get(record['step'], self.via)
    out = super().observe(record, fetched)
    return {**out, 'collective': self.COLLECTIVES[via], 'phase': phase}

  def decide(self, record, norms, gains, used) -> None:
    del norms
    gain = float(np.sqrt(gains[:, used].astype(np.float64)).mean())  # ‖C(w)‖ / ‖w‖
    ran_on = netmodel.network_at(self.network, record['step'] - 1)  # the step that ran
    self.state = self.ctl.update(self.state, gain=gain, network=ran_on)
    self.index = self.state.index

  def summary(self) -> dict[str, Any]:
    s = self.state
    return {**super().summary(), 'explorations': s.explorations, 'solves': s.solves}

  def to_json(self) -> dict[str, Any]:
    return {**super().to_json(), 'adopt': checkpoint.state_to_json(self.state)}

  def restore(self, saved: dict[str, Any]) -> None:
    if saved:
      super().restore(saved)
      self.state = checkpoint.state_from_json(self.state, saved['adopt'])
