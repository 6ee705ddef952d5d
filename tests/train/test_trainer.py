"""The trainer's chains and steps: pipeline compensations, what is evaluated, the ledger."""

import jax
import numpy as np
import optax
import pytest

from jaxdist import comm, data, models, netmodel, runtime
from jaxdist.train import checkpoint, factory, ledger
from jaxdist.train import config as config_lib
from jaxdist.train import noise as noise_lib
from jaxdist.train import step as step_lib

from conftest import REPO, Driven, run_digits

STEPS = 6


def delayed_config(delay: int, compensation: str, weight_decay: float = 0.01):
  config = config_lib.base()
  config.steps = 100
  config.optimizer.update(
    learning_rate=0.1, momentum=0.9, nesterov=False, weight_decay=weight_decay, schedule='constant'
  )
  config.sync.method = 'gradient_delay'
  config.sync.gradient_delay.delay = str(delay)
  config.sync.compensation = compensation
  return config


def train(config, digits, steps=STEPS):
  workers = runtime.layout(8)
  tx, _ = factory.build_chain(config, workers)
  model = models.get('mlp', num_classes=10)
  state = step_lib.make_init(model, tx, workers, digits.image_shape)(jax.random.key(0))
  train_step = step_lib.make_train_step(model, tx, workers)
  for t in range(steps):
    idx = data.worker_indices(t, seed=1, num_examples=len(digits.train), workers=8, per_worker=4)
    x = jax.device_put(digits.normalize(digits.train.images[idx]), workers.sharding)
    y = jax.device_put(digits.train.labels[idx], workers.sharding)
    state, _ = train_step(state, x, y)
  return model, workers, state


def test_spike_compensation_at_delay_0_is_momentum_sgd_with_the_same_weight_decay(digits):
  # SC with D = 0 is plain momentum; weight decay must enter the momentum as in optax.sgd
  _, _, plain = train(delayed_config(0, ''), digits)
  _, _, sc = train(delayed_config(0, 'spike_compensation'), digits)
  for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(sc.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_spike_compensation_needs_sgd():
  config = delayed_config(2, 'spike_compensation')
  config.optimizer.name = 'adam'
  with pytest.raises(ValueError, match='spike_compensation replaces SGD momentum'):
    factory.build_chain(config, runtime.layout(8))


def test_linear_weight_prediction_evaluates_the_true_weights(digits):
  model, workers, state = train(delayed_config(2, 'linear_weight_prediction'), digits)
  true = step_lib.trained_params(state)
  gap = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(jax.tree.leaves(true), jax.tree.leaves(state.params), strict=True)
  )
  assert gap > 1e-4  # the model's forward weights are the prediction, not the true weights
  x = jax.device_put(digits.normalize(digits.test.images[:64]), workers.replicated)
  y = jax.device_put(digits.test.labels[:64], workers.replicated)
  mask = jax.device_put(np.ones(64, np.float32), workers.replicated)
  evaluate = step_lib.make_eval_step(model, workers)
  got = jax.device_get(evaluate(state, x, y, mask))
  want = jax.device_get(evaluate(state._replace(params=true, opt_state=()), x, y, mask))
  assert got['loss'] == want['loss'] and got['correct'] == want['correct']


def test_ledger_prices_each_step_by_hand():
  # one 1 MB all-reduce that ran on 8 workers, and one overlapped 1 MB all-gather that did not
  t_ar = comm.transfer(comm.ALL_REDUCE, 1_000_000, 0)
  t_ag = comm.overlapped(comm.transfer(comm.ALL_GATHER, 1_000_000, 0))
  net = netmodel.gbps(8, 1e-3)  # 1 GB/s, 1 ms
  book = ledger.Ledger([t_ar, t_ag], 8, {'net': net}, 'ring', compute_s=0.002)
  r = book.record(1, [8, 0])
  assert r['payload_bytes'] == 1_000_000 and r['synced'] == 1
  assert r['sent_bytes'] == pytest.approx(2 * 7 / 8 * 1_000_000)
  ring = 2 * 7 * 1e-3 + 2 * 7 / 8 * 1_000_000 / 1e9  # 2(N-1)α + 2(N-1)/N·M/B
  assert r['comm_s@net'] == pytest.approx(ring) and 'overlap_s@net' not in r
  assert r['modelled_s@net'] == pytest.approx(0.002 + ring)
  r = book.record(2, [0, 8])  # only the overlapped all-gather: hidden up to the compute
  gather = 3 * 1e-3 + 7 * 1_000_000 / 1e9  # α·log N + (N-1)·M/B
  assert r['synced'] == 1 and r['comm_s@net'] == 0  # a collective of the largest size ran
  assert r['modelled_s@net'] == pytest.approx(0.002 + max(0.0, gather - 0.002))
  flags = comm.transfer(comm.ALL_REDUCE, 4, 0)  # e.g. SelSync's flags: not a sync
  assert ledger.Ledger([flags, t_ar], 8, {}, 'ring', 0.0).record(3, [8, 0])['synced'] == 0


# --- a heterogeneous cluster on the modelled clock ------------------------------------------


def cluster_config(workers=3, **cluster):
  config = config_lib.base()
  config.workers = workers
  config.cluster.update(cluster)
  return config


