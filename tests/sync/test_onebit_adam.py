"""1-bit Adam and 0/1 Adam: Adam before freezing, the 1-bit all-reduce by hand, the HLO wire."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdist as jd
from jaxdist import comm, runtime, testing

AX = runtime.AXES
W = 8
SHAPES = {'k': (3, 4, 6), 'b': (5,), 's': ()}  # 3-D, 1-D and 0-D leaves


def start():
  rng = np.random.default_rng(3)
  return {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def grads_at(t, workers=W):
  rng = np.random.default_rng(100 + t)
  return {
    k: jnp.asarray(rng.standard_normal((workers, *s)).astype(np.float32)) for k, s in SHAPES.items()
  }


def close(a, b, atol=1e-6):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=atol), a, b)


def equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def adamw_bsp(lr, **kw):
  return optax.chain(jd.sync.allreduce(axis_name=AX), optax.adamw(lr, **kw))


def same_updates(run, want, steps):
  """Each step's updates of `run` and `want` agree (1e-6) from the same parameters."""
  for t in range(steps):
    want.params = run.params
    run(grads_at(t))
    want(grads_at(t))
    close(run.updates, want.updates)


# --- degenerate cases: before freezing, both are AdamW on the all-reduced gradient ------------

LR = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)
ADAM = dict(b1=0.8, b2=0.99, eps=1e-8, weight_decay=0.1)


@pytest.mark.parametrize('devices', [1, 2], ids=['8-simulated', '2x4'])
def test_onebit_adam_before_freezing_is_adamw_with_an_allreduce(devices):
  tx = jd.sync.onebit_adam(LR, axis_name=AX, num_workers=W, warmup_steps=4, **ADAM)
  run = testing.Run(tx, start(), workers=W, devices=devices)
  same_updates(run, testing.Run(adamw_bsp(LR, **ADAM), start(), workers=W, devices=devices), 4)
  assert run.history == [[1, 0, 0, 0, 0]] * 4


def test_zero_one_adam_with_every_step_in_tv_is_adamw_with_an_allreduce():
  tx = jd.sync.zero_one_adam(
    LR, axis_name=AX, num_workers=W, var_freeze_step=10, var_update_scaler=10**6, **ADAM
  )
  run = testing.Run(tx, start(), workers=W, devices=2)
  same_updates(run, testing.Run(adamw_bsp(LR, **ADAM), start(), workers=W, devices=2), 4)
  assert run.history == [[1, 0, 0, 0, 0]] * 4


# --- the compressed all-reduce by hand -------------------------------------------------------


def onebit(trees, devices=2, errors=None):
  """onebit_allreduce of 2 workers' `trees` ([2, ...] per leaf): (mean, δ_w, δ_s)."""
  workers = runtime.layout(2, devices=devices)

  def fn(x, e, s):
    return jd.sync.onebit_allreduce(x, e, s, axis_name=AX)[:3]

  if errors is None:
    tx = jd.sync.onebit_adam(1.0, axis_name=AX, num_workers=2)
    state = jax.vmap(tx.init)(trees)
    errors = state.worker_error, state.server_error
  return jax.jit(workers.map(fn, in_axes=(0, 0, 0)))(trees, *errors)


SGN_A = np.array([1, 1, -1, -1] * 4, np.float32)
SGN_B = np.array([1, 1, -1, -1] * 2 + [1, -1] * 4, np.float32)


