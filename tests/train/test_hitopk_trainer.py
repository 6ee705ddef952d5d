"""hitopk_allreduce in the trainer: dense at ratio 1, the ledger's prices per link class, the wire.

The devices are the nodes and each device's simulated workers its local workers
(`--config.workers=4 --config.devices=2`: 2 nodes x 2). Every expected number below
is computed by hand from the α-β formulas of `jaxdist.netmodel.model`.
"""

import collections
import math
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

import jaxdist as jd
from jaxdist import comm, netmodel, runtime, testing
from jaxdist import compress as C
from jaxdist.train import config as config_lib
from jaxdist.train import factory, ledger

import conftest

INTRA_NET = netmodel.profile('1200gbps@5us')  # config.network.intra's default: 150 GB/s, 5 us


def close(a, b, **kw):
  """allclose that fails on NaN (assert_allclose passes NaN == NaN by default)."""
  np.testing.assert_allclose(a, b, equal_nan=False, **kw)


def run_digits(tmp_path, name, data_dir, monkeypatch, **overrides):
  """Two nodes of two: 4 workers on 2 devices, 6 steps."""
  overrides = {'steps': 6, 'devices': 2, **overrides}
  return conftest.run_digits(tmp_path, name, data_dir, monkeypatch, 'workers=4', **overrides)


