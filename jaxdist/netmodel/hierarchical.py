"""α-β cost on a two-level cluster: n nodes of m workers, fast links inside a node.

A node's m workers talk over `intra` links (NVLink, PCIe); nodes talk over
`inter` links (the NIC, one per node unless the node has a NIC per worker).
The existing pricing (`model.py`) is unchanged and used for each level:

- a collective among the m workers of a node costs its `model.py` formula
  with N = m on the intra network;
- a collective among the n workers of one rail (same local rank on every
  node) costs its formula with N = n on the inter network; the m rails run
  at once, and where they share one NIC per node each gets 1/m of its
  bandwidth (`shared_nic`);
- a flat collective over all n·m workers (a ring laid out node by node) is
  paced by its slowest hop, the inter-node link: its formula with N = n·m on
  the inter network. In a single ring only one worker per node sends across
  the NIC at a time, so the NIC is not shared.

A transform says which of these a collective is with `comm.Transfer.link`
(None: flat, 'intra', 'inter'); `Hierarchy` and `link_time` price a list of
such transfers (the trainer's ledger), `hierarchical_time` and `flat_time`
lists of one kind each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxdist import comm
from jaxdist.netmodel.model import Network, comm_time, transfer_time


def rail_network(inter: Network, local: int, shared_nic: bool = True) -> Network:
  """The link one rail's collective sees: `inter` with 1/local of its bandwidth if shared.

  Args:
    inter: the inter-node network.
    local: m, workers (rails) per node.
    shared_nic: whether the m rails share the node's NIC.

  Returns:
    The rail's `Network`.
  """
  if local < 1:
    raise ValueError(f'local must be >= 1, got {local}')
  if not shared_nic or local == 1:
    return inter
  return dataclasses.replace(inter, bandwidth=inter.bandwidth / local, name=f'{inter}/{local}')


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Where a run's workers sit: `nodes` nodes of `local` workers, `intra` links inside a node.

  The run's network (what the ledger prices against) is the inter-node one.

  Attributes:
    nodes: n, the number of nodes.
    local: m, workers per node.
    intra: the links inside a node (NVLink, PCIe).
    shared_nic: the m rails of a node share its NIC (each gets 1/m of the
      inter-node bandwidth); False: a NIC per worker.
  """

  nodes: int
  local: int
  intra: Network
  shared_nic: bool = True

  def __post_init__(self):
    for name in ('nodes', 'local'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be an int >= 1, got {value!r}')
    if not isinstance(self.intra, Network):
      raise ValueError(f'intra must be a fixed netmodel.Network, got {self.intra!r}')
    if not isinstance(self.shared_nic, bool):
      raise ValueError(f'shared_nic must be True or False, got {self.shared_nic!r}')

  @property
  def workers(self) -> int:
    """n·m."""
    return self.nodes * self.local

  def group(self, t: comm.Transfer) -> int:
    """Workers one run of `t` spans: all n·m (link None), the m of a node, the n of a rail.

    Args:
      t: the transfer (its `link`).

    Returns:
      The group's size.
    """
    return {None: self.workers, 'intra': self.local, 'inter': self.nodes}[_link(t)]

  def network(self, t: comm.Transfer, net: Network) -> Network:
    """The link `t` runs over when `net` is the run's (inter-node) network.

    Args:
      t: the transfer (its `link`).
      net: the run's network.

    Returns:
      `intra`, the rail's network, or `net`.
    """
    link = _link(t)
    if link == 'intra':
      return self.intra
    if link == 'inter':
      return rail_network(net, self.local, self.shared_nic)
    return net


def _link(t: comm.Transfer) -> str | None:
  if t.link not in (None, 'intra', 'inter'):
    raise ValueError(f"Transfer.link must be None, 'intra' or 'inter', got {t.link!r}")
  return t.link


def link_time(
  transfers: Sequence[comm.Transfer],
  hierarchy: Hierarchy,
  net: Network,
  algorithm: str = 'ring',
  counts: Sequence[int] | None = None,
  overlap: bool | None = None,
) -> float:
  """Seconds the `transfers` of one step take, each priced by its `link`.

    T = Σ c·t(transfer, N, link network)

  with N and the network by `Transfer.link`: None, N = n·m on `net` (as
  `model.comm_time` prices it, bit for bit); 'intra', N = m on
  `hierarchy.intra`; 'inter', N = n on the rail, `net` at bandwidth/m when
  the rails share the NIC. c is each transfer's count (or `counts`);
  `overlap` selects as in `model.comm_time`.

  Args:
    transfers: the step's `Transfer`s.
    hierarchy: nodes, workers per node and the intra-node link.
    net: the run's (inter-node) network.
    algorithm: the all-reduce's, as `model.allreduce`.
    counts: how many times each ran (None: their own counts).
    overlap: as in `model.comm_time`.

  Returns:
    Seconds.

  Example:
    >>> from jaxdist import comm, netmodel
    >>> h = netmodel.Hierarchy(nodes=2, local=4, intra=netmodel.Network(0.0, 100.0))
    >>> nic = netmodel.Network(latency=0.0, bandwidth=10.0)
    >>> rs = comm.transfer(comm.ALL_TO_ALL, 400, op='reduce-scatter', link='intra')
    >>> ag = comm.transfer(comm.ALL_GATHER, 8, link='inter')
    >>> netmodel.link_time([rs, ag], h, nic)  # 3/4 of 400 at 100, then 1 copy of 8 at 10/4
    6.2
  """
  counts = [int(t.count) for t in transfers] if counts is None else counts
  return sum(
    c * transfer_time(t, hierarchy.group(t), hierarchy.network(t, net), algorithm)
    for t, c in zip(transfers, counts, strict=True)
    if overlap is None or t.overlap == overlap
  )


def hierarchical_time(
  intra: Sequence[comm.Transfer],
  inter: Sequence[comm.Transfer],
  *,
  nodes: int,
  local: int,
  intra_net: Network,
  inter_net: Network,
  shared_nic: bool = True,
  algorithm: str = 'ring',
  counts: tuple[Sequence[int], Sequence[int]] | None = None,
) -> float:
  """Seconds one step's intra-node and inter-node (per-rail) transfers take.

    T = Σ_intra c·t(transfer, N = m, intra_net) + Σ_inter c·t(transfer, N = n, rail)

  with t the `model.py` cost (`transfer_time`), c each transfer's count
  (or `counts`), and rail = `inter_net` at bandwidth/m when the m rails
  share a NIC. A reduce-scatter recorded as an all-to-all (op
  'reduce-scatter') costs (m−1)α + (m−1)/m·Mβ, a ring reduce-scatter.

  Args:
    intra: transfers among the `local` workers of a node (e.g.
      `HiTopKState.intra`).
    inter: transfers among the `nodes` workers of a rail (`HiTopKState.inter`).
    nodes: n, the number of nodes.
    local: m, workers per node.
    intra_net: the links inside a node.
    inter_net: a node's link to the others (its NIC).
    shared_nic: the m rails share one NIC per node (False: a NIC per worker).
    algorithm: all-reduce algorithm of `model.allreduce`.
    counts: (intra counts, inter counts) instead of the transfers' own.

  Returns:
    Seconds.

  Example:
    >>> from jaxdist import comm, netmodel
    >>> nvlink = netmodel.Network(latency=0.0, bandwidth=100.0)  # bytes/s
    >>> nic = netmodel.Network(latency=0.0, bandwidth=10.0)
    >>> rs = comm.transfer(comm.ALL_TO_ALL, 400, op='reduce-scatter')  # 3/4 of 400 at 100
    >>> ag = comm.transfer(comm.ALL_GATHER, 8)  # 1 rail payload; 2 nodes: 1 copy, at 10/4
    >>> netmodel.hierarchical_time(
    ...   [rs], [ag], nodes=2, local=4, intra_net=nvlink, inter_net=nic)
    6.2
  """
  if nodes < 1:
    raise ValueError(f'nodes must be >= 1, got {nodes}')
  rail = rail_network(inter_net, local, shared_nic)
  c_intra, c_inter = counts if counts is not None else (None, None)
  return comm_time(intra, local, intra_net, algorithm, c_intra) + comm_time(
    inter, nodes, rail, algorithm, c_inter
  )


def flat_time(
  transfers: Sequence[comm.Transfer],
  *,
  nodes: int,
  local: int,
  inter_net: Network,
  algorithm: str = 'ring',
  counts: Sequence[int] | None = None,
) -> float:
  """Seconds a flat collective's `transfers` over all n·m workers take, paced by `inter_net`.

    T = Σ c·t(transfer, N = n·m, inter_net)

  (a ring laid out node by node crosses each NIC once per step, so the
  intra-node hops wait on the inter-node one). For n >= 2; one node has no
  inter-node hop (price it with `model.comm_time` on the intra network).

  Args:
    transfers: the collective's `Transfer`s.
    nodes: n (>= 2).
    local: m, workers per node.
    inter_net: the inter-node network.
    algorithm: the all-reduce's, as `model.allreduce`.
    counts: how many times each ran (None: their own counts).

  Returns:
    Seconds.

  Example:
    >>> from jaxdist import comm, netmodel
    >>> nic = netmodel.Network(latency=0.0, bandwidth=8.0)
    >>> ag = comm.transfer(comm.ALL_GATHER, 8)  # 7 copies of 8 bytes at 8 bytes/s
    >>> netmodel.flat_time([ag], nodes=2, local=4, inter_net=nic)
    7.0
  """
  if nodes < 2 or local < 1:
    raise ValueError(f'need nodes >= 2 and local >= 1, got {nodes} and {local}')
  return comm_time(transfers, nodes * local, inter_net, algorithm, counts)
