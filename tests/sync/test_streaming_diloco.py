"""Streaming DiLoCo against DiLoCo, hand-computed trajectories and the lowered HLO."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdist import comm, runtime, sync, testing
from jaxdist import compress as C

W = 8
AX = runtime.AXES
SHAPES = {'w': (6, 4), 'b': (4,)}


def draw(shapes, seed, lead=()):
  """Standard normal float32 arrays of `shapes` (a tree of shape tuples), with `lead` axes."""
  rng = np.random.default_rng(seed)
  normal = lambda s: jnp.asarray(rng.standard_normal((*lead, *s)).astype(np.float32))
  return jax.tree.map(normal, shapes, is_leaf=lambda x: isinstance(x, tuple))


def start(shapes=SHAPES):
  return draw(shapes, 123)


def grads_at(step, shapes=SHAPES):
  return draw(shapes, 1000 + step, (W,))


def streaming(period, outer=None, inner=None, **kw):
  inner = inner or optax.sgd(0.1)
  return optax.chain(inner, sync.streaming_diloco(outer, period, axis_name=AX, **kw))


LAYOUTS = pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2x4-simulated'])


# --- degenerate cases ---------------------------------------------------------------------------


@LAYOUTS
def test_one_fragment_no_delay_is_diloco_bitwise(devices):
  """P = 1, τ = 0, α = 0, default Nesterov outer optimizer: DiLoCo's every bit."""
  inner = lambda: optax.adamw(1e-2)
  want = testing.Run(
    optax.chain(inner(), sync.diloco(period=3, axis_name=AX)), start(), workers=W, devices=devices
  )
  got = testing.Run(streaming(3, inner=inner()), start(), workers=W, devices=devices)
  for t in range(7):
    jax.tree.map(np.testing.assert_array_equal, got(grads_at(t)), want(grads_at(t)))
  assert got.history == want.history  # the all-reduce at steps 2 and 5
  jax.tree.map(np.testing.assert_array_equal, got.state[1].anchor, want.state[1].anchor)


def test_one_fragment_no_delay_is_diloco_with_a_compressed_averager():
  make = lambda: sync.compressed_allreduce(C.topk(ratio=0.25), axis_name=AX)
  want = testing.Run(
    optax.chain(optax.sgd(0.1), sync.diloco(period=2, axis_name=AX, averager=make())), start()
  )
  got = testing.Run(streaming(2, averager=make()), start())
  for t in range(5):
    jax.tree.map(np.testing.assert_array_equal, got(grads_at(t)), want(grads_at(t)))
  assert got.history == want.history and sum(map(sum, got.history)) > 0


def test_the_last_fragment_without_delay_is_diloco_on_its_leaves():
  """P = 2, H = 2: fragment 1 ('w') is synchronised at steps 1, 3, 5 — DiLoCo's schedule — and
  fragment 0 ('b') at steps 0, 2, 4. DiLoCo on 'w' alone (optax.multi_transform) is the reference
  for 'w', bitwise."""
  assert sync.fragment_labels(start(), 2) == {'b': 0, 'w': 1}
  outer = lambda: optax.sgd(0.7, momentum=0.9, nesterov=True)
  ref = optax.chain(
    optax.sgd(0.1),
    optax.multi_transform(
      {'sync': sync.diloco(outer(), 2, axis_name=AX), 'other': optax.identity()},
      {'w': 'sync', 'b': 'other'},
    ),
  )
  want = testing.Run(ref, start())
  got = testing.Run(streaming(2, outer(), fragments=2), start())
  for t in range(6):
    np.testing.assert_array_equal(got(grads_at(t))['w'], want(grads_at(t))['w'])
  assert got.history == [[1, 0], [0, 1]] * 3  # b's all-reduce, w's all-reduce, in turn
  assert np.ptp(np.asarray(got.params['b']), axis=0).max() > 0  # b drifts between its syncs


# --- hand-computed trajectories -----------------------------------------------------------------

# Two workers, params a = b = 0, inner SGD lr 1 on constant gradients -1 and -3 (each step moves
# worker 0 by +1 and worker 1 by +3), outer SGD lr 1 without momentum (the new anchor is the
# anchor minus the averaged pseudo-gradient), alpha = 0.5: a fragment's new value is
# anchor + 0.5 (local - anchor), the local value after the step that applies it.
TWO = {'a': jnp.zeros(()), 'b': jnp.zeros(())}
G = {'a': jnp.array([-1.0, -3.0]), 'b': jnp.array([-1.0, -3.0])}