def test_ratio_one_trains_like_the_dense_allreduce_on_two_nodes_of_two(
  tmp_path, data_dir, monkeypatch
):
  """Keeping every element, HiTopK's node sums reach everyone whole: the dense mean.

  Its ledger prices the intra-node collectives among m = 2 on the intra-node network
  and the rail's among n = 2 on each profile at half its bandwidth (2 rails, one NIC);
  the dense all-reduce spans all 4 workers on the profile, as it always did.
  """
  hi = run_digits(
    tmp_path, 'hitopk', data_dir, monkeypatch,
    **{'sync.method': 'hitopk_allreduce', 'compress.topk.ratio': 1.0},
  )  # fmt: skip
  dense = run_digits(tmp_path, 'dense', data_dir, monkeypatch, **{'sync.method': 'allreduce'})
  leaves = jax.tree.leaves(hi[2])
  assert len(leaves) == len(jax.tree.leaves(dense[2])) > 0
  for a, b in zip(leaves, jax.tree.leaves(dense[2]), strict=True):
    assert np.all(np.isfinite(a))
    close(a, b, rtol=1e-5, atol=1e-6)
  close([r['loss'] for r in hi[1]], [r['loss'] for r in dense[1]], rtol=1e-5, atol=1e-6)

  d = sum(math.prod(x.shape[1:]) for x in leaves)  # one replica's parameters
  assert d > 100_000  # the digits CNN
  s = -(-d // 2)  # a shard; ratio 1 sends all s values and s int32 indices per rail
  for r in hi[1]:
    assert r['payload_bytes'] == 8 * s + 4 * s + 8 * s  # reduce-scatter, all-gather, rail
    # (m-1)/m of the reduce-scatter, (m-1) x the all-gather, (n-1) x the rail's payload
    assert r['sent_bytes'] == pytest.approx(8 * s / 2 + 4 * s + 8 * s, rel=1e-12)
    intra = (5e-6 + 0.5 * 8 * s / 150e9) + (5e-6 + 4 * s / 150e9)  # (m-1)α + ..., α log m + ...
    rail_10 = 25e-6 + 8 * s / (10e9 / 8 / 2)  # α log n + (n-1)·M / (B/m)
    rail_1 = 100e-6 + 8 * s / (1e9 / 8 / 2)
    assert r['comm_s@10gbps'] == pytest.approx(intra + rail_10, rel=1e-12)
    assert r['comm_s@1gbps'] == pytest.approx(intra + rail_1, rel=1e-12)
  for r in dense[1]:  # the flat ring all-reduce over all 4 workers, bit for bit as before
    for net in ('1gbps', '10gbps'):
      assert r[f'comm_s@{net}'] == netmodel.allreduce(4 * d, 4, netmodel.profile(net))
    assert r['sent_bytes'] == 2 * 3 / 4 * 4 * d


# --- the ledger: each link class priced on its own network, among its own workers ---------------

NIC = netmodel.gbps(8, 1e-3)  # the profile: 1 GB/s, 1 ms
NVLINK = netmodel.Network(latency=1e-6, bandwidth=100e9)
TWO_BY_FOUR = netmodel.Hierarchy(nodes=2, local=4, intra=NVLINK)


def linked():
  """hitopk's three transfers on 2 nodes x 4, shards of 1000 elements, 10 kept per shard."""
  return [
    comm.transfer(comm.ALL_TO_ALL, 16_000, 0, op='reduce-scatter', link='intra'),
    comm.transfer(comm.ALL_GATHER, 4_000, 0, link='intra'),
    comm.transfer(comm.ALL_GATHER, 80, 0, link='inter'),
  ]


def test_ledger_prices_intra_at_m_workers_and_rails_at_n_on_a_share_of_the_nic_by_hand():
  flat = comm.transfer(comm.ALL_REDUCE, 1_000_000, 0)  # a flat all-reduce beside them
  book = ledger.Ledger([*linked(), flat], 8, {'net': NIC}, 'ring', 0.002, hierarchy=TWO_BY_FOUR)
  r = book.record(1, [8, 8, 8, 8])  # every worker ran each once
  reduce_scatter = 3 * 1e-6 + 3 / 4 * 16_000 / 100e9  # all-to-all: (m-1)α + (m-1)/m·Mβ, m = 4
  intra_gather = 2 * 1e-6 + 3 * 4_000 / 100e9  # α log m + (m-1)·Mβ
  rail = 1 * 1e-3 + 1 * 80 / (1e9 / 4)  # α log n + (n-1)·Mβ, n = 2, 4 rails share the NIC
  ring = 2 * 7 * 1e-3 + 2 * 7 / 8 * 1_000_000 / 1e9  # 2(N-1)α + 2(N-1)/N·Mβ, N = 8
  assert r['comm_s@net'] == pytest.approx(reduce_scatter + intra_gather + rail + ring, rel=1e-12)
  assert r['modelled_s@net'] == pytest.approx(0.002 + r['comm_s@net'], rel=1e-12)
  sent = 3 / 4 * 16_000 + 3 * 4_000 + 1 * 80 + 2 * 7 / 8 * 1_000_000
  assert r['sent_bytes'] == pytest.approx(sent, rel=1e-12)
  assert r['payload_bytes'] == 16_000 + 4_000 + 80 + 1_000_000 and r['synced'] == 1
  assert book.sync_s(0) == pytest.approx(r['comm_s@net'], rel=1e-12)

  r = book.record(2, [8, 8, 0, 0])  # only the intra-node collectives ran
  assert r['comm_s@net'] == pytest.approx(reduce_scatter + intra_gather, rel=1e-12)
  assert r['sent_bytes'] == pytest.approx(3 / 4 * 16_000 + 3 * 4_000, rel=1e-12)

  own_nics = ledger.Ledger(
    linked(), 8, {'net': NIC}, 'ring', 0.0,
    hierarchy=netmodel.Hierarchy(nodes=2, local=4, intra=NVLINK, shared_nic=False),
  )  # fmt: skip
  r = own_nics.record(1, [0, 0, 8])
  assert r['comm_s@net'] == pytest.approx(1e-3 + 80 / 1e9, rel=1e-12)  # the whole NIC
  assert r['sent_bytes'] == pytest.approx(80, rel=1e-12)  # the bytes do not change


def test_ledger_prices_rails_on_the_phase_of_a_varying_network():
  phases = netmodel.Schedule(((1, NIC), (1, netmodel.gbps(80, 2e-3))))  # 1 then 10 GB/s
  book = ledger.Ledger(linked(), 8, {'var': phases}, 'ring', 0.0, hierarchy=TWO_BY_FOUR)
  assert book.record(1, [0, 0, 8])['comm_s@var'] == pytest.approx(1e-3 + 80 / (1e9 / 4), rel=1e-12)
  assert book.record(2, [0, 0, 8])['comm_s@var'] == pytest.approx(2e-3 + 80 / (10e9 / 4), rel=1e-12)


FLAT = [
  comm.transfer(comm.ALL_REDUCE, 605_224, 0),
  comm.transfer(comm.ALL_GATHER, 12_104, 0),
  comm.transfer(comm.ALL_REDUCE, 6_052, 0, op='broadcast'),
  comm.transfer(comm.ALL_TO_ALL, 1_000, 0),
  comm.transfer(comm.PERMUTE, 777, 0),
  comm.overlapped(comm.transfer(comm.ALL_REDUCE, 300_001, 0)),
  comm.transfer(comm.ALL_REDUCE, 4, 0),
]


@pytest.mark.parametrize('algorithm', netmodel.ALGORITHMS)
def test_flat_transfers_are_priced_bit_for_bit_as_before(algorithm):
  """A transfer without a link spans all N workers on the profile, with or without nodes."""
  networks = {'1gbps': netmodel.profile('1gbps'), 'adopt': netmodel.resolve('adopt_c1@1')}
  before = ledger.Ledger(FLAT, 8, networks, algorithm, 0.001)
  after = ledger.Ledger(FLAT, 8, networks, algorithm, 0.001, hierarchy=TWO_BY_FOUR)
  mixed = ledger.Ledger([*FLAT, *linked()], 8, networks, algorithm, 0.001, hierarchy=TWO_BY_FOUR)
  for step in range(1, 5):
    counts = [8 * ((step + i) % 3) for i in range(len(FLAT))]
    old = before.record(step, counts)
    assert old['comm_s@1gbps'] > 0 and old['sent_bytes'] > 0
    assert after.record(step, counts) == old  # every float equal, bit for bit
    new = mixed.record(step, [*counts, 0, 0, 0])  # linked transfers that did not run
    assert {k: new[k] for k in old} == old
    per_worker = [c / 8 for c in counts]
    for name, net in networks.items():
      net = netmodel.network_at(net, step - 1)
      assert old[f'comm_s@{name}'] == netmodel.comm_time(FLAT, 8, net, algorithm, per_worker, False)
      assert netmodel.link_time(FLAT, TWO_BY_FOUR, net, algorithm, per_worker) == (
        netmodel.comm_time(FLAT, 8, net, algorithm, per_worker)
      )
  assert before.sync_s(3) == after.sync_s(3) > 0


# --- the wire: bytes per link class against the compiled HLO -------------------------------------

N, M = 2, 4
HLO_D = 4000  # shards of 1000; ratio 0.01 keeps 10 per shard: 80 bytes per rail
NODES = {(0, 1, 2, 3), (4, 5, 6, 7)}  # a node's four devices: the intra-node link
RAILS = {(0, 4), (1, 5), (2, 6), (3, 7)}  # one device per node, same local rank: the inter link
_COLLECTIVE = re.compile(
  r'= (\w+)\[([\d,]*)\]\S* (all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)'
  r'\(.*replica_groups=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}'
)


def bytes_by_group(text):
  """{replica groups: operand bytes of all collectives over them} of an HLO module."""
  out = collections.Counter()
  for dtype, dims, kind, listed in _COLLECTIVE.findall(text):
    groups = frozenset(
      tuple(int(i) for i in g.split(',')) for g in re.findall(r'\{([\d,]+)\}', listed)
    )
    size = len(next(iter(groups)))
    result = {'f32': 4, 's32': 4, 'u32': 4}[dtype] * math.prod(int(d) for d in dims.split(',') if d)
    operand = {'all-gather': result // size, 'reduce-scatter': result * size}.get(kind, result)
    out[groups] += operand
  return out


def recorded_by_link(state):
  out = collections.Counter()
  for t in comm.find_transfers(state):
    out[t.link] += t.nbytes * int(np.asarray(t.count).reshape(-1)[0])
  return out


def test_recorded_bytes_per_link_class_are_the_hlo_s_on_a_2d_mesh():
  """Real devices for both levels: the node's collectives and the rails' in the HLO."""
  devices = np.asarray(jax.devices()[: N * M]).reshape(N, M)
  mesh = Mesh(devices, ('node', 'local'), axis_types=(AxisType.Auto,) * 2)
  tx = jd.sync.hitopk_allreduce(
    C.topk(ratio=0.01), node_axis='node', local_axis='local', local_size=M
  )
  g = jnp.asarray(np.random.default_rng(0).standard_normal((N, M, HLO_D)), jnp.float32)
  state = jax.vmap(jax.vmap(tx.init))(g)
  one = lambda t: jax.tree.map(lambda x: x[0, 0], t)
  back = lambda t: jax.tree.map(lambda x: x[None, None], t)
  body = lambda g, s: back(tx.update(one(g), one(s)))
  spec = P('node', 'local')
  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
  wire = bytes_by_group(step.lower(g, state).compile().as_text())
  _, new = step(g, state)
  recorded = recorded_by_link(new)
  assert recorded == {'intra': 4 * HLO_D + 4 * HLO_D // M, 'inter': 80}  # RS + AG; 10 + 10
  assert wire == {frozenset(NODES): recorded['intra'], frozenset(RAILS): recorded['inter']}


def test_in_the_trainer_layout_only_the_rails_cross_devices():
  """Devices are nodes: a node's collectives stay inside its device; each device carries
  its m workers' rails (every byte of the 'inter' class), and nothing else crosses."""
  config = config_lib.base()
  config.update_from_flattened_dict({'sync.method': 'hitopk_allreduce', 'workers': 8})
  workers = runtime.layout(8, devices=2)  # 2 nodes x 4
  tx, _ = factory.build_chain(config, workers)
  params = {'w': jnp.zeros((HLO_D,)), 'b': jnp.zeros((7,))}  # 4007: shards of 1002, 10 kept
  run = testing.Run(tx, params, workers=8, devices=2)
  grads = jax.tree.map(
    lambda p: jnp.asarray(np.random.default_rng(1).standard_normal((8, *p.shape)), jnp.float32),
    params,
  )
  wire = bytes_by_group(run.hlo(grads))
  run(grads)
  recorded = recorded_by_link(run.state)
  s = -(-4007 // 4)
  assert recorded == {'intra': 4 * 4 * s + 4 * s, 'inter': 8 * C.num_kept(s, 0.01)}
  assert recorded['inter'] == 8 * 10  # k = floor(1002 x 0.01)
  assert wire == {frozenset({(0, 1)}): 4 * recorded['inter']}  # 4 rails per device


# --- the trainer's layout, the variant and bad input ----------------------------------------------


def test_the_devices_are_the_nodes_and_their_simulated_workers_the_local_ones():
  config = compare_variant('hitopk', workers=16, devices=2)
  assert config.sync.method == 'hitopk_allreduce' and config.compress.topk.ratio == 0.01
  workers = runtime.layout(16, devices=2)
  tx, _ = factory.build_chain(config, workers)
  state = jax.eval_shape(tx.init, {'w': jax.ShapeDtypeStruct((8000,), jnp.float32)})
  (rs, ag), (rail,) = state[0].intra, state[0].inter
  assert (rs.nbytes, ag.nbytes, rail.nbytes) == (4 * 8000, 4 * 1000, 8 * 10)  # 8 shards of 1000
  exp = types.SimpleNamespace(
    workers=workers,
    networks={'10gbps': NIC},
    algorithm=config.network.algorithm,
    hierarchy=factory.hierarchy(config, workers),
  )
  book = ledger.Ledger.of(exp, [rs, ag, rail], compute_s=0.0)
  assert book.hierarchy == netmodel.Hierarchy(nodes=2, local=8, intra=INTRA_NET, shared_nic=True)
  assert book.n == 16


def compare_variant(name, **overrides):
  from jaxdist.train import compare

  variants = compare.load_group(f'{conftest.REPO}/configs/variants/hitopk.py').variants
  config = compare.variant_config(config_lib.base(), variants, name)
  config.update_from_flattened_dict(overrides)
  return config


def hitopk_config(**overrides):
  config = config_lib.base()
  config.update_from_flattened_dict({'sync.method': 'hitopk_allreduce', **overrides})
  return config


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'compress.name': 'qsgd'},
     r"config.sync.hitopk_allreduce sends the shards of a sparsifier: config.compress.name must "
     r"be one of \['dgc', 'mstopk', 'threshold', 'topk'\], got 'qsgd'"),
    ({'compress.name': 'randomk'}, r"config.compress.name must be one of .*got 'randomk'"),
    ({'compress.name': 'zip'}, r"unknown compress.name 'zip'"),
    ({'compress.topk.ratio': 1.5}, r'config.compress.topk: ratio must be in \(0, 1\], got 1.5'),
    ({'network.intra': 'nvlink'}, r"config.network.intra: unknown network profile 'nvlink'"),
    ({'network.intra': 'adopt_c1@50'}, r'config.network.intra: unknown network profile'),
    ({'workers': 6, 'devices': 4, 'batch_size': 96},
     r'workers \(6\) must be a multiple of the devices they run on \(4\)'),
    ({'adaptive': 'gravac'},
     r"config.adaptive='gravac' chooses the ratio of sync.method=compressed_allreduce, "
     r"got 'hitopk_allreduce'"),
  ],
)  # fmt: skip
def test_bad_input_names_the_key_at_construction(
  tmp_path, data_dir, monkeypatch, overrides, message
):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)  # config.adaptive is checked after the data
  with pytest.raises(factory.ConfigError, match=message):
    factory.build(hitopk_config(**overrides), str(tmp_path / 'run'))


