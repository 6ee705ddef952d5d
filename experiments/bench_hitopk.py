r"""Modelled communication time of one step: HiTopK vs flat Top-k vs AR-Top-k vs dense ring.

No timing: every number is the α-β model (`jaxdist.netmodel`) applied to the
transfers each transform records for a float32 gradient of `--params`
elements (from `jax.eval_shape` of its `init`, so nothing is allocated),
on `--nodes` nodes of `--local` GPUs:

- hitopk: `sync.hitopk_allreduce(mstopk(ratio))`, priced by
  `netmodel.hierarchical_time`: the intra-node reduce-scatter (ring,
  (m-1)α + (m-1)/m·Mβ) and dense all-gather on the intra-node network, and
  the m rails' sparse all-gathers (k/m values + int32 indices each, among n
  nodes) on the inter-node network, the m rails sharing one NIC per node
  (bandwidth/m each; `--shared_nic=false`: a NIC per GPU).
- flat Top-k AG: `compressed_allreduce(collective='allgather')`, each of the
  n·m workers' k values + k indices gathered by all (α log N + (N-1)·8kβ).
- AR-Top-k: `compressed_allreduce(collective='allreduce')` (STAR leader): a
  broadcast of the leader's k indices (α log N + log N·4kβ) + a ring
  all-reduce of k values.
- dense ring: `sync.allreduce`, ring all-reduce of the 4D-byte gradient.

Flat collectives over all N = n·m workers are priced on the inter-node
network (`netmodel.flat_time`): a ring laid out node by node waits on its
inter-node hop every step. Not modelled: compute, the compression kernels'
own time (MSTopK's passes over the shard), overlap with backward, NCCL's
multi-ring / tree hierarchies for the dense and flat baselines, and
congestion beyond the shared NIC. "NIC MB" is what each node's NIC sends per
step (ring algorithms).

Defaults: 16 nodes x 8 GPUs (Shi et al.'s 16 x 8 V100 cloud cluster), a
25M-parameter gradient (~ResNet-50), intra-node 150 GB/s at 5 us (NVLink
class), inter-node 10 and 25 Gbit/s at 25 us (netmodel's default latency).

  python experiments/bench_hitopk.py
  python experiments/bench_hitopk.py --nodes=4 --local=4 --ratios=0.01 --inter_gbps=1,100
"""

import jax
import jax.numpy as jnp
from absl import app, flags

import jaxdist as jd
from jaxdist import compress as C
from jaxdist import netmodel

flags.DEFINE_integer('params', 25_000_000, 'Gradient elements (float32).')
flags.DEFINE_integer('nodes', 16, 'Nodes n.')
flags.DEFINE_integer('local', 8, 'GPUs per node m.')
flags.DEFINE_list('ratios', ['0.01', '0.001'], 'Kept fractions k/D.')
flags.DEFINE_list('inter_gbps', ['10', '25'], 'Inter-node bandwidths, Gbit/s.')
flags.DEFINE_float('inter_latency_us', 25.0, 'Inter-node latency α, microseconds.')
flags.DEFINE_float('intra_gbytes', 150.0, 'Intra-node bandwidth, GB/s.')
flags.DEFINE_float('intra_latency_us', 5.0, 'Intra-node latency α, microseconds.')
flags.DEFINE_bool('shared_nic', True, 'The m rails share one NIC per node (False: a NIC per GPU).')
FLAGS = flags.FLAGS


def _transfers(tx, params, *fields):
  """The transfers `tx.init(params)` records in `fields` of its state (shapes only)."""
  state = jax.eval_shape(tx.init, params)
  return [list(getattr(state, f)) for f in fields]


def rows(d, n, m, ratio, intra_net, inter_net, shared_nic):
  """(method, NIC bytes per node, seconds) of each method for one step."""
  params = {'w': jax.ShapeDtypeStruct((d,), jnp.float32)}
  once = lambda ts: [1] * len(ts)
  big_n = n * m
  out = []

  hi = jd.sync.hitopk_allreduce(C.mstopk(ratio=ratio), node_axis='n', local_axis='l', local_size=m)
  intra, inter = _transfers(hi, params, 'intra', 'inter')
  t = netmodel.hierarchical_time(
    intra,
    inter,
    nodes=n,
    local=m,
    intra_net=intra_net,
    inter_net=inter_net,
    shared_nic=shared_nic,
    counts=(once(intra), once(inter)),
  )
  nic = m * sum(netmodel.sent_bytes(x, n) for x in inter)
  out.append(('HiTopK (RS + rail AG + AG)', nic, t))

  for name, collective in (
    ('flat Top-k all-gather', 'allgather'),
    ('AR-Top-k (STAR)', 'allreduce'),
  ):
    tx = jd.sync.compressed_allreduce(C.mstopk(ratio=ratio), axis_name='w', collective=collective)
    (wire,) = _transfers(tx, params, 'wire')
    t = netmodel.flat_time(wire, nodes=n, local=m, inter_net=inter_net, counts=once(wire))
    out.append((name, sum(netmodel.sent_bytes(x, big_n) for x in wire), t))

  dense = jax.eval_shape(jd.sync.allreduce(axis_name='w').init, params).wire
  t = netmodel.flat_time([dense], nodes=n, local=m, inter_net=inter_net, counts=[1])
  out.append(('dense ring all-reduce', netmodel.sent_bytes(dense, big_n), t))
  return out


def main(argv):
  del argv
  d, n, m = FLAGS.params, FLAGS.nodes, FLAGS.local
  intra_net = netmodel.Network(
    latency=FLAGS.intra_latency_us * 1e-6, bandwidth=FLAGS.intra_gbytes * 1e9, name='intra'
  )
  print(
    f'{d:,} float32 parameters ({4 * d / 1e6:.0f} MB), {n} nodes x {m} GPUs; '
    f'intra {FLAGS.intra_gbytes:g} GB/s @ {FLAGS.intra_latency_us:g} us; '
    f'inter @ {FLAGS.inter_latency_us:g} us; rails share a NIC: {FLAGS.shared_nic}'
  )
  header = f'{"ratio":>6} {"inter":>9}  {"method":<28} {"NIC MB":>8} {"ms/step":>9} {"vs dense":>9}'
  print(header)
  print('-' * len(header))
  for ratio in map(float, FLAGS.ratios):
    for gbit in map(float, FLAGS.inter_gbps):
      inter_net = netmodel.gbps(gbit, FLAGS.inter_latency_us * 1e-6)
      table = rows(d, n, m, ratio, intra_net, inter_net, FLAGS.shared_nic)
      dense_s = table[-1][2]
      for method, nic, seconds in table:
        print(
          f'{ratio:>6g} {f"{gbit:g} Gb/s":>9}  {method:<28} {nic / 1e6:>8.2f} '
          f'{seconds * 1e3:>9.2f} {dense_s / seconds:>8.1f}x'
        )
      print()


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