def test_signs_and_scales_by_hand_two_workers_sixteen_elements():
  # worker 0: ±2 everywhere (scale 2, no error); worker 1: magnitudes 1 and 7 (scale √25 = 5)
  x0 = 2 * SGN_B
  x1 = np.array([1, 7, -1, -7, 1, 7, -1, -7, 7, 1, -7, -1, 7, 1, -7, -1], np.float32)
  mean, werr, serr = onebit({'v': jnp.asarray(np.stack([x0, x1]))})
  # server 0 (elements 0-7): both workers' signs agree, y = (2 + 5)/2 = 3.5, exact
  # server 1 (elements 8-15): y = (2·(+-+-…) + 5·(++--…))/2 = (3.5, 1.5, -1.5, -3.5) × 2,
  # scale √((2·3.5² + 2·1.5²)·2/8) = √7.25
  r = np.sqrt(7.25)
  want = np.concatenate([3.5 * SGN_A[:8], r * SGN_A[8:]])
  np.testing.assert_allclose(mean['v'], np.stack([want, want]), rtol=1e-6)
  np.testing.assert_array_equal(werr['v'][0], np.zeros(16))
  np.testing.assert_array_equal(
    werr['v'][1], [-4, 2, 4, -2, -4, 2, 4, -2, 2, -4, -2, 4, 2, -4, -2, 4]
  )
  np.testing.assert_array_equal(serr[0], np.zeros(8))
  y1 = np.array([3.5, 1.5, -1.5, -3.5] * 2)
  np.testing.assert_allclose(serr[1], y1 - r * np.sign(y1), rtol=1e-6)