def test_a_layout_argument_in_the_section_is_refused_by_name(tmp_path):
  config = hitopk_config()
  config.sync.hitopk_allreduce.local_size = 4  # the trainer's: workers per device
  with pytest.raises(
    factory.ConfigError,
    match=r"config.sync.hitopk_allreduce has \['local_size'\], which hitopk_allreduce does not",
  ):
    factory.build(config, str(tmp_path / 'run'))


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: ledger.Ledger(linked(), 8, {}, 'ring', 0.0),
     r"transfers over \['inter', 'intra'\] links are priced per link class: give the ledger "
     r'the hierarchy'),
    (lambda: ledger.Ledger(linked(), 8, {}, 'ring', 0.0,
                           hierarchy=netmodel.Hierarchy(nodes=2, local=2, intra=NVLINK)),
     r'the hierarchy holds 2 nodes x 2 workers = 4, but the ledger prices 8 workers'),
    (lambda: netmodel.Hierarchy(nodes=0, local=4, intra=NVLINK),
     r'nodes must be an int >= 1, got 0'),
    (lambda: netmodel.Hierarchy(nodes=2, local=2.0, intra=NVLINK),
     r'local must be an int >= 1, got 2.0'),
    (lambda: netmodel.Hierarchy(nodes=2, local=2, intra=netmodel.adopt_c1(5)),
     r'intra must be a fixed netmodel.Network'),
    (lambda: netmodel.Hierarchy(nodes=2, local=2, intra=NVLINK, shared_nic='yes'),
     r"shared_nic must be True or False, got 'yes'"),
    (lambda: comm.transfer(comm.ALL_GATHER, 8, link='rack'),
     r"link must be one of \(None, 'intra', 'inter'\), got 'rack'"),
  ],
)  # fmt: skip
def test_bad_ledger_input_says_what_is_wrong(make, message):
  with pytest.raises(ValueError, match=message):
    make()