def test_two_fragments_delay_1_alpha_half_by_hand():
  """H = 4, P = 2 (a: fragment 0, b: fragment 1), τ = 1: fragment 0 sends after step 0 and
  applies at step 1, fragment 1 sends after step 2 and applies at step 3, fragment 0 again at
  steps 4 / 5.

  step 0: a = b = (1, 3); a's pseudo-gradient 0 − (1, 3), mean −2, is sent.
  step 1: a = (2, 6) → anchor 0 + 2 = 2, a = 2 + 0.5·((2, 6) − 2) = (2, 4); b = (2, 6).
  step 2: a = (3, 7); b = (3, 9), its mean pseudo-gradient −6 is sent.
  step 3: b = (4, 12) → anchor 6, b = 6 + 0.5·((4, 12) − 6) = (5, 9); a = (4, 10).
  step 4: a = (5, 13), sent: 2 − (5, 13), mean −7; b = (6, 12).
  step 5: a = (6, 16) → anchor 2 + 7 = 9, a = 9 + 0.5·((6, 16) − 9) = (7.5, 12.5); b = (7, 15).
  """
  tx = streaming(4, optax.sgd(1.0), inner=optax.sgd(1.0), fragments=2, delay=1, alpha=0.5)
  run = testing.Run(tx, TWO, workers=2)
  want = [
    ((1, 3), (1, 3)),
    ((2, 4), (2, 6)),
    ((3, 7), (3, 9)),
    ((4, 10), (5, 9)),
    ((5, 13), (6, 12)),
    ((7.5, 12.5), (7, 15)),
  ]
  for t, (a, b) in enumerate(want):
    got = run(G)
    np.testing.assert_allclose(got['a'], a, rtol=0, atol=1e-6, err_msg=f'a after step {t}')
    np.testing.assert_allclose(got['b'], b, rtol=0, atol=1e-6, err_msg=f'b after step {t}')
  # a's all-reduce after steps 0 and 4, b's after step 2; nothing at the steps that apply
  assert run.history == [[1, 0], [0, 0], [0, 1], [0, 0], [1, 0], [0, 0]]
  np.testing.assert_allclose(run.state[1].anchor['a'], [9, 9])
  np.testing.assert_allclose(run.state[1].anchor['b'], [6, 6])
  assert all(t.overlap for t in comm.find_transfers(run.state))
  assert int(run.state[1].synced[0]) == 3


def test_two_fragments_delay_2_alpha_half_by_hand():
  """H = 6, P = 2, τ = 2: fragment 0 sends after step 0, applies at step 2; fragment 1 sends
  after step 3, applies at step 5; fragment 0 sends after step 6, applies at step 8.

  step 0: a = b = (1, 3); a sends 0 − (1, 3): mean −2.   step 1: a = b = (2, 6).
  step 2: a = (3, 9) → anchor 2, a = 2 + 0.5·((3, 9) − 2) = (2.5, 5.5); b = (3, 9).
  step 3: a = (3.5, 8.5); b = (4, 12), sends 0 − (4, 12): mean −8.
  step 4: a = (4.5, 11.5); b = (5, 15).
  step 5: b = (6, 18) → anchor 8, b = 8 + 0.5·((6, 18) − 8) = (7, 13); a = (5.5, 14.5).
  step 6: a = (6.5, 17.5), sends 2 − (6.5, 17.5): mean −10; b = (8, 16).
  step 7: a = (7.5, 20.5); b = (9, 19).
  step 8: a = (8.5, 23.5) → anchor 12, a = 12 + 0.5·((8.5, 23.5) − 12) = (10.25, 17.75).
  """
  tx = streaming(6, optax.sgd(1.0), inner=optax.sgd(1.0), fragments=2, delay=2, alpha=0.5)
  run = testing.Run(tx, TWO, workers=2)
  want_a = [(1, 3), (2, 6), (2.5, 5.5), (3.5, 8.5), (4.5, 11.5), (5.5, 14.5), (6.5, 17.5)]
  want_a += [(7.5, 20.5), (10.25, 17.75)]
  want_b = [(1, 3), (2, 6), (3, 9), (4, 12), (5, 15), (7, 13), (8, 16), (9, 19), (10, 22)]
  for t in range(9):
    got = run(G)
    np.testing.assert_allclose(got['a'], want_a[t], rtol=0, atol=1e-6, err_msg=f'a, step {t}')
    np.testing.assert_allclose(got['b'], want_b[t], rtol=0, atol=1e-6, err_msg=f'b, step {t}')
    if t == 0:  # the average in flight, held in the state until step 2
      np.testing.assert_allclose(run.state[1].pending['a'], [-2, -2])
  sent = [[t for t, h in enumerate(run.history) if h[p]] for p in range(2)]
  assert sent == [[0, 6], [3]]