def test_padding_does_not_count_zero_is_plus_and_a_scalar_is_averaged_exactly():
  # 3 elements on 2 workers: one chunk of 8 holds them (3 real), the other is all padding
  x = np.array([[3.0, -4.0, 0.0], [1.0, 1.0, 1.0]], np.float32)
  s = np.array([2.0, -1.0], np.float32)
  mean, werr, serr = onebit({'v': jnp.asarray(x), 's': jnp.asarray(s)})
  s0 = 5 / np.sqrt(3)  # ‖(3, -4, 0)‖/√3: padding not counted; sgn(0) = +1
  y = (s0 * np.array([1, -1, 1]) + 1.0) / 2
  scale = np.sqrt(np.sum(y**2) / 3)
  np.testing.assert_allclose(mean['v'][0], scale * np.sign(y), rtol=1e-6)
  np.testing.assert_allclose(mean['v'][1], scale * np.sign(y), rtol=1e-6)
  np.testing.assert_allclose(werr['v'][0], [3 - s0, -4 + s0, -s0], atol=1e-6)
  np.testing.assert_allclose(werr['v'][1], [0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(mean['s'], [0.5, 0.5], rtol=1e-6)  # (2·(+1) + 1·(−1))/2, d = 1
  # layout: s's chunk then v's (tree order), 8 each; s and v's padding carry no error, and
  # worker 1 serves only padding
  np.testing.assert_array_equal(serr[0, :8], 0)
  np.testing.assert_allclose(serr[0, 8:11], y - scale * np.sign(y), rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(serr[0, 11:], 0)
  np.testing.assert_array_equal(serr[1], 0)


@pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2x4'])
def test_error_feedback_conserves_mass_over_steps(devices):
  # mean_n(x_n + δ_w,n) + δ_s = result + mean_n(δ_w,n') + δ_s' (δ_s concatenated by server)
  workers = runtime.layout(W, devices=devices)
  fn = jax.jit(
    workers.map(
      lambda x, e, s: jd.sync.onebit_allreduce(x, e, s, axis_name=AX)[:3], in_axes=(0, 0, 0)
    )
  )
  tx = jd.sync.onebit_adam(1.0, axis_name=AX, num_workers=W)
  state = jax.vmap(tx.init)(grads_at(0))
  werr, serr = state.worker_error, state.server_error
  chunks = {'k': 16, 'b': 8, 's': 8}  # 8·⌈d/64⌉ per leaf, in flattening order b, k, s
  for t in range(3):
    x = grads_at(t)
    mean, werr2, serr2 = fn(x, werr, serr)
    at = 0
    for k in ('b', 'k', 's'):
      d, c = int(np.prod(SHAPES[k])), chunks[k]
      flat = lambda tree, k=k: np.asarray(tree[k], np.float64).reshape(W, -1)
      before = (flat(x) + flat(werr)).mean(0) + np.asarray(serr)[:, at : at + c].reshape(-1)[:d]
      after = flat(mean)[0] + flat(werr2).mean(0) + np.asarray(serr2)[:, at : at + c].ravel()[:d]
      np.testing.assert_allclose(after, before, atol=1e-5, err_msg=f'{k} step {t}')
      np.testing.assert_array_equal(flat(mean), np.broadcast_to(flat(mean)[0], flat(mean).shape))
      at += c
    werr, serr = werr2, serr2


# --- 1-bit Adam's compressed stage by hand -------------------------------------------------


def test_onebit_adam_compressed_step_by_hand():
  # b1 = 0: m is the gradient itself; step 1 (warm-up) with gradient 1 everywhere sets
  # v = (1 - b2)·1 = 0.5 (no bias correction); step 2 sends the two workers' gradients at
  # 1 bit (the sixteen-element case above) and steps with the frozen v.
  # 1-bit and the frozen v; clip=0: DeepSpeed's unbounded direction, clip=2: |d| <= 2.
  x1 = np.array([1, 7, -1, -7, 1, 7, -1, -7, 7, 1, -7, -1, 7, 1, -7, -1], np.float32)
  m = np.concatenate([3.5 * SGN_A[:8], np.sqrt(7.25) * SGN_A[8:]])
  d = m / (np.sqrt(0.5) + 1e-8)  # 4.95 and 3.81 in size
  for clip, want in [(0.0, d), (2.0, 2 * SGN_A), (4.0, np.where(np.abs(d) > 4, 4 * SGN_A, d))]:
    tx = jd.sync.onebit_adam(
      0.1, axis_name=AX, num_workers=2, warmup_steps=1, b1=0.0, b2=0.5, bias_correction=False,
      clip=clip,
    )  # fmt: skip
    run = testing.Run(tx, {'v': jnp.zeros(16)}, workers=2)
    run({'v': jnp.ones((2, 16))})
    np.testing.assert_allclose(run.updates['v'], np.full((2, 16), -0.1 / (np.sqrt(0.5) + 1e-8)))
    run({'v': jnp.asarray(np.stack([2 * SGN_B, x1]))})
    np.testing.assert_allclose(run.updates['v'][1], -0.1 * want, rtol=1e-6, err_msg=f'{clip}')
  np.testing.assert_allclose(run.state.nu['v'], np.full((2, 16), 0.5))  # frozen
  np.testing.assert_array_equal(run.state.mu['v'][0], run.state.mu['v'][1])
  assert run.history == [[1, 0, 0, 0, 0], [0, 1, 1, 1, 1]]


def test_entries_silent_in_the_warm_up_get_no_step_or_a_bounded_one():
  # The divergence on the digits CNN (NaN 3 steps after the freeze): an entry whose v is ~0 at
  # the freeze (a ReLU unit nearly dead in the warm-up) gets the tensor's 1-bit scale in m and
  # steps by η·scale/√v. Warm-up gradient: entry 0 → 0 (v = 0), entry 1 → 1e-4, the rest 2;
  # b1 = 0, b2 = 0.5, no bias correction: v = (0, 5e-9, 2, …). Step 2: the same gradient
  # (0, 1e-4, 1, …) on both workers; its 1-bit code is s·(+1, …) with s = ‖x‖/√16 everywhere
  # (sgn(0) = +1; equal workers, so the server sees s everywhere too).
  warm = np.array([0.0, 1e-4] + [2.0] * 14, np.float32)
  x = np.array([0.0, 1e-4] + [1.0] * 14, np.float32)
  s = np.sqrt(np.sum(x.astype(np.float64) ** 2) / 16)
  root_v = np.sqrt(0.5 * warm.astype(np.float64) ** 2)
  for clip in (0.0, 1.0):
    tx = jd.sync.onebit_adam(
      0.1, axis_name=AX, num_workers=2, warmup_steps=1, b1=0.0, b2=0.5, bias_correction=False,
      clip=clip,
    )  # fmt: skip
    run = testing.Run(tx, {'v': jnp.zeros(16)}, workers=2)
    run({'v': jnp.asarray(np.stack([warm, warm]))})
    run({'v': jnp.asarray(np.stack([x, x]))})
    d = s / (root_v + 1e-8)  # 1.3e4 at entry 1, 0.66 for the rest
    want = -0.1 * np.where(np.arange(16) == 0, 0.0, np.minimum(d, clip) if clip else d)
    np.testing.assert_allclose(run.updates['v'][0], want, rtol=1e-5, err_msg=f'clip={clip}')
    np.testing.assert_array_equal(run.state.mu['v'][:, 0], 0)  # v = 0: m masked (1 bit ≠ 0)
  assert -0.1 * s / (root_v[1] + 1e-8) < -1000  # DeepSpeed's step (clip=0) at entry 1


def deepspeed_onebit_adam(grads, warmup, lr, b1, b2, eps, clip):
  """1-bit Adam in NumPy: per leaf, flat, N servers of c = 8·⌈d/8N⌉ elements (padding not
  counted), v = 0 masked, bias-corrected; each step's updates (replicated). `grads`: a list
  of {leaf: [N, ...]}."""
  n = len(next(iter(grads[0].values())))
  state = {}
  out = []
  sgn = lambda a: np.where(a >= 0, 1.0, -1.0)
  for t, g in enumerate(grads, start=1):
    step = {}
    for k, gk in g.items():
      shape = np.shape(gk)[1:]
      gk = np.asarray(gk, np.float64).reshape(n, -1)
      d = gk.shape[1]
      c = 8 * max(1, -(-d // (8 * n)))
      m, v, we, se = state.get(k, (np.zeros(d), np.zeros(d), np.zeros((n, d)), np.zeros((n, c))))
      if t <= warmup:
        m = b1 * m + (1 - b1) * gk.mean(0)
        v = b2 * v + (1 - b2) * gk.mean(0) ** 2
      else:
        x = b1 * m + (1 - b1) * gk + we  # every worker's own momentum, plus its error
        q = np.linalg.norm(x, axis=1, keepdims=True) / np.sqrt(d) * sgn(x)
        we = x - q
        m = np.zeros(d)
        for j in range(n):
          lo, hi = j * c, min(d, (j + 1) * c)
          if lo >= hi:
            continue
          y = q[:, lo:hi].mean(0) + se[j, : hi - lo]
          yq = np.linalg.norm(y) / np.sqrt(hi - lo) * sgn(y)
          se[j, : hi - lo] = y - yq
          m[lo:hi] = yq
        m = np.where(v > 0, m, 0.0)
      state[k] = (m, v, we, se)
      direction = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2 ** min(t, warmup))) + eps)
      if t > warmup:
        direction = np.where(v > 0, direction, 0.0)
        direction = np.clip(direction, -clip, clip) if clip else direction
      step[k] = (-lr * direction).reshape(shape)
    out.append(step)
  return out


@pytest.mark.parametrize('clip', [0.0, 1.0])
def test_compressed_stage_matches_a_numpy_deepspeed_reference(clip):
  # random gradients (nothing exactly compressible), 2 warm-up and 4 compressed steps, 4
  # workers on 2 devices; every worker's update equals the reference's
  n, shapes = 4, {'k': (3, 4, 6), 'b': (5,), 's': ()}
  rng = np.random.default_rng(7)
  grads = [
    {k: rng.standard_normal((n, *sh)).astype(np.float32) * (1 + t) for k, sh in shapes.items()}
    for t in range(6)
  ]
  kw = dict(b1=0.9, b2=0.99, eps=1e-8)
  tx = jd.sync.onebit_adam(1e-2, axis_name=AX, num_workers=n, warmup_steps=2, clip=clip, **kw)
  run = testing.Run(tx, {k: jnp.zeros(sh) for k, sh in shapes.items()}, workers=n, devices=2)
  want = deepspeed_onebit_adam(grads, 2, 1e-2, clip=clip, **kw)
  for t in range(6):
    run(jax.tree.map(jnp.asarray, grads[t]))
    for k in shapes:
      got = np.asarray(run.updates[k])
      np.testing.assert_allclose(
        got, np.broadcast_to(want[t][k], got.shape), rtol=2e-5, atol=1e-9, err_msg=f'{k} {t}'
      )


def frozen_adam(lr, b1, b2, eps, grads, freeze):
  """Adam on the mean gradient with v frozen after step `freeze`, in NumPy (bias-corrected)."""
  x = np.zeros_like(grads[0][0], np.float64)
  m, v, out = np.zeros_like(x), np.zeros_like(x), []
  for t, g in enumerate(grads, start=1):
    g = np.asarray(g, np.float64).mean(0)
    m = b1 * m + (1 - b1) * g
    if t <= freeze:
      v = b2 * v + (1 - b2) * g * g
    k = min(t, freeze)
    x = x - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**k)) + eps)
    out.append(x.copy())
  return out


