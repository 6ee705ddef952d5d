"""What each step sent and what it would cost: the communication ledger, and the run's summary.

The optimizer state holds a `comm.Transfer` for every collective the chain
may issue; the train step reports how many times each ran. The ledger turns
those counts into bytes per worker and into the modelled time of the step
on each network profile (α-β cost; transfers that overlap the next step's
compute are charged only beyond it). A transfer over one kind of link
(`Transfer.link`, hierarchical Top-k's) is priced among the workers it
spans on that link's network: a node's over the intra-node one, a rail's
over the profile at its share of the NIC (`netmodel.Hierarchy`). `summarize` reduces the per-step
records of a run to one row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxdist import comm, netmodel

FLAG_BYTES = 64  # collectives this small agree flags or scalars; they carry no model data


class Ledger:
  """Prices the transfers of each step.

  Args:
    transfers: every `Transfer` of the optimizer state, in tree order.
    num_workers: N, all the workers; a collective without a `link` spans
      them all.
    networks: profile name -> network (or schedule) to price against: the
      inter-node network where the workers sit on nodes.
    algorithm: the all-reduce algorithm ('ring', 'tree', 'ps').
    compute_s: one worker's step without communication (the compute term).
    hierarchy: the nodes the workers sit on (n nodes of m workers, the
      intra-node network, whether rails share a NIC); needed to price
      transfers over an 'intra' or 'inter' link (N = m on the intra-node
      network, N = n on the profile at bandwidth/m when the NIC is shared).
      Transfers without a link are priced as without it, bit for bit.
  """

  def __init__(
    self,
    transfers: Sequence[comm.Transfer],
    num_workers: int,
    networks: Mapping[str, netmodel.Network | netmodel.Schedule],
    algorithm: str,
    compute_s: float,
    *,
    hierarchy: netmodel.Hierarchy | None = None,
  ):
    self.transfers = list(transfers)
    self.n = num_workers
    self.networks = dict(networks)
    self.algorithm = algorithm
    self.compute_s = compute_s
    if hierarchy is not None and hierarchy.workers != num_workers:
      raise ValueError(
        f'the hierarchy holds {hierarchy.nodes} nodes x {hierarchy.local} workers = '
        f'{hierarchy.workers}, but the ledger prices {num_workers} workers'
      )
    linked = sorted({t.link for t in self.transfers if t.link is not None})
    if linked and hierarchy is None:
      raise ValueError(
        f'transfers over {linked} links are priced per link class: give the ledger the '
        'hierarchy (nodes, workers per node, intra-node network)'
      )
    # without linked transfers every collective spans all N workers on the profile's network
    self.hierarchy = hierarchy if linked else None
    # a step "synchronised" if a collective carrying model data ran: more than FLAG_BYTES
    # (not, say, SelSync's 4-byte flags or VAR's leader norms); any candidate ratio counts
    self._data = [i for i, t in enumerate(self.transfers) if t.nbytes > FLAG_BYTES]

  @classmethod
  def of(cls, exp, transfers: Sequence[comm.Transfer], compute_s: float) -> Ledger:
    """The ledger of a run (`factory.Experiment`): its workers, networks and algorithm.

    The devices are the nodes and each device's simulated workers a node's
    workers (`exp.hierarchy`: `config.network.intra`, `shared_nic`).

    Args:
      exp: the run.
      transfers: the `Transfer`s its step issues (of one worker's state).
      compute_s: one worker's step without communication, seconds.

    Returns:
      The `Ledger`.
    """
    return cls(
      transfers,
      exp.workers.count,
      exp.networks,
      exp.algorithm,
      compute_s,
      hierarchy=exp.hierarchy,
    )

  def sync_s(self, step: int) -> float:
    """Seconds of step `step`'s (0-based) communication if every collective ran once.

    On the first network; blocking and overlapped alike. What a
    synchronising step costs, known before the step runs (streams use it
    for how long data streamed in).

    Args:
      step: the 0-based step (a schedule's network changes with it).

    Returns:
      Seconds (0 without networks).
    """
    if not self.networks:
      return 0.0
    first = next(iter(self.networks))
    r = self.record(step + 1, [self.n] * len(self.transfers))
    return r[f'comm_s@{first}'] + r.get(f'overlap_s@{first}', 0.0)

  def record(self, step: int, counts: Sequence[int]) -> dict[str, Any]:
    """The ledger's fields of step `step` (1-based) whose collectives ran `counts` times in all.

    Args:
      step: the 1-based step, as the log numbers it.
      counts: each transfer's runs, summed over the workers.

    Returns:
      The record's fields: payload and sent bytes per worker, `synced`,
      `collectives`, and per network `comm_s@`, `overlap_s@` (if any) and
      `modelled_s@`.
    """
    n, h = self.n, self.hierarchy
    per_worker = [c / n for c in counts]  # every worker takes part in every collective
    pairs = list(zip(self.transfers, counts, strict=True))
    group = h.group if h is not None else lambda t: n  # the workers one run of t spans
    out: dict[str, Any] = {
      'payload_bytes': comm.total_bytes(self.transfers, counts) / n,
      'sent_bytes': sum(netmodel.sent_bytes(t, group(t)) * c for t, c in pairs) / n,
      'synced': int(any(counts[i] > 0 for i in self._data)),
      'collectives': sum(per_worker),  # each one α at least, whatever its size
    }
    for name, net in self.networks.items():
      net = netmodel.network_at(net, step - 1)
      if h is None:
        price = lambda overlap, net=net: netmodel.comm_time(
          self.transfers, n, net, self.algorithm, per_worker, overlap=overlap
        )
      else:
        price = lambda overlap, net=net: netmodel.link_time(
          self.transfers, h, net, self.algorithm, per_worker, overlap=overlap
        )
      blocking, hidden = price(False), price(True)
      out[f'comm_s@{name}'] = blocking
      if hidden:
        out[f'overlap_s@{name}'] = hidden
      out[f'modelled_s@{name}'] = netmodel.step_time(self.compute_s, blocking, hidden)
    return out


def modelled_clock(
  records: Sequence[Mapping[str, Any]],
  network: str,
  compute_s: float,
  clock: netmodel.WorkerClock | None = None,
) -> list[tuple[int, float]]:
  """(step, seconds) of the modelled clock over the records of a run.

  Without a `clock` every worker is equal: each step takes
  `netmodel.step_time(compute_s, blocking, overlapped)` with the
  communication the ledger priced on `network` (and the record's
  `step_compute_s` for `compute_s` where a ratio controller's candidate
  set it). With a per-worker `clock` (a heterogeneous cluster,
  `factory.Experiment.clock`), the records are
  replayed through it: each worker computes its batch (the record's
  `batches`, or the uniform one) at its own speed and the method's waiting
  rule decides who waits for whom; a worker first waits for its data
  (`wait_s`, streams) if the record says so.

  Args:
    records: the run's per-step records, from its first step.
    network: the profile name.
    compute_s: one worker's measured step without communication.
    clock: a fresh `netmodel.WorkerClock`, or None.

  Returns:
    (step, modelled seconds since the start) per record.
  """
  total, out = 0.0, []
  for r in records:
    blocking, hidden = r.get(f'comm_s@{network}', 0.0), r.get(f'overlap_s@{network}', 0.0)
    if clock is None:
      total += netmodel.step_time(r.get('step_compute_s', compute_s), blocking, hidden)
    else:
      uniform = compute_s / clock.per_example_s if clock.per_example_s else 0.0
      batches = r.get('batches', uniform)  # per-worker batches, when the run chose them
      synced = bool(r.get('synced', True))
      clock.advance(batches, blocking, hidden, synced=synced, data_wait_s=r.get('wait_s', 0.0))
      total = clock.total_s
    out.append((r['step'], total))
  return out


def lower_is_better(metric: str) -> bool:
  """Whether a smaller value of an evaluation's `metric` is better.

  Args:
    metric: a record's key: a loss (`test_loss`) or bits per character
      (`test_bits`) is lower-better, anything else (an accuracy) higher-better.

  Returns:
    True for a loss or bits.
  """
  return metric.endswith(('loss', 'bits'))


def reached(value: float | None, target: float, metric: str) -> bool:
  """Whether an evaluation's `value` of `metric` is at `target` or better.

  Args:
    value: the evaluation's figure (None: the step did not evaluate).
    target: the value to reach.
    metric: its key (`lower_is_better` says which way is better).

  Returns:
    False for None; else at or below `target` for a loss, at or above it otherwise.
  """
  if value is None:
    return False
  return value <= target if lower_is_better(metric) else value >= target


def time_to_accuracy(
  records: Sequence[Mapping[str, Any]],
  target: float,
  network: str,
  compute_s: float,
  clock: netmodel.WorkerClock | None = None,
  metric: str = 'test_accuracy',
) -> tuple[int, float] | None:
  """(step, modelled seconds) of the first evaluation reaching `target`, or None.

  Args:
    records: the run's per-step records, from its first step.
    target: the value to reach.
    network: the profile name of the clock.
    compute_s: one worker's measured step without communication.
    clock: a fresh `netmodel.WorkerClock`, or None (as `modelled_clock`).
    metric: the evaluation's figure, an accuracy (reached at or above the
      target) or a loss (reached at or below it: `reached`).

  Returns:
    (step, modelled seconds), or None if no evaluation reached it.
  """
  times = dict(modelled_clock(records, network, compute_s, clock))
  for r in records:
    if reached(r.get(metric), target, metric):
      return r['step'], times[r['step']]
  return None


def median_step_s(records: Sequence[Mapping[str, Any]]) -> float | None:
  """Median measured step time: robust to the compile step and eval/checkpoint spikes.

  Args:
    records: the run's per-step records.

  Returns:
    Seconds, or None if no record measured its step.
  """
  times = [r['step_s'] for r in records if r.get('step_s')]
  return statistics.median(times) if times else None


def summarize(
  records: Sequence[Mapping[str, Any]],
  networks: Sequence[str],
  compute_s: float,
  make_clock: Callable[[float], netmodel.WorkerClock | None] = lambda compute_s: None,
) -> dict[str, Any]:
  """Per-run figures from the per-step records: bytes, sync fraction, step and modelled times.

  Args:
    records: the run's per-step records.
    networks: the profile names to model the clock on.
    compute_s: one worker's measured step without communication.
    make_clock: gives a fresh per-worker clock of a heterogeneous cluster
      (or None); with one, the summary also has each network's cost.

  Returns:
    The figures by name (bytes per step, `sync_fraction`, `median_step_s`,
    `modelled_s@<network>`, ...).
  """
  mean = lambda key: sum(r[key] for r in records) / len(records) if records else None
  out = {
    'payload_bytes_per_step': mean('payload_bytes'),
    'sent_bytes_per_step': mean('sent_bytes'),
    'peak_sent_bytes_per_step': max((r['sent_bytes'] for r in records), default=None),
    'sent_bytes_per_worker': sum(r['sent_bytes'] for r in records) if records else None,
    'sync_fraction': mean('synced'),
    'median_step_s': median_step_s(records),
    'worker_step_s': compute_s,
  }
  injected = [r['inject_bytes'] for r in records if 'inject_bytes' in r]
  if injected:  # data injection: bytes each worker received
    out['inject_bytes_per_step'] = sum(injected) / len(records)
  for name in networks:
    clock = make_clock(compute_s)
    times = modelled_clock(records, name, compute_s, clock)
    out[f'modelled_s@{name}'] = times[-1][1] if times else None
    if clock is not None:
      out[f'cost@{name}'] = clock.cost
  return out
