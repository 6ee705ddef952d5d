"""hitopk_allreduce: dense mean at ratio 1, a hand-computed case, error feedback, HLO, errors."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

import jaxdist as jd
from jaxdist import comm, runtime, testing
from jaxdist import compress as C

SHAPES = {'conv': (3, 3, 2, 5), 'dense': (7, 3), 'bias': (3,)}  # 90 + 21 + 3 = 114 elements
D = 114


def params():
  return {k: jnp.zeros(s, jnp.float32) for k, s in SHAPES.items()}


def worker_grads(workers, seed=0):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal((workers, *s)).astype(np.float32) for k, s in SHAPES.items()}


def flat(tree, w):
  """Worker w's leaves, flattened in leaf order (the order hitopk fuses them in)."""
  return np.concatenate([np.asarray(x[w]).ravel() for x in jax.tree.leaves(tree)])


def hitopk(compressor, layout, **kw):
  """hitopk_allreduce for a `testing.Run` layout: (node axis, local axis, m)."""
  node, local, m = layout
  return jd.sync.hitopk_allreduce(compressor, node_axis=node, local_axis=local, local_size=m, **kw)


# (workers, devices, node axis, local axis, m): devices are nodes, or devices are local ranks
LAYOUTS = {
  '2 nodes x 4 sim': (8, 2, 'data', 'sim', 4),
  '4 nodes x 2 sim': (8, 4, 'data', 'sim', 2),
  '1 node x 8 sim': (8, 1, 'data', 'sim', 8),
  '4 sim nodes x 2 devices': (8, 2, 'sim', 'data', 2),
  '8 nodes x 1': (8, 8, 'data', 'sim', 1),
}


def run_on(layout_id, compressor, **kw):
  workers, devices, node, local, m = LAYOUTS[layout_id]
  tx = hitopk(compressor, (node, local, m), **kw)
  return testing.Run(tx, params(), workers=workers, devices=devices)


@pytest.mark.parametrize('layout_id', list(LAYOUTS))
@pytest.mark.parametrize('compressor', [C.topk(ratio=1.0), C.mstopk(ratio=1.0)], ids=repr)
def test_ratio_one_is_the_dense_mean_over_all_workers(layout_id, compressor):
  run = run_on(layout_id, compressor)
  grads = worker_grads(8)
  run(grads)
  for k, g in grads.items():
    expected = g.mean(0)  # NumPy mean over the 8 workers
    for w in range(8):
      np.testing.assert_allclose(
        np.asarray(run.updates[k][w]), expected, atol=1e-6, rtol=0, err_msg=f'{k} worker {w}'
      )


# 2 nodes x 2 local, 8 elements, shards of s = 4, ratio 0.25: one element per shard.
HAND_G = np.array(
  [
    [1, 2, 0, 0, 0, 0, 3, 0],  # worker 0: node 0, local 0
    [0, 1, 0, 4, 1, 0, 0, 0],  # worker 1: node 0, local 1
    [0, 0, 5, 0, 0, 2, 0, 0],  # worker 2: node 1, local 0
    [2, 0, 0, 0, 0, 3, 0, 1],  # worker 3: node 1, local 1
  ],
  np.float32,
)
# Node sums: node 0 [1, 3, 0, 4 | 1, 0, 3, 0], node 1 [2, 0, 5, 0 | 0, 5, 0, 1].
# Top-1 per shard: node 0 sends 4@3 (rail 0), 3@2 (rail 1); node 1 sends 5@2, 5@1.
# Rail 0 sums [0, 0, 5, 4], rail 1 [0, 5, 3, 0]; over 4 workers:
HAND_OUT_1 = np.array([0, 0, 5, 4, 0, 5, 3, 0], np.float32) / 4
HAND_RESIDUAL_1 = np.array([[1, 3, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 1]], np.float32)
# Step 2 with zero gradients sends the residuals' top-1: 3@1 and 2@0 on rail 0, 1@0 and 1@3
# on rail 1 (ties in worker 0's [1, 3, 0, 0] do not arise).
HAND_OUT_2 = np.array([2, 3, 0, 0, 1, 0, 0, 1], np.float32) / 4
HAND_RESIDUAL_2 = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], np.float32)