@pytest.mark.parametrize('method', ['onebit_adam', 'zero_one_adam'])
def test_exactly_compressible_gradients_give_adam_with_a_frozen_variance(method):
  # every worker's gradient is a_n(t)·s (one sign pattern s, magnitudes per worker and step):
  # every 1-bit code is exact, so both methods are Adam on the mean with v frozen at step 2
  # (0/1 Adam: T_v is every step until then, then a synchronisation every step)
  s = np.array([1, -1, -1, 1, 1, 1, -1, 1], np.float32)
  a = np.random.default_rng(0).uniform(0.5, 2.0, (6, 4)).astype(np.float32)
  grads = [a[t][:, None] * s for t in range(6)]
  kw = dict(axis_name=AX, num_workers=4, b1=0.9, b2=0.99, clip=0.0)  # Adam's d, unbounded
  if method == 'onebit_adam':
    tx = jd.sync.onebit_adam(0.01, warmup_steps=2, **kw)
  else:
    tx = jd.sync.zero_one_adam(0.01, var_freeze_step=2, local_step_clipper=1, **kw)
  run = testing.Run(tx, {'x': jnp.zeros(8)}, workers=4)
  want = frozen_adam(0.01, 0.9, 0.99, 1e-8, grads, freeze=2)
  for t in range(6):
    run({'x': jnp.asarray(grads[t])})
    np.testing.assert_allclose(run.params['x'], np.stack([want[t]] * 4), rtol=1e-5, atol=1e-7)
  assert [h[0] for h in run.history] == [1, 1, 0, 0, 0, 0]
  assert [h[1] for h in run.history] == [0, 0, 1, 1, 1, 1]


