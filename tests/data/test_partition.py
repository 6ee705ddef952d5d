"""Data partitions: IID slices, SelSync's SelDP rotation, non-IID labels, data injection."""

from __future__ import annotations

import numpy as np
import pytest

from jaxdist import data


def perm(n: int, epoch: int, seed: int = 0) -> np.ndarray:
  """The documented epoch permutation (the one `data.batch_indices` uses)."""
  return np.random.default_rng((seed, epoch)).permutation(n)


def eq(actual, expected):
  np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))


def indices(sampler, step, sizes):
  return [i.tolist() for i in sampler.indices(step, sizes).indices]


# --- Partition and make_sampler arguments -------------------------------------------------------


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(inject_alpha=1.5), r'inject_alpha must be in \[0, 1\].*got 1.5'),
    (dict(inject_alpha=float('nan')), 'inject_alpha must be in'),
    (dict(inject_beta=-0.1), r'inject_beta must be in \[0, 1\].*got -0.1'),
    (dict(kind='dirichlet'), "kind must be one of .*'dirichlet'"),
    (dict(labels_per_worker=0), 'labels_per_worker must be >= 1'),
    (dict(labels_per_worker=1.5), 'labels_per_worker must be an int'),
  ],
)
def test_partition_names_the_bad_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    data.Partition(**kwargs)


def test_make_sampler_and_sizes_errors():
  labels = np.arange(20) % 4
  with pytest.raises(ValueError, match='num_workers must be >= 1'):
    data.make_sampler(data.Partition(), labels, 0)
  with pytest.raises(ValueError, match='1-D integer array'):
    data.make_sampler(data.Partition(), labels.astype(np.float32), 2)
  with pytest.raises(ValueError, match='labels_per_worker=5 is more than the 4 classes'):
    data.make_sampler(data.Partition('labels', labels_per_worker=5), labels, 2)
  sampler = data.make_sampler(data.Partition(), labels, 2)
  with pytest.raises(ValueError, match=r'one entry per worker \(2\)'):
    sampler.indices(0, [2, 2, 2])
  with pytest.raises(ValueError, match='>= 1'):
    sampler.indices(0, [2, 0])
  with pytest.raises(ValueError, match='must be integers'):
    sampler.indices(0, [2.5, 2])
  with pytest.raises(ValueError, match='step must be >= 0'):
    sampler.indices(-1, [2, 2])
  with pytest.raises(data.DatasetError, match='larger than the 20 examples'):
    sampler.indices(0, [11, 10])


# --- iid --------------------------------------------------------------------------------------


@pytest.mark.parametrize('step', [0, 1, 7, 40, 1001])
def test_iid_equal_sizes_are_bitwise_worker_indices(step):
  sampler = data.make_sampler(data.Partition('iid', seed=3), np.zeros(100, np.int32), 4)
  batch = sampler.indices(step, [5] * 4)
  expected = data.worker_indices(step, seed=3, num_examples=100, workers=4, per_worker=5)
  for k in range(4):
    assert batch.indices[k].dtype == expected.dtype
    eq(batch.indices[k], expected[k])
  eq(batch.injected, [0, 0, 0, 0])


def test_iid_unequal_sizes_are_consecutive_slices_of_the_global_batch():
  sampler = data.make_sampler(data.Partition('iid', seed=1), np.zeros(50, np.int32), 3)
  for step, sizes in [(0, [1, 2, 3]), (4, [3, 2, 1]), (9, [7, 1, 4]), (10, [1, 1, 1])]:
    flat = data.batch_indices(step, seed=1, num_examples=50, batch_size=sum(sizes))
    got = sampler.indices(step, sizes).indices
    eq(np.concatenate(got), flat)
    assert [len(i) for i in got] == sizes
  # by hand: step 0 of 12 examples, sizes [1, 2, 3] are positions [0], [1, 2], [3, 4, 5]
  small = data.make_sampler(data.Partition('iid'), np.zeros(12, np.int32), 3)
  p = perm(12, 0)
  assert indices(small, 0, [1, 2, 3]) == [
    p[[0]].tolist(),
    p[[1, 2]].tolist(),
    p[[3, 4, 5]].tolist(),
  ]


# --- seldp ------------------------------------------------------------------------------------


