"""Collectives over mixed device/simulated axes, and wire accounting vs the HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime


@pytest.mark.parametrize('devices', [8, 1, 2])
def test_psum_pmean_all_gather_over_all_workers(devices):
  workers = runtime.layout(8, devices=devices)
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)

  def per_worker(xi):
    total, t_sum = comm.psum(xi, workers.axis_name)
    mean, _ = comm.pmean(xi, workers.axis_name)
    gathered, t_gather = comm.all_gather(xi, workers.axis_name)
    largest, t_max = comm.pmax(jnp.abs(xi - 10.0), workers.axis_name)
    index = comm.axis_index(workers.axis_name)
    assert comm.axis_size(workers.axis_name) == 8
    assert (t_sum.kind, t_sum.nbytes) == ('all-reduce', 12)
    assert (t_gather.kind, t_gather.nbytes) == ('all-gather', 12)
    assert (t_max.kind, t_max.nbytes) == ('all-reduce', 12)
    return total, mean, gathered, index, largest

  total, mean, gathered, index, largest = jax.jit(workers.map(per_worker, in_axes=(0,)))(
    jax.device_put(x, workers.sharding)
  )
  # worker i holds |[3i, 3i + 1, 3i + 2] - 10|: largest at i = 7, [11, 12, 13]
  np.testing.assert_array_equal(largest, np.broadcast_to([11.0, 12.0, 13.0], (8, 3)))
  np.testing.assert_allclose(total, np.broadcast_to(x.sum(0), (8, 3)))
  np.testing.assert_allclose(mean, np.broadcast_to(x.mean(0), (8, 3)), rtol=1e-6)
  np.testing.assert_array_equal(gathered, np.broadcast_to(x, (8, 8, 3)))
  np.testing.assert_array_equal(index, np.arange(8))


def test_transfer_kinds_are_the_hlo_collectives():
  with pytest.raises(ValueError, match='kind must be one of'):
    comm.transfer('broadcast', 8)


def test_tree_nbytes_and_total_bytes():
  tree = {'a': jnp.zeros((3, 4), jnp.float32), 'b': jnp.zeros((5,), jnp.bfloat16)}
  assert comm.tree_nbytes(tree) == 3 * 4 * 4 + 5 * 2
  records = [comm.transfer('all-reduce', 100, 1), comm.transfer('all-gather', 7, 0)]
  assert comm.total_bytes(records) == 100
  assert comm.total_bytes(records, counts=[2, 3]) == 221


def test_allreduce_matches_pmean_and_hlo_bytes():
  workers = runtime.layout(8, devices=8)
  params = {'w': jnp.ones((8, 5, 3)), 'b': jnp.ones((8, 3))}
  grads = jax.tree.map(lambda p: jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape), params)
  tx = jd.sync.allreduce(axis_name=workers.axis_name)
  state = jax.vmap(tx.init)(params)

  def update(g, s, p):
    return tx.update(g, s, p)

  step = jax.jit(workers.map(update, in_axes=(0, 0, 0)))
  args = [jax.device_put(t, workers.sharding) for t in (grads, state, params)]
  out, new_state = step(*args)
  for key in params:
    np.testing.assert_allclose(out[key], np.broadcast_to(grads[key].mean(0), grads[key].shape))
  (record,) = comm.find_transfers(new_state)
  np.testing.assert_array_equal(record.count, np.ones(8))
  assert record.nbytes == comm.tree_nbytes(jax.tree.map(lambda x: x[0], params)) == (15 + 3) * 4

  hlo = step.lower(*args).compile().as_text()
  collectives = comm.hlo.collectives(hlo)
  assert collectives, hlo
  assert {c.kind for c in collectives} == {'all-reduce'}
  assert {d for c in collectives for d in c.dtypes} == {'f32'}
  assert sum(c.nbytes for c in collectives) == record.nbytes


def test_init_does_not_communicate():
  tx = optax.chain(jd.sync.allreduce(axis_name=('data', 'sim')), optax.sgd(0.1))
  state = jax.eval_shape(tx.init, {'w': jnp.zeros((4,))})  # outside any mesh
  (record,) = comm.find_transfers(state)
  assert record.nbytes == 16


def test_hlo_parser_reads_operand_types_and_async_pairs():
  text = """
  %p = f32[10,2]{1,0} parameter(0)
  %i = s32[7]{0} parameter(1)
  %ag = (f32[80,2]{1,0}, s32[56]{0}) all-gather(%p, %i), dimensions={0}
  %ars = f32[10,2]{1,0} all-reduce-start(f32[10,2]{1,0} %p), to_apply=%add
  %ard = f32[10,2]{1,0} all-reduce-done(%ars)
  ROOT %cp = s8[4]{0} collective-permute(s8[4]{0} %q), source_target_pairs={{0,1}}
  """
  found = comm.hlo.collectives(text)
  assert [(c.kind, c.dtypes, c.nbytes) for c in found] == [
    ('all-gather', ('f32', 's32'), 80 + 28),
    ('all-reduce', ('f32',), 80),
    ('collective-permute', ('s8',), 4),
  ]


def test_hlo_parser_reads_operands_past_the_fifth():
  # XLA prints `/*index=5*/` before the sixth operand of a long list; it still counts
  defs = '\n'.join(f'  %p{i} = f32[{i + 1}]{{0}} parameter({i})' for i in range(7))
  args = ', '.join(f'/*index={i}*/%p{i}' if i >= 5 else f'%p{i}' for i in range(7))
  text = f'{defs}\n  %ar = (f32[1]{{0}}) all-reduce({args}), to_apply=%add\n'
  (found,) = comm.hlo.collectives(text)
  assert found.dtypes == ('f32',) * 7
  assert found.nbytes == 4 * (1 + 2 + 3 + 4 + 5 + 6 + 7)


# --- all_to_all ------------------------------------------------------------------------------


def exchange_on(devices, tree, axis_name=runtime.AXES, subgroup=False):
  """comm.all_to_all of every worker's `tree` ([8, 8, ...] per leaf): (out, Transfer, HLO)."""
  workers = runtime.layout(8, devices=devices)
  records = []

  def per_worker(t):
    out, sent = comm.all_to_all(t, axis_name, subgroup=subgroup)
    records.append(sent)
    return out

  step = jax.jit(workers.map(per_worker, in_axes=(0,)))
  args = jax.device_put(tree, workers.sharding)
  return step(args), records[0], step.lower(args).compile().as_text()


