"""Heterogeneity-aware DiLoCo (`diloco(by_steps=True)`) and `sit_out`: a NumPy reference of the
rule, plain DiLoCo when every worker takes every step, and the bytes in the lowered HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing

AX = runtime.AXES
SHAPES = {'w': (5, 3), 'b': (3,)}
LR, MOMENTUM, OUTER_LR, BETA = 0.1, 0.5, 0.7, 0.9
PERIOD, ROUNDS = 4, 3
TAKEN = (4, 2, 1)  # the steps each of 3 workers takes a round: a fast one, two slower
TOL = {'rtol': 1e-5, 'atol': 1e-6, 'equal_nan': False}


def draw(seed, lead=()):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal((*lead, *s)).astype(np.float32) for k, s in SHAPES.items()}


def chain(by_steps=True):
  outer = optax.sgd(OUTER_LR, momentum=BETA, nesterov=True)
  inner = sync.sit_out(optax.sgd(LR, momentum=MOMENTUM))
  return optax.chain(inner, sync.diloco(outer, PERIOD, axis_name=AX, by_steps=by_steps))


def weights(t, taken=TAKEN):
  """Each worker's examples at step t: 8 on its first taken[k] steps of the round, then 0."""
  return np.array([8 if t % PERIOD < h else 0 for h in taken], np.int32)


def reference(start, grads, taken=TAKEN):
  """The rule in NumPy (float64): worker k takes SGD-with-momentum steps on the first taken[k]
  slots of each round (its momentum untouched on the others); at the round's end
  Δ = Σ_k h_k (a − w_k) / Σ_k h_k, a ← Nesterov SGD(a, Δ), every w_k ← a."""
  keys, n = list(SHAPES), len(taken)
  w = [{k: start[k].astype(np.float64) for k in keys} for _ in range(n)]
  anchor = {k: start[k].astype(np.float64) for k in keys}
  trace = [{k: np.zeros_like(anchor[k]) for k in keys} for _ in range(n)]
  outer = {k: np.zeros_like(anchor[k]) for k in keys}
  for t, g in enumerate(grads):
    for m in range(n):
      if t % PERIOD < taken[m]:
        trace[m] = {k: g[k][m] + MOMENTUM * trace[m][k] for k in keys}
        w[m] = {k: w[m][k] - LR * trace[m][k] for k in keys}
    if (t + 1) % PERIOD == 0:
      total = sum(taken)
      delta = {k: sum(h * (anchor[k] - w[m][k]) for m, h in enumerate(taken)) / total for k in keys}
      outer = {k: delta[k] + BETA * outer[k] for k in keys}
      anchor = {k: anchor[k] - OUTER_LR * (delta[k] + BETA * outer[k]) for k in keys}
      w = [dict(anchor) for _ in range(n)]
  return w


@pytest.mark.parametrize('devices', [3, 1])  # a worker a device; three simulated on one
def test_steps_weighted_diloco_matches_the_numpy_rule(devices):
  start = draw(0)
  grads = [draw(t + 1, lead=(3,)) for t in range(PERIOD * ROUNDS)]
  run = testing.Run(chain(), start, workers=3, devices=devices)
  for t, g in enumerate(grads):
    run(g, weight=weights(t))
    if t % PERIOD == PERIOD - 2:  # worker 2 has sat out the round's last steps: its model stays
      got = jax.tree.map(lambda a: np.asarray(a)[2], run.params)
      want = reference(start, grads[: t + 1])[2]
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), got, want)
  want = reference(start, grads)
  for m in range(3):
    got = jax.tree.map(lambda a, m=m: np.asarray(a)[m], run.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), got, want[m])
  # not the plain mean: weighting by (4, 2, 1) moves the model elsewhere
  plain = reference(start, grads, taken=(PERIOD,) * 3)[0]
  assert not np.allclose(np.asarray(run.params['w'])[0], plain['w'], atol=1e-3)
  assert [int(s) for s in np.asarray(run.state[1].synced)] == [ROUNDS] * 3
  assert [int(h) for h in np.asarray(run.state[1].taken)] == [0, 0, 0]  # restarts each round


def test_every_worker_taking_every_step_is_plain_diloco():
  start = draw(0)
  grads = [draw(t + 1, lead=(4,)) for t in range(PERIOD * 2)]
  steps = testing.Run(chain(by_steps=True), start, workers=4)
  plain = testing.Run(chain(by_steps=False), start, workers=4)
  for g in grads:
    steps(g, weight=5)
    plain(g, weight=5)
  for a, b in zip(jax.tree.leaves(steps.params), jax.tree.leaves(plain.params), strict=True):
    assert np.all(np.isfinite(np.asarray(a)))
    np.testing.assert_allclose(a, b, **TOL)


def test_sit_out_keeps_the_model_and_the_optimizer_state():
  tx = sync.sit_out(optax.adam(0.1))
  g = {'x': jnp.array([1.0, -2.0])}
  state = tx.init(g)
  u1, s1 = tx.update(g, state, weight=4)
  u0, s0 = tx.update(g, s1, weight=0)
  assert np.all(np.asarray(u0['x']) == 0) and np.any(np.asarray(u1['x']) != 0)
  for a, b in zip(jax.tree.leaves(s0), jax.tree.leaves(s1), strict=True):
    np.testing.assert_array_equal(a, b)  # Adam's moments and count as they were
  u, _ = tx.update(g, s1)  # no weight: the optimizer's own step
  want, _ = optax.adam(0.1).update(g, s1)
  np.testing.assert_array_equal(u['x'], want['x'])


def test_one_all_reduce_of_the_weighted_tree_and_its_weight_at_the_outer_step():
  start = draw(0)
  workers = runtime.layout(3, devices=3)
  tx = chain()
  params = jax.tree.map(lambda x: jnp.broadcast_to(x, (3, *x.shape)), start)
  state = jax.vmap(tx.init)(params)

  def step(g, s, p, w):
    return tx.update(g, s, p, weight=w)

  args = [jax.device_put(t, workers.sharding) for t in (params, state, params, weights(0))]
  text = jax.jit(workers.map(step, in_axes=(0, 0, 0, 0))).lower(*args).compile().as_text()
  payload = sum(int(np.prod(s)) for s in SHAPES.values()) * 4 + 4  # the tree and its weight
  assert [c.nbytes for c in comm.hlo.collectives(text) if c.nbytes > 4] == [payload]
  wire = comm.find_transfers(state)
  assert len(wire) == 1 and wire[0].nbytes == payload


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match=r'by_steps=True.*not with eager, exchange or an averager'):
    sync.diloco(period=4, axis_name=AX, by_steps=True, eager=True)
  tx = chain()
  g = draw(0)
  with pytest.raises(ValueError, match='counts the steps each worker takes: call update'):
    jax.vmap(lambda p: tx.update(p, tx.init(p), p), axis_name=AX)(
      jax.tree.map(lambda x: x[None], g)
    )