def test_seldp_rotation_by_hand_n12_k3_b2():
  # chunks of 4: positions 0-3, 4-7, 8-11 of the epoch permutation; worker k reads chunk k, k+1,
  # k+2 (mod 3) as one stream, 2 positions a step, 6 steps an epoch.
  positions = [
    [[0, 1], [4, 5], [8, 9]],
    [[2, 3], [6, 7], [10, 11]],
    [[4, 5], [8, 9], [0, 1]],
    [[6, 7], [10, 11], [2, 3]],
    [[8, 9], [0, 1], [4, 5]],
    [[10, 11], [2, 3], [6, 7]],
    [[0, 1], [4, 5], [8, 9]],  # epoch 1: a fresh permutation
  ]
  sampler = data.make_sampler(data.Partition('seldp'), np.zeros(12, np.int32), 3)
  for step, rows in enumerate(positions):
    p = perm(12, step // 6)
    assert indices(sampler, step, [2, 2, 2]) == [p[r].tolist() for r in rows], step
    eq(sampler.indices(step, [2, 2, 2]).injected, [0, 0, 0])
  assert not np.array_equal(perm(12, 0), perm(12, 1))


def test_seldp_unequal_sizes_read_a_window_of_the_largest_by_hand():
  # chunk 4, window max(sizes) = 3, so 12 // 3 = 4 steps an epoch; worker k takes the first
  # sizes[k] positions of its window (k·4 + 3·j + [0, 1, 2]) mod 12.
  sampler = data.make_sampler(data.Partition('seldp'), np.zeros(12, np.int32), 3)
  p = perm(12, 0)
  assert indices(sampler, 0, [1, 2, 3]) == [
    p[[0]].tolist(),
    p[[4, 5]].tolist(),
    p[[8, 9, 10]].tolist(),
  ]
  assert indices(sampler, 1, [1, 2, 3]) == [
    p[[3]].tolist(),
    p[[7, 8]].tolist(),
    p[[11, 0, 1]].tolist(),
  ]
  with pytest.raises(data.DatasetError, match='larger than a chunk of 4'):
    sampler.indices(0, [5, 1, 1])


@pytest.mark.parametrize('n, k, b', [(60, 3, 4), (62, 3, 4), (40, 4, 10), (100, 8, 3)])
def test_seldp_is_disjoint_within_a_step_and_covers_the_dataset_per_epoch(n, k, b):
  sampler = data.make_sampler(data.Partition('seldp', seed=5), np.zeros(n, np.int32), k)
  used = k * (n // k)
  steps = used // b
  seen = [[] for _ in range(k)]
  for step in range(steps):
    rows = indices(sampler, step, [b] * k)
    flat = [i for row in rows for i in row]
    assert len(set(flat)) == k * b, f'step {step} overlaps across workers'
    for w in range(k):
      seen[w] += rows[w]
  for w in range(k):
    assert len(seen[w]) == len(set(seen[w])) == steps * b  # no example twice within an epoch
    if used % b == 0:  # every worker sees the whole (used part of the) dataset
      assert sorted(seen[w]) == sorted(perm(n, 0, seed=5)[:used].tolist())


def test_seldp_one_worker_is_iid():
  seldp = data.make_sampler(data.Partition('seldp', seed=2), np.zeros(30, np.int32), 1)
  iid = data.make_sampler(data.Partition('iid', seed=2), np.zeros(30, np.int32), 1)
  for step in range(12):
    assert indices(seldp, step, [4]) == indices(iid, step, [4])


# --- labels -----------------------------------------------------------------------------------


def test_ten_workers_one_label_each():
  labels = np.arange(40) % 10
  for seed in range(3):
    sampler = data.make_sampler(data.Partition('labels', seed=seed), labels, 10)
    assert sorted(sampler.worker_labels) == [(c,) for c in range(10)]
    for w, ((c,), shard) in enumerate(zip(sampler.worker_labels, sampler.shards, strict=True)):
      assert shard.tolist() == [c, c + 10, c + 20, c + 30], w
    for step in range(6):
      for w, idx in enumerate(sampler.indices(step, [2] * 10).indices):
        assert set(labels[idx].tolist()) == {sampler.worker_labels[w][0]}


def test_labels_are_dealt_evenly_and_split_disjointly():
  # 3 workers × 2 labels over 4 classes: 6 slots dealt π0 π1 | π2 π3 | π0 π1, so workers 0 and 2
  # share a pair of labels (4 examples each, split 2 + 2) and worker 1 holds the other two alone.
  labels = np.arange(16) % 4
  sampler = data.make_sampler(data.Partition('labels', labels_per_worker=2, seed=7), labels, 3)
  w0, w1, w2 = sampler.worker_labels
  assert w0 == w2 and len(set(w0)) == 2 and set(w0).isdisjoint(w1) and set(w0 + w1) == {0, 1, 2, 3}
  assert [len(s) for s in sampler.shards] == [4, 8, 4]
  assert set(sampler.shards[0].tolist()).isdisjoint(sampler.shards[2].tolist())
  assert sorted(sampler.shards[0].tolist() + sampler.shards[2].tolist()) == [
    i for i in range(16) if labels[i] in w0
  ]
  assert sampler.shards[1].tolist() == [i for i in range(16) if labels[i] in w1]
  # 4 workers × 3 labels over 5 classes: each label held by 2 or 3 workers (12 / 5 = 2.4)
  labels = np.arange(40) % 5
  sampler = data.make_sampler(data.Partition('labels', labels_per_worker=3), labels, 4)
  assert all(len(set(h)) == 3 for h in sampler.worker_labels)
  assert sorted(sum(1 for h in sampler.worker_labels if c in h) for c in range(5)) == [
    2,
    2,
    2,
    3,
    3,
  ]
  everything = np.concatenate(sampler.shards)
  assert sorted(everything.tolist()) == list(range(40))  # disjoint, and no label unused
  for w, shard in enumerate(sampler.shards):
    assert set(labels[shard].tolist()) == set(sampler.worker_labels[w])


def test_fewer_slots_than_labels_leaves_labels_unused():
  labels = np.arange(40) % 10
  sampler = data.make_sampler(data.Partition('labels'), labels, 2)
  assert [len(s) for s in sampler.shards] == [4, 4]
  assert len(set(sampler.worker_labels)) == 2


def test_a_worker_reads_its_shard_epoch_by_epoch():
  labels = np.arange(40) % 10  # shards of 4, batches of 2: 2 steps a shard epoch
  sampler = data.make_sampler(data.Partition('labels', seed=4), labels, 10)
  for epoch in range(3):
    rows = [sampler.indices(2 * epoch + j, [2] * 10).indices for j in range(2)]
    for w in range(10):
      seen = rows[0][w].tolist() + rows[1][w].tolist()
      assert sorted(seen) == sampler.shards[w].tolist(), (epoch, w)
  orders = [
    np.concatenate([sampler.indices(s, [2] * 10).indices[0] for s in (e, e + 1)]) for e in (0, 2, 4)
  ]
  assert not all(np.array_equal(orders[0], o) for o in orders[1:])  # reshuffled
  with pytest.raises(data.DatasetError, match='worker 3 holds 4 examples'):
    sampler.indices(0, [2, 2, 2, 5, 2, 2, 2, 2, 2, 2])


@pytest.mark.parametrize('kind', data.KINDS)
def test_a_pure_function_of_seed_step_and_sizes(kind):
  labels = np.arange(200) % 10
  partition = data.Partition(kind, seed=11, inject_alpha=0.5, inject_beta=0.5)
  forward = data.make_sampler(partition, labels, 5)
  backward = data.make_sampler(partition, labels, 5)  # a resumed run, asking out of order
  steps = list(range(0, 60, 3))
  sizes = lambda s: [4 + (s + k) % 3 for k in range(5)]
  got = {s: indices(forward, s, sizes(s)) for s in steps}
  for s in reversed(steps):
    assert indices(backward, s, sizes(s)) == got[s], s
    eq(backward.indices(s, sizes(s)).injected, forward.indices(s, sizes(s)).injected)
  other = data.make_sampler(data.Partition(kind, seed=12), labels, 5)
  assert any(indices(other, s, sizes(s)) != got[s] for s in steps)


# --- injection --------------------------------------------------------------------------------


@pytest.mark.parametrize('kind', data.KINDS)
@pytest.mark.parametrize('alpha, beta', [(0.0, 0.5), (0.5, 0.0), (0.0, 0.0)])
def test_no_injection_is_the_plain_batch(kind, alpha, beta):
  labels = np.arange(100) % 10
  plain = data.make_sampler(data.Partition(kind, seed=1), labels, 5)
  off = data.make_sampler(
    data.Partition(kind, seed=1, inject_alpha=alpha, inject_beta=beta), labels, 5
  )
  for step in range(5):
    assert indices(off, step, [2, 3, 2, 3, 2]) == indices(plain, step, [2, 3, 2, 3, 2])
    eq(off.indices(step, [2, 3, 2, 3, 2]).injected, [0] * 5)
  assert off.senders(0).tolist() == []


def test_injection_by_hand_one_sender_n12_k3_b2():
  # α = 1/3 of 3 workers: 1 sender; β = 1 and Eq. 3: b' = ceil(2 / (1 + 1)) = 1, so the sender
  # shares its first example; the others train on 1 of their own + the received one.
  sampler = data.make_sampler(
    data.Partition('seldp', inject_alpha=1 / 3, inject_beta=1.0), np.zeros(12, np.int32), 3
  )
  # step 0 positions without injection: [0, 1], [4, 5], [8, 9]
  expected = {
    0: ([[0, 1], [4, 0], [8, 0]], [0, 1, 1]),
    1: ([[0, 4], [4, 5], [8, 4]], [1, 0, 1]),
    2: ([[0, 8], [4, 8], [8, 9]], [1, 1, 0]),
  }
  p = perm(12, 0)
  (sender,) = sampler.senders(0).tolist()
  rows, injected = expected[sender]
  assert indices(sampler, 0, [2, 2, 2]) == [p[r].tolist() for r in rows]
  eq(sampler.indices(0, [2, 2, 2]).injected, injected)
  senders = {sampler.senders(s).tolist()[0] for s in range(30)}
  assert senders == {0, 1, 2}  # drawn afresh each step


@pytest.mark.parametrize(
  'alpha, beta, share, num_senders, sender_gets, other_gets',
  [
    # Eq. 3 at K = 10, b = 32: b' = ceil(32 / 3.5) = 10, floor(0.5 · 10) = 5, ceil(0.5 · 10) = 5
    (0.5, 0.5, 5, 5, 20, 25),
    # b' = ceil(32 / 6.625) = 5, floor(0.75 · 5) = 3, ceil(7.5) = 8 senders
    (0.75, 0.75, 3, 8, 21, 24),
    # b' = ceil(32 / 1.1) = 30, floor(0.1 · 30) = 3, ceil(1.0) = 1 sender (who receives nothing)
    (0.1, 0.1, 3, 1, 0, 3),
    # b' = ceil(32 / 1.9) = 17, floor(5.1) = 5, 3 senders
    (0.3, 0.3, 5, 3, 10, 15),
  ],
)
def test_injection_counts_and_sources(alpha, beta, share, num_senders, sender_gets, other_gets):
  labels = np.arange(2000) % 10
  partition = data.Partition('labels', seed=2, inject_alpha=alpha, inject_beta=beta)
  sampler = data.make_sampler(partition, labels, 10)
  base = data.make_sampler(data.Partition('labels', seed=2), labels, 10)
  eq(sampler.shares([32] * 10), [share] * 10)
  for step in range(4):
    batch = sampler.indices(step, [32] * 10)
    plain = base.indices(step, [32] * 10).indices
    senders = sampler.senders(step).tolist()
    assert len(senders) == num_senders
    for w in range(10):
      got = sender_gets if w in senders else other_gets
      assert batch.injected[w] == got
      assert len(batch.indices[w]) == 32
      own = 32 - got
      eq(batch.indices[w][:own], plain[w][:own])  # its own batch, cut to make room
      received = np.concatenate([plain[s][:share] for s in senders if s != w] + [[]])
      eq(batch.indices[w][own:], received)  # senders' first examples, in worker order
      foreign = labels[batch.indices[w][own:]]
      assert set(foreign.tolist()) <= {sampler.worker_labels[s][0] for s in senders}
      if w in senders:  # what it shares is in its own batch
        assert set(plain[w][:share].tolist()) <= set(batch.indices[w][:own].tolist())


def test_sender_count_is_ceil_alpha_k_despite_float_error():
  labels = np.arange(100) % 4
  for alpha, k, count in [(0.28, 25, 7), (0.5, 10, 5), (0.25, 10, 3), (1.0, 6, 6), (0.01, 6, 1)]:
    sampler = data.make_sampler(data.Partition(inject_alpha=alpha, inject_beta=0.5), labels, k)
    for step in range(3):  # 0.28 · 25 = 7.000000000000001 in floats: still 7 senders, not 8
      got = sampler.senders(step)
      assert len(got) == len(set(got.tolist())) == count, (alpha, k)
      assert got.tolist() == sorted(got.tolist()) and got.min() >= 0 and got.max() < k


def test_injection_errors_name_the_fractions():
  labels = np.arange(40) % 4
  flood = data.make_sampler(data.Partition('iid', inject_alpha=1.0, inject_beta=1.0), labels, 4)
  with pytest.raises(ValueError, match=r'receives 3 examples.*inject_alpha=1.0 or inject_beta'):
    flood.indices(0, [2, 2, 2, 2])  # b' = 1, each gets 1 from each of 3 others
  tiny = data.make_sampler(data.Partition('iid', inject_alpha=0.25, inject_beta=0.1), labels, 4)
  with pytest.raises(ValueError, match=r'share 0 examples: inject_beta=0.1.*rounds down to 0'):
    tiny.indices(0, [4, 4, 4, 4])  # b' = ceil(4 / 1.1) = 4, floor(0.4) = 0