def test_alpha_0_workers_hold_the_fragments_anchor_bitwise_after_its_outer_step():
  """With α = 0 every worker takes the fragment's anchor itself (`jd.sync.apply_updates` with a
  flag per leaf); the other fragment stays apart."""
  rng = np.random.default_rng(7)
  n = 2048
  params = {'x': jnp.asarray(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1, n), jnp.float32)}
  params['y'] = params['x'] * 3
  grads = lambda t: draw({'x': (n,), 'y': (n,)}, t, (W,))
  run = testing.Run(streaming(4, fragments=2, delay=1), params, workers=W, devices=2)
  for t in range(4):
    got = run(grads(t))
    apart = lambda v: int(np.sum(np.any(np.asarray(v) != np.asarray(v)[0], axis=0)))
    spread = {k: apart(v) for k, v in got.items()}
    if t in (1, 3):  # x's outer step at step 1, y's at step 3
      synced, other = ('x', 'y') if t == 1 else ('y', 'x')
      assert spread[synced] == 0 and spread[other] > n // 2, (t, spread)
      np.testing.assert_array_equal(got[synced][0], run.state[1].anchor[synced][0])


# --- schedule, bytes, HLO -----------------------------------------------------------------------

# A GPT-like tree with leaves of rank 0 to 3: four blocks, an embedding, a final norm's scale.
GPT = {
  **{f'block_{i}': {'attn': (2, 4, 3), 'mlp': (4, 8), 'ln': (4,)} for i in range(4)},
  'embed': (5, 4),
  'ln_f': (),
}


def test_fragments_are_whole_blocks_of_about_equal_bytes():
  params = start(GPT)
  assert sync.fragment_labels(params, 4) == {
    **{f'block_{i}': {'attn': i, 'mlp': i, 'ln': i} for i in range(4)},
    'embed': 3,
    'ln_f': 3,
  }
  strided = sync.fragment_labels(params, 2, 'strided')
  assert [strided[f'block_{i}']['mlp'] for i in range(4)] == [0, 1, 0, 1]
  assert (strided['embed'], strided['ln_f']) == (0, 1)
  # numbers compare as numbers: block_10 comes after block_9
  many = {f'block_{i}': jnp.zeros(3) for i in range(12)}
  assert sync.fragment_labels(many, 12, 'strided') == {f'block_{i}': i for i in range(12)}
  # a function of the parameters may give the fragments, for a prefix of the tree
  by_hand = sync.fragment_labels(params, 2, lambda p: {k: int(k == 'embed') for k in p})
  assert by_hand['embed'] == 1 and by_hand['block_3'] == {'attn': 0, 'mlp': 0, 'ln': 0}


@pytest.mark.parametrize('delay', [0, 1, 3])
def test_one_fragment_per_step_at_most_and_bytes_match_the_hlo(delay):
  """P = 4, H = 16: a fragment all-reduce every 4 steps, fragment p after step 4p + 3 − τ
  (mod 16); each transfer's bytes are its all-reduce's operand in the lowered HLO, inside a
  conditional branch, and the largest (the peak a step sends) is about 1/P of DiLoCo's."""
  params = start(GPT)
  run = testing.Run(streaming(16, fragments=4, delay=delay), params, workers=W, devices=2)
  run.steps(32, lambda t: grads_at(t, GPT))
  transfers = comm.find_transfers(run.state)
  assert len(transfers) == 4 and all(t.kind == 'all-reduce' for t in transfers)
  assert all(t.overlap == (delay >= 1) for t in transfers)
  for p in range(4):
    sent = [t for t, h in enumerate(run.history) if h[p]]
    first = 4 * p + 3 - delay
    assert sent == [first, first + 16], (p, sent)
  assert all(sum(h) <= 1 for h in run.history)
  text = run.hlo(grads_at(0, GPT))
  found = [c for c in comm.hlo.collectives(text) if c.nbytes > 4]  # not the count agreement
  assert sorted(c.nbytes for c in found) == sorted(t.nbytes for t in transfers)
  assert all(c.computation in comm.hlo.conditional_branches(text) for c in found)
  block = 4 * (24 + 32 + 4)
  assert [t.nbytes for t in transfers] == [block, block, block, block + 4 * (20 + 1)]
  whole = comm.tree_nbytes(params)
  # the peak: the last block with the embedding and final norm, 31% of DiLoCo's all-reduce
  assert max(t.nbytes for t in transfers) <= 1.25 * whole / 4


