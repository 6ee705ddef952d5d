"""jaxdist under optax's wrappers: non-finite steps, accumulation, injection."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing

W = 8
AX = runtime.AXES
SHAPES = {'w': (6, 4), 'b': (4,)}


def start():
  rng = np.random.default_rng(7)
  return {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def grads_at(step):
  rng = np.random.default_rng(500 + step)
  return {
    k: jnp.asarray(rng.standard_normal((W, *s)).astype(np.float32)) for k, s in SHAPES.items()
  }


def with_nan(grads, worker=3):
  """`grads` with one NaN in one worker's gradient."""
  return {**grads, 'b': grads['b'].at[worker, 0].set(jnp.nan)}


def make_run(tx, devices=1):
  return testing.Run(tx, start(), workers=W, devices=devices)


def bsp(momentum=0.9):
  return optax.chain(sync.allreduce(axis_name=AX), optax.sgd(0.1, momentum=momentum))


def assert_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def assert_close(a, b, atol=1e-6):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=1e-6), a, b)


def assert_same_updates(run, want, inner_state, steps):
  """Bitwise: each step's updates of `run` and `want` from the same parameters and state.

  Parameters are compared step by step rather than after the run: XLA contracts
  `p + lr·m` into one FMA in the plain chain but not across a conditional's
  boundary, so the applied parameters may differ in the last bit.
  """
  for t in range(steps):
    want.params, want.state = run.params, inner_state(run.state)
    run(grads_at(t))
    want(grads_at(t))
    assert_equal(run.updates, want.updates)
  assert_close(run.params, want.params)


def all_finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


def in_branches(run, grads, min_bytes=5):
  """Whether every collective of at least `min_bytes` sits in a conditional's branch."""
  text = run.hlo(grads)
  branches = comm.hlo.conditional_branches(text)
  found = [c for c in comm.hlo.collectives(text) if c.nbytes >= min_bytes]
  return bool(found) and all(c.computation in branches for c in found)


# --- non-finite gradients -----------------------------------------------------------------


def test_optax_apply_if_finite_around_a_collective_poisons_the_healthy_workers():
  """The failure the new transform fixes: per-worker decisions around an all-reduce."""
  run = make_run(optax.apply_if_finite(bsp(), max_consecutive_errors=5))
  run(with_nan(grads_at(0)))
  healthy = np.delete(np.asarray(run.params['b']), 3, axis=0)
  assert np.isnan(healthy).any(axis=1).all()  # on real devices: the NaN worker skips it, a hang


def test_skip_nonfinite_one_nan_no_worker_moves_and_nothing_is_nan():
  run = make_run(sync.skip_nonfinite(bsp(), axis_name=AX))
  before = run.params
  run(with_nan(grads_at(0)))
  assert_equal(run.params, before)
  assert all_finite(run.params) and all_finite(run.state.inner_state) and all_finite(run.updates)
  assert run.history == [[0, 1]]  # the gradient all-reduce did not run, the 4-byte flags did
  assert int(run.state.total_notfinite[0]) == 1 and not bool(run.state.last_finite[0])
  run(grads_at(1))  # the next finite step is the chain's first step
  want = make_run(bsp())
  want(grads_at(1))
  assert_close(run.params, want.params)
  assert run.history[-1] == [1, 1] and int(run.state.notfinite_count[0]) == 0


@pytest.mark.parametrize('devices', [1, 8], ids=['simulated', '8-devices'])
def test_skip_nonfinite_all_finite_is_the_chain(devices):
  run = make_run(sync.skip_nonfinite(bsp(), axis_name=AX), devices)
  assert_same_updates(run, make_run(bsp(), devices), lambda s: s.inner_state, 4)
  assert run.history == [[1, 1]] * 4
  assert [t.nbytes for t in comm.find_transfers(run.state)] == [4 * (24 + 4), 4]


def test_skip_nonfinite_puts_the_chains_collective_in_a_branch():
  run = make_run(sync.skip_nonfinite(bsp(), axis_name=AX), devices=8)
  assert in_branches(run, grads_at(0))
  text = run.hlo(grads_at(0))
  outside = [
    c
    for c in comm.hlo.collectives(text)
    if c.computation not in comm.hlo.conditional_branches(text)
  ]
  assert [(c.kind, c.nbytes) for c in outside] == [('all-reduce', 4)]  # the flags


# --- gradient accumulation ----------------------------------------------------------------


K = 4


def test_accumulate_equals_the_chain_applied_once_to_the_mean():
  run = make_run(sync.accumulate(bsp(), K, axis_name=AX))
  run.steps(K, grads_at)
  mean = jax.tree.map(lambda *g: sum(g) / K, *[grads_at(t) for t in range(K)])
  want = make_run(bsp())
  want(mean)
  assert_close(run.params, want.params)
  assert int(run.state.gradient_step[0]) == 1 and int(run.state.mini_step[0]) == 0


def test_accumulate_equals_optax_multisteps_and_communicates_once_per_k():
  run = make_run(sync.accumulate(bsp(), K, axis_name=AX))
  multi = make_run(optax.MultiSteps(bsp(), K))
  assert_close(run.steps(3 * K, grads_at), multi.steps(3 * K, grads_at))
  assert [h[0] for h in run.history] == [0, 0, 0, 1] * 3
  assert all(all_finite(u) for u in jax.tree.leaves(run.updates))