def test_no_cluster_by_default_and_clear_errors_naming_the_key():
  assert factory.build_cluster(config_lib.cluster(), 8) is None
  c = factory.build_cluster(cluster_config(cores='h2').cluster, 3)
  assert c.speeds == pytest.approx((9 / 13, 12 / 13, 18 / 13))
  c = factory.build_cluster(cluster_config(speeds='1,1,0.25', phases='5:1,1,1;5:1,1,4').cluster, 3)
  assert c.phases == ((5, (1.0, 1.0, 1.0)), (5, (1.0, 1.0, 4.0)))
  bad = [
    (dict(cores='h2'), 8, r'config.cluster: the cluster describes 3 workers .* run has 8'),
    (dict(speeds='1,0'), 2, r'config.cluster: speeds must all be > 0'),
    (dict(speeds='1,x'), 2, r'config.cluster.speeds must be comma-separated numbers'),
    (dict(speeds='1,1', cores='1,1'), 2, 'give speeds or cores, not both'),
    (dict(straggler_p=1.5), 2, r'config.cluster: straggler_p must be in \[0, 1\]'),
    (dict(phases='5-1,1'), 2, r"config.cluster.phases: phase 0 must be 'steps:factor"),
  ]
  for cluster, workers, message in bad:
    with pytest.raises(ValueError, match=message):
      factory.build_cluster(cluster_config(**cluster).cluster, workers)


def records(steps, comm_s, synced=None):
  return [
    {'step': t + 1, 'comm_s@net': comm_s, 'synced': 1 if synced is None else synced[t]}
    for t in range(steps)
  ]


def test_equal_speeds_replay_today_s_clock():
  config = cluster_config(workers=4, speeds='1,1,1,1')
  cluster = factory.build_cluster(config.cluster, 4)
  rs = records(10, 0.01)
  equal = ledger.modelled_clock(rs, 'net', 0.002)
  replay = ledger.modelled_clock(rs, 'net', 0.002, factory.worker_clock(config, cluster, 0.002))
  assert [t for _, t in replay] == pytest.approx([t for _, t in equal])
  assert equal[-1][1] == pytest.approx(10 * 0.012)


def test_stragglers_cost_bsp_more_than_ssp_and_async_on_the_same_records():
  # 4 workers, one in 3 steps a worker is 4x slower; BSP waits for it every time
  totals = {}
  for method in ('allreduce', 'ssp', 'async_sgd', 'local_sgd'):
    config = cluster_config(workers=4, straggler_p=0.3, straggler_slowdown=4.0, seed=1)
    config.sync.method = method
    cluster = factory.build_cluster(config.cluster, 4)
    synced = [int((t + 1) % 4 == 0) for t in range(40)]
    rs = records(40, 0.001, synced if method == 'local_sgd' else None)
    clock = factory.worker_clock(config, cluster, 0.01)
    totals[method] = ledger.modelled_clock(rs, 'net', 0.01, clock)[-1][1]
  no_wait = 40 * (0.01 + 0.001)  # every worker at speed 1, never slowed
  assert totals['allreduce'] > totals['ssp'] >= totals['async_sgd'] > no_wait
  assert totals['allreduce'] > totals['local_sgd']


def test_waiting_rules_follow_the_method():
  config = config_lib.base()
  for method, wait in [('allreduce', 'bsp'), ('cd_sgd', 'bsp'), ('local_sgd', 'periodic'),
                       ('selsync', 'bsp'), ('ssp', 'ssp'), ('async_sgd', 'async'),
                       ('gossip', 'neighbours')]:  # fmt: skip
    config.sync.method = method
    assert factory.waiting_rule(config, 8)['wait'] == wait, method
  config.sync.method = 'ssp'
  assert factory.waiting_rule(config, 8)['staleness'] == config.sync.ssp.staleness
  config.sync.method = 'gossip'
  w = factory.waiting_rule(config, 8)['neighbours'](0)
  assert w.shape == (8, 8) and np.count_nonzero(w[0]) == 3  # ring: self and two neighbours


# --- per-worker batches (dynamic batching) ---------------------------------------------------


def test_batching_needs_a_cluster_and_allreduce_and_feasible_bounds():
  bad = [
    (dict(batching='dynamic'), r'config.batching=.dynamic. sizes batches .* config.cluster'),
    (dict(batching='sometimes'), r'config.batching must be one of'),
    (dict(batching='static', **{'cluster.cores': 'h2', 'sync.method': 'local_sgd'}),
     r'needs sync.method=allreduce'),
    (dict(batching='dynamic', **{'cluster.cores': 'h2', 'dynamic_batching.b_max': 10}),
     r'config.dynamic_batching: '),
    (dict(batching='dynamic', **{'cluster.cores': 'h2', 'dynamic_batching.deadband': 1.5}),
     r'config.dynamic_batching: deadband must be in \[0, 1\)'),
  ]  # fmt: skip
  for overrides, message in bad:
    config = config_lib.base()
    config.workers, config.batch_size = 3, 96
    config.update_from_flattened_dict(overrides)
    with pytest.raises(ValueError, match=message):
      factory.build_batching(config, factory.build_cluster(config.cluster, 3))