def params_only_collectives(tx, params, grads):
  """Collectives of the compiled step that returns only the new parameters (XLA removes what
  feeds only the state, which is not returned)."""
  workers = runtime.layout(W, devices=2)
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (W, *x.shape)), params)

  def step(g, s, p):
    updates, s = tx.update(g, s, p)
    return sync.apply_updates(p, updates, s)

  jitted = jax.jit(workers.map(step, in_axes=(0, 0, 0)))
  text = jitted.lower(grads, jax.vmap(tx.init)(stacked), stacked).compile().as_text()
  return [c for c in comm.hlo.collectives(text) if c.nbytes > 4]


@pytest.mark.parametrize('delay', [0, 1, 2])
def test_with_a_delay_the_collective_feeds_only_the_state_not_the_update(delay):
  """The step compiled with only its new parameters as output keeps no all-reduce when τ ≥ 1:
  the average sent in a step is never consumed by that step's update (it waits in the state);
  with τ = 0 it is (the contrast: DiLoCo's blocking sync)."""
  tx = streaming(6, fragments=2, delay=delay)
  found = params_only_collectives(tx, start(), grads_at(0))
  if delay == 0:
    assert sorted(c.nbytes for c in found) == [4 * 4, 4 * 24]
  else:
    assert found == []


def test_misuse_is_refused_with_the_allowed_range():
  cases = [
    (dict(fragments=3), 'period must be a multiple of fragments=3, got 8'),
    (dict(fragments=0), r'fragments must be >= 1, got 0'),
    (dict(fragments=16), r'fragments must be in \[1, period=8\], got 16'),
    (dict(fragments=2, delay=4), r'delay must be in \[0, period/fragments=4\), got 4'),
    (dict(delay=-1), r'delay must be in \[0, period/fragments=8\), got -1'),
    (dict(alpha=1.0), r'alpha must be in \[0, 1\)'),
    (dict(layout='blocks'), 'layout must be one of'),
  ]
  for kw, message in cases:
    with pytest.raises(ValueError, match=message):
      sync.streaming_diloco(period=8, axis_name=AX, **kw)
  with pytest.raises(ValueError, match='fragments must be <= the number of parameter arrays'):
    sync.streaming_diloco(period=8, axis_name=AX, fragments=4).init(start())


def test_an_averager_per_fragment_with_a_delay():
  """A Top-k averager (error feedback): one state per fragment, its all-gather of values and
  indices sent only with its fragment, marked as overlapping; the models stay finite."""
  averager = sync.compressed_allreduce(C.topk(ratio=0.25), axis_name=AX, collective='allgather')
  run = testing.Run(streaming(4, fragments=2, delay=1, alpha=0.5, averager=averager), start())
  run.steps(8, grads_at)
  transfers = comm.find_transfers(run.state)
  assert transfers and all(t.overlap for t in transfers)
  per_fragment = [comm.find_transfers(s) for s in run.state[1].averager]
  sizes = [sum(t.nbytes for t in f) for f in per_fragment]
  assert sizes[0] < sizes[1]  # b (4 elements) sends less than w (24)
  n = len(per_fragment[0])
  sent = [(any(h[:n]), any(h[n:])) for h in run.history]
  assert sent == [(True, False), (False, False), (False, True), (False, False)] * 2
  assert all(np.isfinite(np.asarray(v)).all() for v in run.params.values())


# --- the deferred exchange: the same run, its all-reduce a program of its own -------------------