@pytest.mark.parametrize('compressor', [C.topk(ratio=0.25), C.mstopk(ratio=0.25)], ids=repr)
def test_two_nodes_of_two_by_hand(compressor):
  tx = hitopk(compressor, ('data', 'sim', 2))
  run = testing.Run(tx, jnp.zeros(8), workers=4, devices=2)
  run(jnp.asarray(HAND_G))
  for w in range(4):
    np.testing.assert_array_equal(np.asarray(run.updates[w]), HAND_OUT_1, err_msg=f'worker {w}')
  np.testing.assert_array_equal(np.asarray(run.state.residual), HAND_RESIDUAL_1)
  run(jnp.zeros((4, 8)))
  for w in range(4):
    np.testing.assert_array_equal(np.asarray(run.updates[w]), HAND_OUT_2, err_msg=f'worker {w}')
  np.testing.assert_array_equal(np.asarray(run.state.residual), HAND_RESIDUAL_2)
  assert run.history == [[1, 1, 1], [1, 1, 1]]  # reduce-scatter, all-gather, rail all-gather


def test_without_error_feedback_nothing_is_kept():
  tx = hitopk(C.topk(ratio=0.25), ('data', 'sim', 2), error_feedback=False)
  run = testing.Run(tx, jnp.zeros(8), workers=4, devices=2)
  run(jnp.asarray(HAND_G))
  np.testing.assert_array_equal(np.asarray(run.updates[0]), HAND_OUT_1)
  assert run.state.residual == ()
  run(jnp.zeros((4, 8)))
  np.testing.assert_array_equal(np.asarray(run.updates[0]), np.zeros(8, np.float32))


def placed(residual, m, s, local_is_sim=True):
  """[workers, m·s]: each worker's shard residual at its shard's positions.

  Worker w = device · per_device + sim: local rank w % m when 'sim' is the local axis,
  w // (workers / m) when the devices are.
  """
  out = np.zeros((residual.shape[0], m * s), np.float32)
  for w, r in enumerate(residual):
    j = w % m if local_is_sim else w // (residual.shape[0] // m)
    out[w, j * s : (j + 1) * s] = r
  return out