def test_dynamic_batches_train_like_uniform_ones_and_equalise_the_modelled_times(
  tmp_path, data_dir, monkeypatch
):
  # Σ_k b_k ḡ_k / G over any split of the global batch is the mean gradient of that batch:
  # only the clock changes (Tyagi & Sharma 2020, Eqs. 2-3).
  cluster = {'cluster.cores': 'h10', 'dynamic_batching.b_max': 64}
  uniform = run_digits(tmp_path, 'uniform', data_dir, monkeypatch, **cluster)
  dynamic = run_digits(
    tmp_path, 'dynamic', data_dir, monkeypatch, batching='dynamic',
    **{'dynamic_batching.interval': 2}, **cluster,
  )  # fmt: skip
  for a, b in zip(jax.tree.leaves(uniform[2]), jax.tree.leaves(dynamic[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  batches = [r['batches'] for r in dynamic[1]]
  assert batches[0] == [32, 32, 32] and batches[-1] == [5, 42, 49]  # H10, G = 96
  assert all(sum(b) == 96 for b in batches)
  times = np.asarray(dynamic[1][-1]['compute_s'])
  assert times.max() / times.min() < 1.1  # equalised (they were 2:17:20 apart)
  for net in ('1gbps', '10gbps'):
    assert dynamic[0][f'modelled_s@{net}'] < uniform[0][f'modelled_s@{net}'] / 1.5


def test_micro_batched_dynamic_batches_train_like_uniform_ones(tmp_path, data_dir, monkeypatch):
  # Each worker computes only the micro-batches of 8 that hold its examples: the same mean
  # gradient of the global batch; the controller allocates whole micro-batches.
  cluster = {'cluster.cores': 'h10', 'dynamic_batching.b_max': 64}
  uniform = run_digits(tmp_path, 'uniform', data_dir, monkeypatch, steps=4, **cluster)
  micro = run_digits(
    tmp_path, 'micro', data_dir, monkeypatch, steps=4, batching='dynamic',
    **{'dynamic_batching.interval': 2, 'dynamic_batching.micro_batch': 8}, **cluster,
  )  # fmt: skip
  for a, b in zip(jax.tree.leaves(uniform[2]), jax.tree.leaves(micro[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=False)
  assert [r['batches'] for r in micro[1]] == [[32, 32, 32]] * 2 + [[8, 40, 48]] * 2
  bad = [
    (dict(batching='uniform'), r"micro_batch=8: micro-batches .* serve batching='static'"),
    (dict(batching='static', **{'dynamic_batching.b_max': 60}),
     r'must divide the examples a worker holds \(60\)'),
  ]  # fmt: skip
  for overrides, message in bad:
    config = config_lib.base()
    config.workers, config.batch_size = 3, 96
    config.update_from_flattened_dict({'dynamic_batching.micro_batch': 8, **overrides})
    with pytest.raises(ValueError, match=message):
      factory.micro_batch(config)


def test_equal_speeds_static_batching_is_bsp(tmp_path, data_dir, monkeypatch):
  cluster = {'cluster.speeds': '1,1,1', 'dynamic_batching.b_max': 32}
  plain = run_digits(tmp_path, 'plain', data_dir, monkeypatch, steps=4)
  static = run_digits(tmp_path, 'static', data_dir, monkeypatch, steps=4, batching='static',
                      **cluster)  # fmt: skip
  assert [r['batches'] for r in static[1]] == [[32, 32, 32]] * 4
  for a, b in zip(jax.tree.leaves(plain[2]), jax.tree.leaves(static[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('workers, devices', [(8, 8), (16, 4)])
def test_noise_step_is_mean_worker_norm_and_norm_of_the_mean(digits, workers, devices):
  # reference: each worker's gradient on one device, then the two norms in NumPy
  layout = runtime.layout(workers, devices=devices)
  model = models.get('mlp', num_classes=10)
  state = step_lib.make_init(model, optax.sgd(0.1), layout, digits.image_shape)(jax.random.key(0))
  idx = data.worker_indices(
    0, seed=1, num_examples=len(digits.train), workers=workers, per_worker=4
  )
  xs, ys = digits.normalize(digits.train.images[idx]), digits.train.labels[idx]
  put = lambda a: jax.device_put(a, layout.sharding)
  num, den = noise_lib.make_noise_step(model, layout)(state, put(xs), put(ys))
  params = jax.tree.map(lambda a: np.asarray(a[0]), state.params)
  flat = []
  for k in range(workers):
    g = jax.grad(lambda p, k=k: step_lib.loss_fn(model, p, {}, xs[k], ys[k], True)[0])(params)
    flat.append(np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(g)]).astype(np.float64))
  flat = np.stack(flat)
  np.testing.assert_allclose(float(num), np.mean(np.sum(flat**2, axis=1)), rtol=1e-5)
  np.testing.assert_allclose(float(den), np.sum(flat.mean(0) ** 2), rtol=1e-5)
  assert 1.0 < float(num) / float(den) < workers


def test_noise_of_workers_with_the_same_batch_is_one_and_counts_weight_the_mean(digits):
  layout = runtime.layout(8)
  model = models.get('mlp', num_classes=10)
  state = step_lib.make_init(model, optax.sgd(0.1), layout, digits.image_shape)(jax.random.key(0))
  xs = np.repeat(digits.normalize(digits.train.images[:4])[None], 8, axis=0)
  ys = np.repeat(digits.train.labels[:4][None], 8, axis=0)
  put = lambda a: jax.device_put(a, layout.sharding)
  num, den = noise_lib.make_noise_step(model, layout)(state, put(xs), put(ys))
  np.testing.assert_allclose(float(num) / float(den), 1.0, rtol=1e-5)  # γ = 1: all agree
  # counted: worker 0 trains on 4 examples, the rest on 0: the mean is worker 0's gradient
  counts = put(np.array([4, 0, 0, 0, 0, 0, 0, 0], np.int32))
  ys2 = ys.copy()
  ys2[1:] = (ys2[1:] + 1) % 10  # the others' labels differ, but they count for nothing
  noise = noise_lib.make_noise_step(model, layout, counted=True)
  _, den_w = noise(state, put(xs), put(ys2), counts)
  np.testing.assert_allclose(float(den_w), float(den), rtol=1e-5)


# --- streams (ScaDLES), partitions and injection ----------------------------------------------


def test_streams_and_partitions_fail_clearly_naming_the_key(tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  bad = [
    (dict(batching='stream'), r"config.batching='stream' .* config.cluster.stream_rates"),
    (dict(batching='dynamic', **{'cluster.stream_rates': 'S10'}), r'choose one way'),
    (dict(batching='stream', **{'cluster.stream_rates': 'S10', 'sync.method': 'local_sgd'}),
     r'needs sync.method=allreduce'),
    (dict(batching='stream', **{'cluster.stream_rates': 'S10', 'streams.b_min': 50,
                                'streams.b_max': 40}), r'config.streams: .*b_min'),
    (dict(batching='stream', **{'cluster.stream_rates': 'S10', 'streams.buffer': 'forever'}),
     r'config.streams: .*buffer'),
    (dict(batching='window', **{'cluster.speeds': '1,1,0.5'}), r'needs sync.method=diloco'),
    ({'sync.method': 'diloco', 'sync.diloco.by_steps': True},
     r"by_steps weights the outer mean .* give batching='window'"),
    (dict(batching='window', **{'cluster.speeds': '1,1,0.5', 'sync.method': 'diloco',
                                'dynamic_batching.micro_batch': 5}),
     r'micro_batch=5 must divide the examples a worker holds \(32\)'),
    (dict(batching='stream', **{'cluster.stream_rates': 'S10', 'streams.b_max': 64,
                                'dynamic_batching.micro_batch': 24}),
     r'micro_batch=24 must divide the examples a worker holds \(64\): each'),
    ({'streams.realtime': True}, r'config.streams.realtime .* give config.cluster.stream_rates'),
    ({'cluster.stream_rates': 'S99'}, r'config.cluster.stream_rates must be comma-separated'),
    ({'cluster.stream_rates': '10,20'}, r'config.cluster: stream_rates has 2 workers'),
    ({'cluster.stream_rates': '10,-1,5'}, r'stream_rates must all be >= 0'),
    ({'partition.inject_alpha': 1.5}, r'config.partition: .*inject_alpha'),
    ({'partition.inject_beta': -0.1}, r'config.partition: .*inject_beta'),
    ({'partition.kind': 'sorted'}, r'config.partition: kind must be one of'),
    ({'partition.labels_per_worker': 11, 'partition.kind': 'labels'},
     r'config.partition: .*labels_per_worker'),
  ]  # fmt: skip
  for overrides, message in bad:
    config = factory.load_config(
      f'{REPO}/configs/digits.py:runlocal,workers=3', batch_size=96, **overrides
    )
    with pytest.raises(factory.ConfigError, match=message):
      factory.build(config, str(tmp_path / 'never'))
  assert not (tmp_path / 'never').exists()


def test_scale_multiplies_the_learning_rate_of_momentum_sgd(digits):
  # ScaDLES's lr scaling Σb/B: scaling each step's update by s == SGD with lr · s, momentum kept
  from jaxdist import sync

  layout = runtime.layout(4)
  model = models.get('mlp', num_classes=10)
  idx = data.worker_indices(0, seed=1, num_examples=len(digits.train), workers=4, per_worker=8)
  put = lambda a: jax.device_put(a, layout.sharding)
  x, y = put(digits.normalize(digits.train.images[idx])), put(digits.train.labels[idx])
  counts, scale = put(np.full(4, 8, np.int32)), put(np.full(4, 2.5, np.float32))
  out = []
  for lr, extra in ((0.04, (counts, scale)), (0.1, (counts,))):
    tx = optax.chain(sync.weighted_allreduce(axis_name=layout.axis_name), optax.sgd(lr, 0.9))
    state = step_lib.make_init(model, tx, layout, digits.image_shape)(jax.random.key(0))
    step = step_lib.make_train_step(model, tx, layout, counted=True)
    for _ in range(3):
      state, _ = step(state, x, y, *extra)
    out.append(state.params)
  for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_equal_streams_of_one_batch_a_second_are_bsp(tmp_path, data_dir, monkeypatch):
  # S_k · 1 s = B / K for every worker: batches B / K, weights 1 / K, lr scale 1 == plain BSP
  plain = run_digits(tmp_path, 'plain', data_dir, monkeypatch, steps=4)
  streams = {'cluster.stream_rates': '32,32,32', 'streams.b_max': 32}
  stream = run_digits(tmp_path, 'stream', data_dir, monkeypatch, steps=4, batching='stream',
                      **streams)  # fmt: skip
  assert [r['batches'] for r in stream[1]] == [[32, 32, 32]] * 4
  np.testing.assert_allclose(stream[1][0]['wait_s'], [1.0, 1.0, 1.0])  # empty buffers: 32 / 32
  for a, b in zip(jax.tree.leaves(plain[2]), jax.tree.leaves(stream[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # the clock charges the waits: step 1 waits 1 s for data, then computes and syncs
  assert stream[0]['modelled_s@1gbps'] > plain[0]['modelled_s@1gbps'] + 1.0


def test_streams_proportional_batches_wait_less_than_fixed_ones(tmp_path, data_dir, monkeypatch):
  # rates (8, 32, 56)/s: fixed B/K = 32 makes the slow stream wait 32/8 = 4 s at the start;
  # proportional batches (8, 32, 56) wait 1 s each, and the buffers keep what streams in
  rates = {'cluster.stream_rates': '8,32,56', 'streams.b_max': 64, 'streams.b_min': 8,
           'streams.buffer': 'persistence'}  # fmt: skip
  fixed = run_digits(tmp_path, 'fixed', data_dir, monkeypatch, steps=3, **rates)
  prop = run_digits(tmp_path, 'prop', data_dir, monkeypatch, steps=3, batching='stream', **rates)
  assert fixed[1][0]['batches'] == [32, 32, 32] and prop[1][0]['batches'] == [8, 32, 56]
  np.testing.assert_allclose(fixed[1][0]['wait_s'], [4.0, 1.0, 32 / 56])
  np.testing.assert_allclose(prop[1][0]['wait_s'], [1.0, 1.0, 1.0])
  assert prop[0]['modelled_s@1gbps'] < fixed[0]['modelled_s@1gbps']
  assert fixed[0]['buffer_peak_total'] > prop[0]['buffer_peak_total'] > 0


def test_realtime_streams_wait_in_wall_clock_and_train_the_same(tmp_path, data_dir, monkeypatch):
  # rates (80, 160, 320)/s, interval 0.25 s: batches (20, 40, 80), each a quarter second of its
  # stream, and truncation keeps no more; in wall-clock every step waits for its data
  rates = {'cluster.stream_rates': '80,160,320', 'streams.interval_s': 0.25, 'streams.b_max': 80}
  modelled = run_digits(tmp_path, 'modelled', data_dir, monkeypatch, steps=6, batching='stream',
                        **rates)  # fmt: skip
  real = run_digits(
    tmp_path,
    'real',
    data_dir,
    monkeypatch,
    steps=6,
    batching='stream',
    **rates,
    **{'streams.realtime': True, 'dynamic_batching.micro_batch': 20},
  )
  assert [r['batches'] for r in real[1]] == [[20, 40, 80]] * 6
  waits = [r['data_wait_s'] for r in real[1]]
  assert waits[0] == pytest.approx(0.25, abs=1e-9)  # empty buffers: 20 / 80 s = 80 / 320 s
  assert all(0.0 <= w <= 0.25 + 1e-9 for w in waits), waits  # never more than b / S
  assert all('data_wait_s' not in r for r in modelled[1])
  # step t cannot start before a quarter second after step t - 1 took its data (the buffers
  # hold no more than that): steps 3..6 end at least 2 × 0.25 s after step 2
  assert sum(r['step_s'] for r in real[1][2:]) >= 0.5
  # waiting changes when, and micro-batches of 20 (1, 2 and 4 of them) how, not what: the
  # masked run's weights, to float32 rounding
  for a, b in zip(jax.tree.leaves(modelled[2]), jax.tree.leaves(real[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_label_partition_gives_each_worker_its_labels_and_injection_counts_bytes(
  tmp_path, data_dir, monkeypatch
):
  from jaxdist.train import feed

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  overrides = {'partition.kind': 'labels', 'partition.labels_per_worker': 1}
  config = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal,workers=10', batch_size=160, **overrides
  )
  exp = factory.build(config, str(tmp_path / 'x'))
  (_, y), injected = feed.put_batch(exp, 0)
  labels = [set(np.asarray(row).tolist()) for row in jax.device_get(y)]
  assert all(len(s) == 1 for s in labels) and set().union(*labels) == set(range(10))
  assert not injected.any()
  config.partition.update(inject_alpha=0.5, inject_beta=0.5)
  exp = factory.build(config, str(tmp_path / 'x'))
  (_, y), injected = feed.put_batch(exp, 0)
  # b = 16, K = 10: b' = ceil(16 / 3.5) = 5, share floor(0.5 · 5) = 2, 5 senders;
  # a sender receives 4 · 2 = 8, the others 5 · 2 = 10
  assert sorted(injected.tolist()) == [8] * 5 + [10] * 5
  labels = [set(np.asarray(row).tolist()) for row in jax.device_get(y)]
  assert all(len(s) > 1 for s in labels)  # foreign labels arrived everywhere


# --- adaptive compression: controllers choosing compressed_allreduce's candidate --------------


def test_a_controller_pinned_to_one_candidate_is_the_fixed_ratio_run(
  tmp_path, data_dir, monkeypatch
):
  # GraVAC with one factor (10x) and a tiny ε always sends it: the Top-k 0.1 run, step for step
  compressed = {'sync.method': 'compressed_allreduce', 'compress.name': 'topk',
                'compress.topk.ratio': 0.1}  # fmt: skip
  fixed = run_digits(tmp_path, 'fixed', data_dir, monkeypatch, steps=6, **compressed)
  pinned = run_digits(
    tmp_path, 'pinned', data_dir, monkeypatch, steps=6, adaptive='gravac', **compressed,
    **{'gravac.theta_min': 10.0, 'gravac.theta_max': 10.0, 'gravac.epsilon': 1e-6},
  )  # fmt: skip
  assert [r['ratio'] for r in pinned[1]] == [0.1] * 6
  for a, b in zip(jax.tree.leaves(fixed[2]), jax.tree.leaves(pinned[2]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  for key in ('loss', 'payload_bytes'):
    np.testing.assert_allclose([r[key] for r in pinned[1]], [r[key] for r in fixed[1]], rtol=1e-6)


def test_scadles_rule_by_hand():
  from jaxdist import control

  ctl = Driven(control.scadles_control((0.1,), num_workers=3, delta=0.3, decay=0.5))
  assert ctl.index == 1  # starts dense
  norms = np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
  # signals |‖w‖² − ‖Top-k(w)‖²| / ‖w‖² = 0.2, 0.4, 0.25: two of three vote to compress
  out = ctl.step(0, {}, {'norms': norms, 'gains': np.array([[0.8], [0.6], [0.75]])})
  assert ctl.index == 0 and out == {'ratio': 1.0, 'gain': 1.0}  # the step ran dense
  # EWMAs with decay 0.5: worker 0 → (1, 0.4) (signal 0.6), 1 → (2, 1.2) (0.4), 2 → (1, 0.475)
  out = ctl.step(1, {}, {'norms': norms, 'gains': np.array([[0.0], [0.6], [0.2]])})
  np.testing.assert_allclose(ctl.state.inner.sums[:, 1], [0.4, 1.2, 0.475])
  assert ctl.index == 1 and out == {'ratio': 0.1, 'gain': pytest.approx(0.8 / 3)}
  assert ctl.controller.summary(ctl.state) == {'compressed_fraction': 0.5}


@pytest.mark.parametrize(
  'overrides, message',
  [
    ({'adaptive': 'sometimes'}, r'config.adaptive must be one of'),
    ({'adaptive': 'gravac'}, r'chooses the ratio of sync.method=compressed_allreduce'),
    ({'adaptive': 'gravac', 'sync.method': 'compressed_allreduce', 'gravac.epsilon': 1.5},
     r'epsilon'),
    ({'adaptive': 'gravac', 'sync.method': 'compressed_allreduce',
      'sync.compressed_allreduce.ratios': '0.5'}, r'leave config.sync.compressed_allreduce.ratios'),
    ({'adaptive': 'scadles', 'sync.method': 'compressed_allreduce',
      'scadles_compression.delta': 2.0}, r'config.scadles_compression: delta'),
    ({'adaptive': 'scadles', 'sync.method': 'compressed_allreduce',
      'sync.compressed_allreduce.ratios': '0.1,0.01'}, r'compresses at one ratio'),
    ({'sync.method': 'compressed_allreduce', 'sync.compressed_allreduce.ratios': '0.1'},
     r'chosen per step by a controller'),
    ({'sync.method': 'compressed_allreduce', 'sync.compressed_allreduce.ratios': '0.1;0.2'},
     r'ratios must be comma-separated numbers'),
    ({'adaptive': 'gravac', 'sync.method': 'compressed_allreduce', 'network.profiles': ''},
     r'give config.network.profiles'),
    ({'adaptive': 'gravac', 'sync.method': 'compressed_allreduce', 'gravac.decay': 1.0},
     r'config.gravac: decay'),
    ({'noise_every': -3}, r'noise_every must be >= 0'),
    ({'eval_examples': -1}, r'eval_examples must be >= 0 \(0: the whole test split\)'),
    ({'fault.signal': 'SIGHUP'},
     r"config.fault.signal must be one of \('SIGKILL', 'SIGTERM', 'SIGINT'\), got 'SIGHUP'"),
    ({'sync.per_worker': 'scan'},
     r"per_worker must be 'auto', 'vmap', 'loop', 'shared', 'mean' or 'device', got 'scan'"),
    ({'sync.per_worker': 'device', 'sync.method': 'bucketed_allreduce'},
     r"per_worker='device' keeps one model per device: tested for allreduce, powersgd, "
     r"compressed_allreduce, not sync.method='bucketed_allreduce'"),
    ({'sync.per_worker': 'device', 'sync.method': 'compressed_allreduce', 'adaptive': 'gravac'},
     r"each worker's error-feedback state; .* but adaptive='gravac' hands each worker its "
     r'candidate ratio; use per_worker=auto'),
    ({'sync.per_worker': 'device', 'sync.method': 'compressed_allreduce', 'batching': 'static'},
     r"error-feedback state; .* but batching='static' weights"),
    ({'sync.per_worker': 'device', 'sync.method': 'local_sgd'},
     r"per_worker='device' hands each worker its device's mean gradient.*'local_sgd'"),
    ({'sync.per_worker': 'device', 'fault.drop': '1@2'}, r'but fault.drop weights dropped'),
    ({'sync.per_worker': 'shared', 'sync.method': 'local_sgd'},
     r"per_worker='shared' reads one worker's weights.*'local_sgd' keeps a model per worker"),
    ({'sync.per_worker': 'vmap', 'sync.staggered': True}, r'staggered .* contradicts it'),
    ({'sync.per_worker': 'mean', 'sync.method': 'compressed_allreduce'},
     r"per_worker='mean' hands each worker its device's mean gradient"),
    ({'sync.per_worker': 'mean', 'sync.local_clip.max_norm': 1.0},
     r"but sync.local_clip clips each worker's own gradient"),
    ({'sync.per_worker': 'mean', 'sync.method': 'bucketed_allreduce',
      'sync.bucketed_allreduce.averager': 'compressed_allreduce'},
     r"but sync.bucketed_allreduce.averager='compressed_allreduce' compresses"),
    ({'sync.per_worker': 'mean', 'sync.staggered': True}, r'staggered .* contradicts it'),
  ],
)  # fmt: skip
def test_bad_input_names_the_key(tmp_path, data_dir, monkeypatch, overrides, message):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **overrides)
  with pytest.raises(factory.ConfigError, match=message):
    factory.build(config, str(tmp_path / 'never'))
  assert not (tmp_path / 'never').exists()


def test_a_controller_decides_each_step_from_the_step_before(tmp_path, data_dir, monkeypatch):
  # ScaDLES's rule with δ = 1 compresses once it has seen any gain: dense, then compressed
  run = run_digits(
    tmp_path, 'rule', data_dir, monkeypatch, steps=3, adaptive='scadles',
    **{'sync.method': 'compressed_allreduce', 'compress.name': 'topk',
       'compress.topk.ratio': 0.1, 'scadles_compression.delta': 1.0},
  )  # fmt: skip
  assert [r['ratio'] for r in run[1]] == [1.0, 0.1, 0.1]
  assert run[0]['compressed_fraction'] == 2 / 3


def test_ratio_controllers_round_trip_through_checkpoint_json():
  import json

  from jaxdist import control
  from jaxdist.train.factory import controls

  config = config_lib.base()
  config.gravac.window = 2
  rng = np.random.default_rng(0)
  for make, n in (
    (lambda: controls.build(_gravac(config), 4, {'1gbps': None}), 9),
    (lambda: control.scadles_control((0.1,), 4, delta=0.3, decay=0.9), 1),
  ):
    ctl = Driven(make())
    for t in range(5):
      gains = np.sort(rng.uniform(0.3, 1.0, (4, n)), axis=1)[:, ::-1]
      ctl.step(t, {'modelled_s@1gbps': 0.01 * (t + 1)},
               {'norms': rng.uniform(1, 2, (4, 2)), 'gains': gains})  # fmt: skip
    back = ctl.saved()
    tree = lambda s: json.dumps(control.host.to_tree(s))
    assert tree(back) == tree(ctl.state) and back.index == ctl.index


def _gravac(config):
  config.sync.method = 'compressed_allreduce'
  config.adaptive = 'gravac'
  return config


def _runs_by_way(tmp_path, data_dir, monkeypatch, ways, **overrides):
  """{way: run_digits of 4 workers on 2 devices, 4 steps, with sync.per_worker=way}."""
  overrides = {'devices': 2, **overrides}
  return {
    way: run_digits(
      tmp_path,
      way,
      data_dir,
      monkeypatch,
      args='workers=4',
      steps=4,
      **{**overrides, 'sync.per_worker': way},
    )
    for way in ways
  }


def test_shared_weights_train_the_all_reduce_run_of_per_worker_weights(
  tmp_path, data_dir, monkeypatch
):
  """4 workers on 2 devices: 'shared', 'mean', 'device' and 'vmap' give one run (float
  reassociation); 'device' checkpoints one model per device, with Scavenger's noise measured
  at it, and resumes only on the workers that wrote it."""
  ways = ('shared', 'mean', 'device', 'vmap')
  runs = _runs_by_way(tmp_path, data_dir, monkeypatch, ways, noise_every=2)
  assert all(leaf.shape[0] == 2 for leaf in jax.tree.leaves(runs['device'][2]))
  runs['device'] = (
    *runs['device'][:2],
    jax.tree.map(lambda a: np.repeat(a, 2, 0), runs['device'][2]),
  )
  losses = {way: np.array([r['loss'] for r in run[1]]) for way, run in runs.items()}
  noise = {way: [r['gamma'] for r in run[1] if 'gamma' in r] for way, run in runs.items()}
  assert len(noise['vmap']) == 2 and np.all(np.isfinite(noise['vmap']))
  np.testing.assert_allclose(noise['device'], noise['vmap'], rtol=1e-4)
  for way in ('shared', 'mean', 'device'):
    assert np.all(np.isfinite(losses[way]))
    np.testing.assert_allclose(losses[way], losses['vmap'], rtol=1e-5, atol=1e-6)
    for leaf in jax.tree.leaves(runs[way][2]):
      assert np.all(np.isfinite(leaf))
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6),
      runs[way][2],
      runs['vmap'][2],
    )
  refusal = r"written by workers=4, devices=2, per_worker=device; with sync.per_worker='device'"
  for args, way in (('workers=2', 'device'), ('workers=4', 'vmap'), ('workers=4', 'auto')):
    with pytest.raises(factory.ConfigError, match=refusal):
      run_digits(tmp_path, 'device', data_dir, monkeypatch, args=args, steps=6,
                 **{'devices': 2, 'sync.per_worker': way})  # fmt: skip


def test_device_trains_compressed_allreduce_with_one_model_and_residuals_per_worker(
  tmp_path, data_dir, monkeypatch
):
  """4 workers on 2 devices, Top-k with error feedback: 'device' checkpoints one model per
  device and a residual per worker, and trains the per-worker run ('loop', whose gradients
  it computes the same way), every worker's all-gather priced as before."""
  overrides = {'sync.method': 'compressed_allreduce', 'compress.name': 'topk',
               'compress.topk.ratio': 0.1}  # fmt: skip
  runs = _runs_by_way(tmp_path, data_dir, monkeypatch, ('device', 'loop'), **overrides)
  (_, device, device_params), (_, loop, loop_params) = runs['device'], runs['loop']
  assert all(leaf.shape[0] == 2 for leaf in jax.tree.leaves(device_params))
  state = checkpoint.read(str(tmp_path / 'device' / 'checkpoints'))[0]
  size = sum(leaf.size for leaf in jax.tree.leaves(device_params)) // 2
  (residual,) = [a for a in jax.tree.leaves(state['opt_state'][0]) if a.shape == (4, size)]
  assert np.all(np.isfinite(residual)) and not np.allclose(residual[0], residual[1])
  for key in ('loss', 'sent_bytes', 'comm_s@1gbps'):
    a, b = [np.array([r[key] for r in run]) for run in (device, loop)]
    assert np.all(np.isfinite(a)) and a.min() > 0
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.repeat(a, 2, 0), b, rtol=1e-5, atol=2e-6),
    device_params,
    loop_params,
  )


def test_auto_is_mean_off_the_cpu_only_where_it_is_exact():
  base = factory.load_config(f'{REPO}/configs/digits.py:runlocal')
  assert factory.per_worker(base, 8, 'gpu') == 'mean'
  assert factory.per_worker(base, 8, 'cpu') == 'auto'  # make_train_step loops there
  assert factory.per_worker(base, 1, 'gpu') == 'auto'  # one worker a device: nothing to fuse
  for key, value in (
    ('sync.method', 'compressed_allreduce'),
    ('sync.method', 'local_sgd'),
    ('sync.local_clip.max_norm', 1.0),
    ('sync.bucketed_allreduce.averager', 'compressed_allreduce'),
    ('batching', 'static'),
    ('fault.drop', '1@2'),
    ('sync.staggered', True),
    ('sync.per_worker', 'vmap'),
  ):
    overrides = {key: value}
    if key.startswith('sync.bucketed'):
      overrides['sync.method'] = 'bucketed_allreduce'
    config = factory.load_config(f'{REPO}/configs/digits.py:runlocal', **overrides)
    assert factory.per_worker(config, 8, 'gpu') == config.sync.per_worker, key
  bucketed = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal', **{'sync.method': 'bucketed_allreduce'}
  )
  assert factory.per_worker(bucketed, 8, 'gpu') == 'mean'  # buckets of a plain all-reduce
  powersgd = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal', **{'sync.method': 'powersgd'}
  )
  assert factory.per_worker(powersgd, 8, 'gpu') == 'mean'  # linear in the sum (test_per_worker)


def test_a_given_compute_term_is_charged_and_nothing_is_measured(tmp_path, data_dir, monkeypatch):
  """config.network.compute_s stands in for the one-worker measurement in the modelled clock."""
  from jaxdist.train import calibrate

  monkeypatch.setattr(calibrate, 'measure_worker_steps', lambda *a, **k: pytest.fail('measured'))
  given = {'network.compute_s': 0.25, 'network.profiles': '1gbps', 'steps': 3}
  summary, records, _ = run_digits(tmp_path, 'given', data_dir, monkeypatch, **given)
  assert summary['worker_step_s'] == 0.25
  for r in records:
    if 'comm_s@1gbps' in r:  # dense all-reduce: all of it blocks the step
      assert r['modelled_s@1gbps'] == pytest.approx(0.25 + r['comm_s@1gbps'], rel=1e-12)
  assert summary['modelled_s@1gbps'] == pytest.approx(sum(
    0.25 + r['comm_s@1gbps'] for r in records if 'comm_s@1gbps' in r
  ), rel=1e-12)  # fmt: skip


def test_the_compute_term_is_timed_for_the_configured_budget(tmp_path, data_dir, monkeypatch):
  """network.compute_budget_s: the run's one measurement, a quarter of it per candidate."""
  from jaxdist.train import calibrate

  calls = []

  def measure(exp, state, candidates, repeats=20, budget_s=2.0):
    calls.append((list(candidates), repeats, budget_s))
    return [0.125] * len(candidates)

  monkeypatch.setattr(calibrate, 'measure_worker_steps', measure)
  assert config_lib.base().network.compute_budget_s == 2.0
  measured = {'network.compute_s': 0.0, 'steps': 1}  # 0: measure it
  summary, _, _ = run_digits(tmp_path, 'runlocal', data_dir, monkeypatch, **measured)
  assert calls == [([None], 20, 0.25)] and summary['worker_step_s'] == 0.125  # runlocal's
  calls.clear()
  gravac = {'adaptive': 'gravac', 'sync.method': 'compressed_allreduce', **measured}
  gravac['network.compute_budget_s'] = 1.0
  run_digits(tmp_path, 'gravac', data_dir, monkeypatch, **gravac)
  (candidates, _, budget_s), (one, _, budget_one) = sorted(calls, key=lambda c: c[0] == [None])
  assert (one, budget_one, budget_s) == ([None], 1.0, 0.25)  # a quarter per candidate
  assert candidates == list(range(len(candidates))) and len(candidates) > 2, calls


@pytest.mark.parametrize(
  'key, bad',
  [('compute_s', -0.1), ('compute_s', float('inf')), ('compute_s', float('nan')),
   ('compute_budget_s', 0.0), ('compute_budget_s', float('nan'))],
)  # fmt: skip
def test_a_compute_term_that_is_not_seconds_is_refused(tmp_path, key, bad):
  config = config_lib.base()
  config.network[key] = bad
  with pytest.raises(ValueError, match=rf'network.{key} must be a finite number of seconds'):
    factory.build(config, str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()


def test_a_run_that_diverges_trains_on_and_reports_nan(tmp_path, data_dir, monkeypatch):
  """A learning rate of 1e4 sends the loss to inf and NaN within a few steps; the noise measured
  on every step is then NaN too, which is recorded but kept out of the smoothed γ."""
  _, records, _ = run_digits(
    tmp_path, 'diverged', data_dir, monkeypatch, steps=6, noise_every=1,
    **{'optimizer.learning_rate': 1e4, 'optimizer.schedule': 'constant'},
  )  # fmt: skip
  assert len(records) == 6
  assert np.isnan(records[-1]['loss']) and np.isnan(records[-1]['noise_worker_sq'])
  finite = [r for r in records if np.isfinite(r['noise_worker_sq'])]
  assert finite and all(np.isfinite(r['gamma']) for r in records), records


@pytest.mark.parametrize('examples, chunks', [(0, [128, 128, 104]), (100, [100]), (200, [128, 72])])
def test_eval_examples_evaluates_the_test_splits_first_examples(tmp_path, data_dir, monkeypatch,
                                                                examples, chunks):  # fmt: skip
  from jaxdist.train import feed

  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  config = factory.load_config(
    f'{REPO}/configs/digits.py:runlocal', eval_examples=examples, eval_batch_size=128
  )
  exp = factory.build(config, str(tmp_path / 'w'))
  assert len(exp.dataset.test) == 360  # every fifth of the 1,797 digits
  got = feed.eval_chunks(exp)
  assert [int(mask.sum()) for *_, mask in got] == chunks  # the mask marks the real examples
  first = exp.dataset.inputs(exp.dataset.test, np.arange(chunks[0]))[0]
  np.testing.assert_array_equal(np.asarray(got[0][0])[: chunks[0]], first)  # the first, in order


@pytest.mark.parametrize('workers', [8, 16])  # one worker per device, and two
def test_the_compute_term_times_a_copy_of_the_first_worker_s_replica(workers):
  from jaxdist.train import calibrate

  layout = runtime.layout(workers, devices=8)
  rows = np.arange(workers * 3, dtype=np.float32).reshape(workers, 3)
  state = {'w': jax.device_put(rows, layout.sharding), 'b': {'n': jax.device_put(
    np.arange(workers, dtype=np.int32), layout.sharding)}}  # fmt: skip
  one = runtime.layout(1, devices=1, device_list=jax.local_devices()[:1])
  replica = calibrate.one_replica(state, one)
  np.testing.assert_array_equal(np.asarray(replica['w']), [[0.0, 1.0, 2.0]])
  np.testing.assert_array_equal(np.asarray(replica['b']['n']), [0])
  assert replica['w'].sharding == one.sharding and replica['w'].dtype == np.float32
  jax.tree.map(lambda x: x.delete(), replica)  # as the timed step's donation does
  np.testing.assert_array_equal(np.asarray(state['w']), rows)  # the run's state is untouched