def deferred(run, exchange, t):
  """After step t of a deferred `run`: the merge due, then the average of the fragment sent."""
  inner, state = run.state
  if (p := exchange.applied(t)) is not None:
    merge = run.workers.map(lambda params, s: exchange.merge(p, params, s), (0, 0))
    run.params, state = jax.jit(merge)(run.params, state)
  if (p := exchange.sent(t)) is not None:
    average = run.workers.map(lambda pending: exchange.average(p, pending), (0,))
    state = state._replace(pending=jax.jit(average)(state.pending))
  run.state = (inner, state)


@pytest.mark.parametrize('devices', [8, 2], ids=['8-devices', '2x4-simulated'])
@pytest.mark.parametrize('alpha', [0.0, 0.5])
def test_deferred_exchange_gives_the_inline_run(devices, alpha):
  """H = 6, P = 3, τ = 1 (P = 3: the 'w', 'b' and 'c' leaves): the step keeps the fragment's own
  pseudo-gradient and sends nothing; `streaming_exchange`'s average and merge, run after the
  steps `sent` and `applied` name, give the inline run's models and states: bitwise with α = 0
  on one worker a device, else to float32 rounding; the same transfers recorded."""
  shapes = {**SHAPES, 'c': (3,)}
  kw = dict(fragments=3, delay=1, alpha=alpha)
  outer = lambda: optax.sgd(0.7, momentum=0.9, nesterov=True)
  inline = testing.Run(streaming(6, outer(), **kw), start(shapes), workers=W, devices=devices)
  run = testing.Run(
    streaming(6, outer(), exchange='deferred', **kw), start(shapes), workers=W, devices=devices
  )
  exchange = sync.streaming_exchange(outer(), 6, axis_name=AX, **kw)
  assert [exchange.sent(t) for t in range(7)] == [0, None, 1, None, 2, None, 0]
  assert [exchange.applied(t) for t in range(7)] == [None, 0, None, 1, None, 2, None]
  exact = alpha == 0 and devices == 8
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=False)
  same = np.testing.assert_array_equal if exact else close
  for t in range(13):
    want = inline(grads_at(t, shapes))
    run(grads_at(t, shapes))
    deferred(run, exchange, t)
    jax.tree.map(same, run.params, want)
    jax.tree.map(same, run.state[1].anchor, inline.state[1].anchor)
    jax.tree.map(same, run.state[1].pending, inline.state[1].pending)
    jax.tree.map(same, run.state[1].just_synced, inline.state[1].just_synced)
  assert run.history == inline.history  # the step records the fragment's all-reduce it left
  assert int(run.state[1].synced[0]) == int(inline.state[1].synced[0]) == 6


def test_a_deferred_step_sends_nothing_and_the_average_sends_the_fragment():
  """The lowered HLO: no all-reduce in the deferred step; the average's, of fragment p's bytes."""
  tx = streaming(6, fragments=2, delay=1, exchange='deferred')
  run = testing.Run(tx, start(), workers=W, devices=8)
  assert comm.hlo.collectives(run.step.lower(*run.args(grads_at(0))).compile().as_text()) == []
  exchange = sync.streaming_exchange(None, 6, axis_name=AX, fragments=2, delay=1)
  workers = runtime.layout(W, devices=8)
  pending = jax.tree.map(lambda x: jnp.zeros((W, *x.shape)), start())
  for p, nbytes in [(0, 4 * 4), (1, 4 * 24)]:  # fragment 0 is 'b', 1 is 'w' (sequential, by name)
    average = jax.jit(workers.map(lambda x, p=p: exchange.average(p, x), (0,)))
    found = comm.hlo.collectives(average.lower(pending).compile().as_text())
    assert [c.nbytes for c in found] == [nbytes]


def test_deferred_misuse_is_refused():
  with pytest.raises(ValueError, match='needs delay >= 1'):
    sync.streaming_diloco(period=8, axis_name=AX, exchange='deferred')
  with pytest.raises(ValueError, match='pass averager=None'):
    averager = sync.allreduce(axis_name=AX)
    sync.streaming_diloco(period=8, axis_name=AX, delay=1, exchange='deferred', averager=averager)
  with pytest.raises(ValueError, match='exchange must be one of'):
    sync.streaming_diloco(period=8, axis_name=AX, exchange='thread')
  with pytest.raises(ValueError, match="finishes exchange='deferred' steps"):
    sync.streaming_exchange(period=8, axis_name=AX, delay=1, exchange='inline')