@pytest.mark.parametrize('layout_id', ['2 nodes x 4 sim', '4 sim nodes x 2 devices'])
@pytest.mark.parametrize(
  'compressor', [C.mstopk(ratio=0.1), C.topk(ratio=0.05), C.dgc(ratio=0.1)], ids=repr
)
def test_error_feedback_conserves_mass(layout_id, compressor):
  """n·m·(mean sent) + Σ new residuals == Σ (gradient + old residual), step after step.

  The residuals are node-sum units on each worker's own shard, so the sum over all
  workers of the placed residuals is what the nodes did not get across.
  """
  _, _, _, local, m = LAYOUTS[layout_id]
  s = -(-D // m)
  place = lambda r: placed(np.asarray(r), m, s, local_is_sim=local == 'sim')
  run = run_on(layout_id, compressor)
  assert run.state.residual.shape == (8, s)
  for step in range(3):
    grads = worker_grads(8, seed=step)
    old = place(run.state.residual)
    run(grads)
    new = place(run.state.residual)
    g = np.stack([flat(grads, w) for w in range(8)])
    sent = flat(run.updates, 0)
    for w in range(8):  # every worker got the same mean
      np.testing.assert_array_equal(flat(run.updates, w), sent)
    np.testing.assert_allclose(
      8 * sent + new.sum(0)[:D], g.sum(0) + old.sum(0)[:D], atol=2e-5, rtol=1e-5
    )
    assert np.all(new[:, D:] == 0)  # padding never picks up mass
    assert np.count_nonzero(sent) <= (8 // m) * m * compressor.kept(s) < D / 2


def test_fixed_k_is_split_over_the_local_ranks():
  run = testing.Run(hitopk(C.topk(k=3), ('data', 'sim', 2)), jnp.zeros(8), workers=4, devices=2)
  ((rs, ag), (rail,)) = (run.state.intra, run.state.inter)
  assert (rs.nbytes, ag.nbytes, rail.nbytes) == (32, 16, 2 * (4 + 4))  # ⌈3/2⌉ = 2 per shard


# --- the wire: a real 2-D mesh of 8 CPU devices, 2 nodes x 4 local ---------------------

N, M = 2, 4
HLO_D = 4000  # shards of s = 1000; ratio 0.01 keeps k/m = 10 per shard, k = 40 per worker


def mesh_2d():
  devices = np.asarray(jax.devices()[: N * M]).reshape(N, M)
  return Mesh(devices, ('node', 'local'), axis_types=(AxisType.Auto,) * 2)


def on_mesh(tx, grads_NxMxD):
  """tx.update on a ('node', 'local') mesh, one worker per device: (jitted step, init state)."""
  state = jax.vmap(jax.vmap(tx.init))(grads_NxMxD)
  one = lambda t: jax.tree.map(lambda x: x[0, 0], t)
  back = lambda t: jax.tree.map(lambda x: x[None, None], t)

  def body(g, s):
    out, new = tx.update(one(g), one(s))
    return back(out), back(new)

  spec = P('node', 'local')
  step = jax.shard_map(body, mesh=mesh_2d(), in_specs=spec, out_specs=spec, check_vma=False)
  return jax.jit(step), state


_RS = re.compile(
  r'= (\w+)\[([\d,]+)\]\S* reduce-scatter\(.*replica_groups=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}'
)
_GROUPS = re.compile(r'replica_groups=\{(\{[\d,]+\}(?:,\{[\d,]+\})*)\}')


def groups(line):
  listed = _GROUPS.search(line).group(1)
  return {tuple(int(i) for i in g.split(',')) for g in re.findall(r'\{([\d,]+)\}', listed)}


def reduce_scatters(text):
  """(operand bytes, replica groups) of each reduce-scatter (comm.hlo lists only comm.KINDS)."""
  found = []
  for dtype, size, listed in _RS.findall(text):
    assert dtype == 'f32'
    g = groups('replica_groups={' + listed + '}')
    result = 4 * int(np.prod([int(d) for d in size.split(',')]))
    found.append((result * len(next(iter(g))), g))  # operand = result x group size
  return found


def all_gather_groups(text):
  """{result shape: replica groups} of each all-gather."""
  shape = re.compile(r'= \w+\[([\d,]+)\]')
  return {
    shape.search(line).group(1): groups(line)
    for line in text.splitlines()
    if ' all-gather(' in line
  }


INTRA = {(0, 1, 2, 3), (4, 5, 6, 7)}  # a node's four devices
RAILS = {(0, 4), (1, 5), (2, 6), (3, 7)}  # one device per node, same local rank


def test_compiled_hlo_reduce_scatters_inside_nodes_and_gathers_k_over_m_along_rails():
  grads = jnp.asarray(np.random.default_rng(0).standard_normal((N, M, HLO_D)), jnp.float32)
  tx = jd.sync.hitopk_allreduce(
    C.mstopk(ratio=0.01), node_axis='node', local_axis='local', local_size=M
  )
  step, state = on_mesh(tx, grads)
  text = step.lower(grads, state).compile().as_text()
  # the intra-node reduce-scatter of the whole (padded) gradient, among a node's devices
  assert reduce_scatters(text) == [(4 * HLO_D, INTRA)]
  # all-gathers: 10 values + 10 indices along each rail, then 1000 floats inside the node
  found = collections.Counter((c.kind, c.dtypes, c.nbytes) for c in comm.hlo.collectives(text))
  rail_bytes = {('f32',): 40, ('s32',): 40, ('f32', 's32'): 80, ('u32',): 80}  # ('u32',): packed
  rail = [k for k in found if k[0] == 'all-gather' and rail_bytes.get(k[1]) == k[2]]
  assert sum(k[2] * found[k] for k in rail) == 80
  assert found[('all-gather', ('f32',), 4 * HLO_D // M)] == 1
  assert sum(found.values()) == len(rail) + 1  # nothing else crosses a device
  # the rails gather 2 nodes x (10 values and 10 positions, one buffer), the node 4 ranks x 1000
  assert all_gather_groups(text) == {'2,20': RAILS, '4,1000': INTRA}
  # the transform reports the same payloads, by link class
  out, new = step(grads, state)
  intra = [(t.op or t.kind, t.nbytes, int(t.count[0, 0])) for t in new.intra]
  inter = [(t.kind, t.nbytes, int(t.count[0, 0])) for t in new.inter]
  assert intra == [('reduce-scatter', 4 * HLO_D, 1), ('all-gather', 4 * HLO_D // M, 1)]
  assert inter == [('all-gather', 80, 1)]
  assert np.count_nonzero(np.asarray(out[1, 3])) <= N * M * 10


def numpy_hitopk(g_NxMxD, kept):
  """HiTopKComm in NumPy: node sums, exact top-`kept` of each shard, summed over nodes / n·m."""
  n, m, d = g_NxMxD.shape
  s = -(-d // m)
  node_sums = np.pad(g_NxMxD.sum(1), ((0, 0), (0, m * s - d))).reshape(n, m, s)
  out = np.zeros((m, s))
  for i in range(n):
    for j in range(m):
      top = np.argsort(-np.abs(node_sums[i, j]), kind='stable')[:kept]
      out[j, top] += node_sums[i, j, top]
  return out.reshape(-1)[:d] / (n * m)


def test_on_a_2d_mesh_it_matches_a_numpy_reference():
  g = np.random.default_rng(1).standard_normal((N, M, HLO_D)).astype(np.float32)
  tx = jd.sync.hitopk_allreduce(
    C.topk(ratio=0.01), node_axis='node', local_axis='local', local_size=M
  )
  step, state = on_mesh(tx, jnp.asarray(g))
  out, _ = step(jnp.asarray(g), state)
  expected = numpy_hitopk(g.astype(np.float64), kept=10)
  for i in range(N):
    for j in range(M):
      np.testing.assert_allclose(np.asarray(out[i, j]), expected, atol=1e-6, rtol=1e-6)


def test_rail_payload_is_flat_topk_payload_over_m():
  """Flat Top-k all-gathers k values + k indices per worker over all 8; HiTopK k/m per rail."""
  grads = worker_grads(8)
  flat_tx = jd.sync.compressed_allreduce(C.topk(ratio=0.01 * 8), axis_name=runtime.AXES)
  run = testing.Run(flat_tx, params(), workers=8, devices=8)
  found = comm.hlo.collectives(run.hlo(grads))
  flat_bytes = sum(c.nbytes for c in found if c.kind == 'all-gather')
  k = C.num_kept(D, 0.08)
  assert flat_bytes == 8 * k
  hi = testing.Run(hitopk(C.topk(ratio=0.08), ('data', 'sim', 4)), params(), workers=8, devices=2)
  hi_found = comm.hlo.collectives(hi.hlo(grads))  # the sim axis is inside a device: rails only
  # each device (node) carries its 4 simulated workers' rails: values and indices, k/m each
  rail_bytes = sum(c.nbytes for c in hi_found if c.kind == 'all-gather')
  assert rail_bytes == 4 * 8 * C.num_kept(-(-D // 4), 0.08) == 4 * 8 * 2
  per_worker = rail_bytes // 4
  assert 4 * per_worker <= flat_bytes  # a worker's rail payload: about 1/m of flat Top-k's


def test_hierarchical_time_prices_the_recorded_transfers_by_hand():
  tx = jd.sync.hitopk_allreduce(C.topk(ratio=0.01), node_axis='n', local_axis='l', local_size=4)
  state = tx.init({'w': jnp.zeros(4000)})  # s = 1000, 10 kept per shard: 80 bytes per rail
  intra_net = jd.netmodel.Network(latency=1e-6, bandwidth=100e9)
  inter_net = jd.netmodel.Network(latency=1e-5, bandwidth=1e9)
  t = jd.netmodel.hierarchical_time(
    state.intra,
    state.inter,
    nodes=16,
    local=4,
    intra_net=intra_net,
    inter_net=inter_net,
    counts=([1, 1], [1]),
  )
  reduce_scatter = 3 * 1e-6 + 3 / 4 * 16000 / 100e9  # ring: (m-1)α + (m-1)/m·Mβ
  intra_gather = 2 * 1e-6 + 3 * 4000 / 100e9  # α log m + (m-1)·Mβ
  rail_gather = 4 * 1e-5 + 15 * 80 / (1e9 / 4)  # 4 rails share the NIC
  assert t == pytest.approx(reduce_scatter + intra_gather + rail_gather, rel=1e-12)
  own_nics = jd.netmodel.hierarchical_time(
    state.intra,
    state.inter,
    nodes=16,
    local=4,
    intra_net=intra_net,
    inter_net=inter_net,
    shared_nic=False,
    counts=([1, 1], [1]),
  )
  assert own_nics == pytest.approx(t - 15 * 80 * 3 / 1e9, rel=1e-12)
  flat = jd.netmodel.flat_time(
    [comm.transfer(comm.ALL_GATHER, 320)], nodes=16, local=4, inter_net=inter_net
  )
  assert flat == pytest.approx(6 * 1e-5 + 63 * 320 / 1e9, rel=1e-12)


@pytest.mark.parametrize(
  'make, message',
  [
    (
      lambda: hitopk(C.mstopk(ratio=0.0), ('data', 'sim', 2)),
      r'ratio must be in \(0, 1\], got 0.0',
    ),
    (lambda: hitopk(C.topk(ratio=1.5), ('data', 'sim', 2)), r'ratio must be in \(0, 1\], got 1.5'),
    (
      lambda: hitopk(C.qsgd(levels=7), ('data', 'sim', 2)),
      'compressor must be a jaxdist.compress sparsifier',
    ),
    (
      lambda: hitopk('mstopk', ('data', 'sim', 2)),
      'compressor must be a jaxdist.compress sparsifier',
    ),
    (
      lambda: hitopk(C.mstopk(ratio=0.1), ('data', 'data', 2)),
      'node_axis and local_axis must differ',
    ),
    (
      lambda: hitopk(C.mstopk(ratio=0.1), (runtime.AXES, 'sim', 2)),
      'node_axis must be one axis name',
    ),
    (
      lambda: hitopk(C.mstopk(ratio=0.1), ('data', 'sim', 0)),
      'local_size must be an int >= 1, got 0',
    ),
    (
      lambda: hitopk(C.mstopk(ratio=0.1), ('data', 'sim', 2.0)),
      'local_size must be an int >= 1, got 2.0',
    ),
  ],
)
def test_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_a_mesh_that_does_not_hold_local_size_per_node_fails_at_trace_time():
  tx = hitopk(C.mstopk(ratio=0.1), ('data', 'sim', 4))
  run = testing.Run(tx, params(), workers=8, devices=8)  # 8 nodes of 1, not 2 of 4
  with pytest.raises(
    ValueError, match=r"local_axis 'sim' holds 1 workers per node, but local_size=4"
  ):
    run(worker_grads(8))


def test_a_lone_worker_passes_its_gradient_through_and_sends_nothing():
  """One worker in all (how the trainer times a worker's compute): nothing to reduce or send."""
  run = testing.Run(hitopk(C.topk(ratio=0.01), ('data', 'sim', 4)), params(), workers=1)
  grads = worker_grads(1)
  run(grads)
  for k, g in grads.items():
    np.testing.assert_array_equal(np.asarray(run.updates[k]), g)
  np.testing.assert_array_equal(np.asarray(run.state.residual), np.zeros((1, -(-D // 4))))
  assert run.history == [[0, 0, 0]] and int(run.state.count[0]) == 1
  assert [t.link for t in comm.find_transfers(run.state)] == ['intra', 'intra', 'inter']


def test_k_larger_than_a_shard_fails_at_init():
  tx = hitopk(C.topk(k=10), ('data', 'sim', 2))  # 5 per shard of 4
  with pytest.raises(ValueError, match=r'k=5 is larger than the tensor \(4 elements\)'):
    jax.eval_shape(tx.init, jnp.zeros(8))