def test_accumulate_k_1_is_the_chain():
  run = make_run(sync.accumulate(bsp(), 1, axis_name=AX))
  assert_same_updates(run, make_run(bsp()), lambda s: s.inner_state, 3)
  assert run.history == [[1]] * 3


def test_accumulate_puts_the_collective_in_a_branch():
  run = make_run(sync.accumulate(bsp(), K, axis_name=AX), devices=8)
  assert in_branches(run, grads_at(0), min_bytes=1)


def test_accumulate_rejects_k_0():
  with pytest.raises(ValueError, match='k must be >= 1, got 0'):
    sync.accumulate(bsp(), 0, axis_name=AX)


# --- injected hyperparameters -------------------------------------------------------------


def injected(state, **values):
  """`state` (a chain's or a transform's) with its injected hyperparameters set to `values`."""
  is_inject = lambda s: hasattr(s, 'hyperparams')

  def change(s):
    if not is_inject(s):
      return s
    hp = {k: jnp.full_like(h, values[k]) if k in values else h for k, h in s.hyperparams.items()}
    return s._replace(hyperparams=hp)

  return jax.tree.map(change, state, is_leaf=is_inject)


def step_is_plain_sgd(run, grads, lr=0.1):
  before = run.params
  run(grads)
  assert_close(run.params, jax.tree.map(lambda p, g: p - lr * g, before, grads), atol=1e-5)


def test_sma_alpha_can_be_injected_and_changed():
  inject = optax.inject_hyperparams(sync.sma)
  run = make_run(optax.chain(optax.sgd(0.1), inject(alpha=0.25, axis_name=AX)))
  want = make_run(optax.chain(optax.sgd(0.1), sync.sma(0.25, axis_name=AX)))
  assert_close(run.steps(3, grads_at), want.steps(3, grads_at))
  run.state = injected(run.state, alpha=0.0)  # learners independent from now on
  step_is_plain_sgd(run, grads_at(3))


def test_selsync_threshold_can_be_injected_and_changed():
  inject = optax.inject_hyperparams(sync.selsync, static_args=('window',))
  run = make_run(inject(optax.sgd(0.1), threshold=1e9, axis_name=AX, window=2))
  want = make_run(sync.selsync(optax.sgd(0.1), 1e9, axis_name=AX, window=2))
  assert_close(run.steps(4, grads_at), want.steps(4, grads_at))
  assert [h[1] for h in run.history] == [1, 1, 0, 0]  # warm-up, then never
  run.state = injected(run.state, threshold=0.0)
  run(grads_at(4))
  assert run.history[-1] == [1, 1]
  assert_close(run.params, jax.tree.map(lambda x: jnp.broadcast_to(x[0], x.shape), run.params))


def test_local_clip_max_norm_can_be_injected_and_changed():
  inject = optax.inject_hyperparams(sync.local_clip)
  run = make_run(optax.chain(inject(max_norm=1.0, axis_name=AX), optax.sgd(0.1)))
  want = make_run(optax.chain(sync.local_clip(1.0, axis_name=AX), optax.sgd(0.1)))
  assert_close(run.steps(2, grads_at), want.steps(2, grads_at))
  run.state = injected(run.state, max_norm=1e6)  # no clipping
  step_is_plain_sgd(run, grads_at(2))


@pytest.mark.parametrize(
  'factory, args, static',
  [
    (sync.local_sgd, dict(period=2, warmup_steps=1, axis_name=AX), ()),
    (sync.diloco, dict(outer_optimizer=optax.sgd(0.5), period=2, axis_name=AX), ()),
    (sync.spike_compensation, dict(delay=2, momentum=0.5), ('delay',)),
    (
      sync.streaming_diloco,
      dict(outer_optimizer=optax.sgd(0.5), period=2, axis_name=AX, fragments=2, delay=0),
      ('fragments', 'delay', 'alpha'),
    ),
  ],
  ids=['local_sgd', 'diloco', 'spike_compensation', 'streaming_diloco'],
)
def test_other_numeric_arguments_can_be_injected(factory, args, static):
  inject = optax.inject_hyperparams(factory, static_args=static)
  run = make_run(optax.chain(optax.sgd(0.1), inject(**args)))
  want = make_run(optax.chain(optax.sgd(0.1), factory(**args)))
  assert_close(run.steps(4, grads_at), want.steps(4, grads_at))


@pytest.mark.parametrize(
  'factory, args, message',
  [
    (sync.sma, dict(alpha=-1.0, axis_name=AX), 'alpha must be >= 0, got -1.0'),
    (
      sync.selsync,
      dict(optimizer=optax.sgd(0.1), threshold=-0.5, axis_name=AX),
      'threshold must be >= 0, got -0.5',
    ),
    (sync.local_clip, dict(max_norm=0.0, axis_name=AX), r'max_norm must be > 0, got 0.0'),
  ],
  ids=['sma', 'selsync', 'local_clip'],
)
def test_a_bad_concrete_value_still_raises(factory, args, message):
  with pytest.raises(ValueError, match=message):
    factory(**args)
  with pytest.raises(ValueError, match=message):  # injected: checked where init builds it
    optax.inject_hyperparams(factory)(**args).init(start())
