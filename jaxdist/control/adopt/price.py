"""ADOPT's communication time of a ratio: the cheapest collective under the α-β model.

Per candidate, the minimum over all-gather of Top-k and AR-Top-k over a ring
or a tree (Table I / Eqs. 4–5), priced by `jaxdist.netmodel` exactly as
`compressed_allreduce(collective='auto')` prices them, in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from jaxdist import compress, netmodel
from jaxdist.sync import _choice, _exchange
from jaxdist.sync import compressed as _compressed


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