# --- 0/1 Adam's schedules --------------------------------------------------------------------


def test_zero_one_adam_schedules_follow_the_code():
  # κ = 2: T_v = {1, 2} (gap 1), then gap 2: {4, 6}; phase 2 from step 7, intervals 1 (steps
  # 7, 8), 2 (9, 10: sync at 10), then 4 (capped): syncs at 12 and 16
  tx = jd.sync.zero_one_adam(
    1e-2, axis_name=AX, num_workers=W, var_freeze_step=6, var_update_scaler=2,
    local_step_scaler=2, local_step_clipper=4,
  )  # fmt: skip
  run = testing.Run(tx, start(), workers=W, devices=2)
  kinds = []
  for t in range(16):
    run(grads_at(t))
    dense, *car = run.history[-1]
    kinds.append('A' if dense else ('1' if any(car) else '.'))
  assert ''.join(kinds) == 'AA1A1A' + '11.1.1...1'
  np.testing.assert_array_equal(run.state.var_interval, 4)
  np.testing.assert_array_equal(run.state.local_interval, 4)
  np.testing.assert_array_equal(run.state.rates, 0)  # just synchronised
  close(run.params, jax.tree.map(lambda x: jnp.broadcast_to(x[0], x.shape), run.params), 1e-6)
  # between synchronisations the workers' models differ
  run(grads_at(16))
  assert not np.allclose(run.params['k'][0], run.params['k'][1])


# --- the wire in the HLO ----------------------------------------------------------------------