@pytest.mark.parametrize('devices', [8, 1, 2, 4])
def test_all_to_all_transposes_the_worker_by_row_grid(devices):
  # worker i's row j is 100·i + j (and a second leaf of another dtype and shape)
  x = np.add.outer(100 * np.arange(8), np.arange(8)).astype(np.float32)
  tree = {'x': x, 'q': np.arange(8 * 8 * 2, dtype=np.int8).reshape(8, 8, 2)}
  out, sent, _ = exchange_on(devices, tree)
  # worker i's row m is worker m's row i: 100·m + i
  np.testing.assert_array_equal(out['x'], x.T)
  np.testing.assert_array_equal(out['q'], np.swapaxes(tree['q'], 0, 1))
  assert (sent.kind, sent.nbytes) == ('all-to-all', 8 * 4 + 8 * 2)


@pytest.mark.parametrize('devices', [8, 2])
def test_all_to_all_payload_is_the_hlo_operand(devices):
  tree = np.zeros((8, 8, 3), np.float32)
  _, sent, text = exchange_on(devices, tree)
  found = comm.hlo.collectives(text)
  assert {c.kind for c in found} == {'all-to-all'}
  # only the device axis leaves a device: its operand carries the device's 8 / devices workers
  assert sum(c.nbytes for c in found) == (8 // devices) * sent.nbytes == (8 // devices) * 96


def test_all_to_all_over_one_level_of_a_hierarchy():
  # 2 devices x 4 simulated: worker (d, s) exchanges with (d', s) only, rows indexed by d'
  x = np.add.outer(100 * np.arange(8), np.arange(2)).astype(np.float32)  # [8 workers, 2 rows]
  out, sent, _ = exchange_on(2, x, axis_name=runtime.DATA, subgroup=True)
  # worker 4·d + s gets, as row e, worker (e, s)'s row d: 100·(4·e + s) + d
  want = [[100 * (4 * e + s) + d for e in range(2)] for d in range(2) for s in range(4)]
  np.testing.assert_array_equal(out, want)
  assert sent.nbytes == 8


def test_all_to_all_needs_a_row_per_worker():
  with pytest.raises(ValueError, match=r'leading axis of the 8 workers .* got shape \(4, 3\)'):
    exchange_on(1, np.zeros((8, 4, 3), np.float32))


def _lowered_psum(tree, pack):
  workers = runtime.layout(8, devices=8)
  step = jax.jit(workers.map(lambda t: comm.psum(t, workers.axis_name, pack=pack)[0], in_axes=(0,)))
  args = jax.device_put(jax.tree.map(lambda x: jnp.broadcast_to(x, (8, *x.shape)), tree),
                        workers.sharding)  # fmt: skip
  return step(args), comm.hlo.collectives(step.lower(args).compile().as_text())


def test_a_packed_tree_is_one_all_reduce_per_dtype_with_the_same_sums():
  """3 float32 leaves and 2 int32 ones: packed, one all-reduce of 4 * (6 + 1 + 4) bytes and one
  of 4 * (2 + 3); unpacked, XLA's one operand per leaf. Sums by hand: 8 workers hold the same."""
  tree = {
    'a': jnp.arange(6.0).reshape(2, 3), 'b': jnp.float32(1.5), 'c': jnp.arange(2, dtype=jnp.int32),
    'd': jnp.full((4,), -0.25), 'e': jnp.array([7, 8, 9], jnp.int32),
  }  # fmt: skip
  packed, found = _lowered_psum(tree, True)
  per_op = sorted((d, n) for c in found for d, n in zip(c.dtypes, _op_bytes(c), strict=True))
  assert per_op == [('f32', 4 * 11), ('s32', 4 * 5)]
  plain, found_plain = _lowered_psum(tree, False)
  assert sum(len(c.dtypes) for c in found_plain) == 5  # one operand per leaf
  want = {'a': 8 * np.arange(6.0).reshape(2, 3), 'b': 12.0, 'c': [0, 8], 'd': [-2.0] * 4,
          'e': [56, 64, 72]}  # fmt: skip
  for got in (packed, plain):
    for k, v in want.items():
      np.testing.assert_array_equal(got[k][3], np.asarray(v, got[k].dtype))
      assert got[k].dtype == tree[k].dtype and got[k].shape[1:] == tree[k].shape


def _op_bytes(c):
  """Bytes of each operand of one collective (all of a dtype here: equal split by dtype)."""
  assert len(c.dtypes) == 1, c
  return [c.nbytes]


def test_packs_are_bounded_by_size_and_split_by_dtype():
  leaves = [jnp.zeros(10), jnp.zeros(5, jnp.int32), jnp.zeros(20), jnp.zeros(3), jnp.zeros(2)]
  assert comm.pack_groups(leaves, limit=4 * 30) == [[0, 2], [1], [3, 4]]
  assert comm.pack_groups(leaves) == [[0, 2, 3, 4], [1]]
  assert comm.pack_groups([jnp.zeros(50), jnp.zeros(1)], limit=4 * 10) == [[0], [1]]


def test_a_gather_sends_values_and_positions_of_one_width_as_one_buffer_bit_for_bit():
  """float32 values (a NaN among them) and int32 positions: one all-gather of
  4 x (3 + 2) bytes from each worker, each worker's row bit for bit; bfloat16 and bool apart."""
  workers = runtime.layout(8, devices=8)
  # (not -0.0: XLA's CPU all-gather returns +0.0 for it, packed or not)
  vals = np.array([[np.nan, 3e38, w + 0.5] for w in range(8)], np.float32)
  idx = np.array([[-w, 2**31 - 1 - w] for w in range(8)], np.int32)
  half = np.arange(8, dtype=np.float32).reshape(8, 1).astype(jnp.bfloat16)
  flags = np.array([[w % 2 == 0] for w in range(8)])
  tree = (vals, idx, half, flags)
  step = jax.jit(workers.map(lambda t: comm.all_gather(t, workers.axis_name, pack=True)[0],
                             in_axes=(0,)))  # fmt: skip
  args = jax.device_put(tree, workers.sharding)
  got = step(args)
  found = comm.hlo.collectives(step.lower(args).compile().as_text())
  # bfloat16 and bool in gathers of their own (XLA's CPU compiler widens bfloat16's to float32)
  assert [c.kind for c in found] == ['all-gather'] * 3, found
  assert [(c.dtypes, c.nbytes) for c in found if c.dtypes == ('u32',)] == [(('u32',), 4 * 5)]
  for w in (0, 5):  # every worker holds every worker's rows, bit for bit, in its own dtype
    np.testing.assert_array_equal(np.asarray(got[0][w]).view(np.uint32), vals.view(np.uint32))
    np.testing.assert_array_equal(got[1][w], idx)
    np.testing.assert_array_equal(np.asarray(got[2][w], np.float32), np.asarray(half, np.float32))
    np.testing.assert_array_equal(got[3][w], flags)
  assert [x.dtype for x in got] == [jnp.float32, jnp.int32, jnp.bfloat16, jnp.bool_]
