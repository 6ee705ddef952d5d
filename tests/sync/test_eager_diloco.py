"""DiLoCo with eager updates against a NumPy reference of the rule, DiLoCo and the lowered HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing

AX = runtime.AXES
SHAPES = {'w': (5, 3), 'b': (3,)}
LR, OUTER_LR, BETA = 0.1, 0.7, 0.9


def draw(seed, lead=()):
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal((*lead, *s)).astype(np.float32) for k, s in SHAPES.items()}


def eager(period, workers, **kw):
  outer = optax.sgd(OUTER_LR, momentum=BETA, nesterov=True)
  tx = sync.diloco(outer, period, axis_name=AX, eager=True, **kw)
  return optax.chain(optax.sgd(LR), tx)


def reference(start, grads, period, workers):
  """The eager rule in NumPy, per worker m (float64): inner SGD; at the end of each round r,
  Δ_m = θ_m − w_m, Δ̃_m = Δ̄_prev + (Δ_m − Δ_m,prev) / N, θ_m ← Nesterov SGD(θ_m, Δ̃_m),
  w_m ← θ_m; Δ̄_prev, Δ_m,prev ← mean Δ, Δ_m (zeros before the first round)."""
  keys = list(SHAPES)
  w = [{k: start[k].astype(np.float64) for k in keys} for _ in range(workers)]
  theta = [dict(x) for x in w]
  trace = [{k: np.zeros_like(x[k]) for k in keys} for x in w]
  prev = [{k: np.zeros_like(x[k]) for k in keys} for x in w]
  avg_prev = {k: np.zeros_like(w[0][k]) for k in keys}
  out = []
  for t, g in enumerate(grads):
    for m in range(workers):
      w[m] = {k: w[m][k] - LR * g[k][m] for k in keys}
    if (t + 1) % period == 0:
      fresh = [{k: theta[m][k] - w[m][k] for k in keys} for m in range(workers)]
      for m in range(workers):
        mixed = {k: avg_prev[k] + (fresh[m][k] - prev[m][k]) / workers for k in keys}
        trace[m] = {k: mixed[k] + BETA * trace[m][k] for k in keys}
        theta[m] = {k: theta[m][k] - OUTER_LR * (mixed[k] + BETA * trace[m][k]) for k in keys}
        w[m] = dict(theta[m])
      avg_prev = {k: np.mean([f[k] for f in fresh], axis=0) for k in keys}
      prev = fresh
    out.append({k: np.stack([w[m][k] for m in range(workers)]) for k in keys})
  return out


@pytest.mark.parametrize('devices', [4, 2], ids=['4-devices', '2x2-simulated'])
def test_eager_updates_follow_the_rule_by_numpy(devices):
  """4 workers, H = 3, 4 rounds (outer Nesterov, lr 0.7, momentum 0.9): every step's models,
  worker by worker (they differ after an outer step by their own share of Δ)."""
  start, grads = draw(0), [draw(10 + t, (4,)) for t in range(12)]
  run = testing.Run(eager(3, 4), start, workers=4, devices=devices)
  want = reference(start, grads, 3, 4)
  for t in range(12):
    got = run(grads[t])
    for k in SHAPES:
      np.testing.assert_allclose(got[k], want[t][k], rtol=2e-5, atol=2e-6, equal_nan=False,
                                 err_msg=f'{k}, step {t}')  # fmt: skip
  assert not np.allclose(run.params['w'][0], run.params['w'][1])  # per-worker outer parameters
  assert run.history == [[0], [0], [1]] * 4  # the all-reduce at each outer step
  assert all(t.overlap for t in comm.find_transfers(run.state))


def test_one_worker_is_diloco():
  """N = 1: Δ̃ = Δ^{r−1} + Δ^r − Δ^{r−1} = Δ^r, DiLoCo's outer step (to float32 rounding)."""
  start, grads = draw(1), [draw(20 + t, (1,)) for t in range(9)]
  outer = lambda: optax.sgd(OUTER_LR, momentum=BETA, nesterov=True)
  plain = testing.Run(optax.chain(optax.sgd(LR), sync.diloco(outer(), 3, axis_name=AX)), start,
                      workers=1)  # fmt: skip
  run = testing.Run(eager(3, 1), start, workers=1)
  for t in range(9):
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=False)
    jax.tree.map(close, run(grads[t]), plain(grads[t]))


def test_the_all_reduce_feeds_only_the_state_and_a_deferred_step_sends_nothing():
  """The step compiled with only its new parameters as output keeps no all-reduce (inline: its
  result waits in `pending` for the next outer step); the deferred step has none at all."""
  workers = runtime.layout(4, devices=4)
  start = jax.tree.map(lambda x: jnp.broadcast_to(x, (4, *x.shape)), draw(2))
  grads = draw(3, (4,))
  for exchange in ('inline', 'deferred'):
    tx = eager(1, 4, exchange=exchange)

    def step(g, s, p, tx=tx):
      updates, s = tx.update(g, s, p)
      return sync.apply_updates(p, updates, s), s

    params_only = jax.jit(workers.map(lambda g, s, p: step(g, s, p)[0], (0, 0, 0)))
    whole = jax.jit(workers.map(step, (0, 0, 0)))
    args = (grads, jax.vmap(tx.init)(start), start)
    found = comm.hlo.collectives(params_only.lower(*args).compile().as_text())
    assert [c for c in found if c.nbytes > 4] == []
    found = comm.hlo.collectives(whole.lower(*args).compile().as_text())
    assert [c.nbytes for c in found if c.nbytes > 4] == ([] if exchange == 'deferred' else [72])


def test_deferred_exchange_gives_the_inline_run_bitwise():
  """H = 2, 4 workers on 4 devices: the deferred step plus `diloco_exchange`'s average, run
  after each outer step and put back before the next, is the inline run, bit for bit."""
  start, grads = draw(4), [draw(30 + t, (4,)) for t in range(8)]
  inline = testing.Run(eager(2, 4), start, workers=4, devices=4)
  run = testing.Run(eager(2, 4, exchange='deferred'), start, workers=4, devices=4)
  exchange = sync.diloco_exchange(period=2, axis_name=AX)
  assert (
    [exchange.sent(t) for t in range(4)]
    == [None, 0, None, 0]
    == [exchange.applied(t) for t in range(4)]
  )
  average = jax.jit(run.workers.map(lambda x: exchange.average(0, x), (0,)))
  for t in range(8):
    want = inline(grads[t])
    got = run(grads[t])
    if exchange.sent(t) is not None:
      inner, state = run.state
      run.state = (inner, state._replace(pending=average(state.pending)))
    jax.tree.map(np.testing.assert_array_equal, got, want)
    jax.tree.map(np.testing.assert_array_equal, run.state[1], inline.state[1])
  assert run.history == inline.history


def test_eager_misuse_is_refused():
  with pytest.raises(ValueError, match='needs eager=True'):
    sync.diloco(period=4, axis_name=AX, exchange='deferred')
  with pytest.raises(ValueError, match='pass averager=None'):
    sync.diloco(period=4, axis_name=AX, eager=True, averager=sync.allreduce(axis_name=AX))
  with pytest.raises(ValueError, match="finishes exchange='deferred' steps"):
    sync.diloco_exchange(period=4, axis_name=AX, exchange='inline')