@pytest.mark.parametrize('method', ['onebit_adam', 'zero_one_adam'])
def test_bytes_on_the_wire_match_the_lowered_hlo(method):
  make = getattr(jd.sync, method)
  tx = make(1e-2, axis_name=AX, num_workers=W)
  run = testing.Run(tx, start(), workers=W, devices=8)
  found = comm.hlo.collectives(run.hlo(grads_at(0), compiled=False))
  # d = 72 + 5 + 1 = 78 float32; chunks 8·⌈d_l/64⌉ = 16, 8, 8 (32 elements a worker's chunk):
  # all-to-all of 8 chunks of 32 bits, all-gathers of 3 scales, 32 bits, 3 scales
  car = [('all-to-all', 8 * 32 // 8), ('all-gather', 4 * 3), ('all-gather', 32 // 8),
         ('all-gather', 4 * 3)]  # fmt: skip
  ledger = sorted((t.kind, t.nbytes) for t in comm.find_transfers(run.state))
  assert ledger == sorted([('all-reduce', 4 * 78), *car])
  dense = sum(c.nbytes for c in found if c.kind == 'all-reduce')  # one all-reduce a leaf
  assert dense == 4 * 78
  # 0/1 Adam compresses in two branches (gradients in phase 1, updates at a phase-2 sync)
  sites = 1 if method == 'onebit_adam' else 2
  assert sorted((c.kind, c.nbytes) for c in found if c.kind != 'all-reduce') == sorted(car * sites)
  a2a = [c for c in found if c.kind == 'all-to-all']
  assert a2a[0].dtypes == ('u8',), 'signs go packed, 8 a byte'


# --- checkpoints keep the error memories --------------------------------------------------------


@pytest.mark.parametrize(
  'make',
  [
    lambda: jd.sync.onebit_adam(1e-2, axis_name=AX, num_workers=W, warmup_steps=1),
    lambda: jd.sync.zero_one_adam(
      1e-2, axis_name=AX, num_workers=W, var_freeze_step=2, local_step_scaler=1,
      local_step_clipper=2,
    ),
  ],
  ids=['onebit_adam', 'zero_one_adam'],
)  # fmt: skip
def test_a_restored_state_continues_bit_identically(make):
  run = testing.Run(make(), start(), workers=W, devices=2)
  for t in range(3):
    run(grads_at(t))
  assert np.any(np.asarray(run.state.server_error) != 0)
  assert any(np.any(np.asarray(e) != 0) for e in jax.tree.leaves(run.state.worker_error))
  saved = jax.tree.map(np.asarray, (run.params, run.state))  # what a checkpoint writes
  for t in range(3, 6):
    run(grads_at(t))
  again = testing.Run(make(), start(), workers=W, devices=2)
  again.params, again.state = jax.tree.map(jnp.asarray, saved)
  for t in range(3, 6):
    again(grads_at(t))
  equal(again.params, run.params)
  equal(jax.tree.leaves(again.state), jax.tree.leaves(run.state))


# --- misuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  'make, message',
  [
    (lambda: jd.sync.onebit_adam(1e-3, axis_name=AX, num_workers=0), 'num_workers must be >= 1'),
    (
      lambda: jd.sync.onebit_adam(1e-3, axis_name=AX, num_workers=2, warmup_steps=0),
      r'warmup_steps must be >= 1 \(v is 0 before\), got 0',
    ),
    (lambda: jd.sync.onebit_adam(1e-3, axis_name=AX, num_workers=2, b2=1.0), 'b2 must be in'),
    (lambda: jd.sync.zero_one_adam(1e-3, axis_name=AX, num_workers=2, clip=-1), 'clip must be'),
    (
      lambda: jd.sync.zero_one_adam(1e-3, axis_name=AX, num_workers=2, local_step_clipper=0),
      'local_step_clipper must be >= 1, got 0',
    ),
    (
      lambda: jd.sync.zero_one_adam(1e-3, axis_name=AX, num_workers=2, var_update_scaler=0),
      'var_update_scaler must be >= 1',
    ),
  ],
)
def test_bad_arguments_fail_at_construction(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_a_transform_built_for_other_workers_says_so():
  run = testing.Run(jd.sync.onebit_adam(1e-3, axis_name=AX, num_workers=4), start(), workers=W)
  with pytest.raises(ValueError, match=r'built for num_workers=4, but .* has 8'):
    run(grads_at(0))
