"""Jitted, sharded training and evaluation steps over a `Workers` layout.

Every leaf of `TrainState` has a leading worker axis. The train step runs each
worker's forward/backward pass on its own slice of the global batch, then the
optax chain (which may communicate over `workers.axis_name`), all inside one
`shard_map` (devices) × `vmap` (simulated workers) program. The simulated
workers of a device compute their gradients either together (`vmap`) or one
after the other (`lax.map`): see `make_train_step`'s `per_worker`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.extend import core as jcore
from jax.sharding import PartitionSpec as P

from jaxdist import comm
from jaxdist.models.masked import masked_cross_entropy, masked_mean
from jaxdist.runtime import DATA, SIM, Workers
from jaxdist.sync.compressed import CompressedState
from jaxdist.sync.pipeline import PredictionState


class TrainState(NamedTuple):
  """What a run carries from step to step.

  Attributes:
    params: model parameters. Per-worker.
    model_state: non-trained variables, e.g. batch-norm statistics ({} if
      none). Per-worker.
    opt_state: the optax chain's state, communication records included.
      Per-worker.
  """

  params: optax.Params
  model_state: dict[str, Any]
  opt_state: optax.OptState


def _split_variables(variables: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
  variables = dict(variables)
  return variables.pop('params'), variables


def loss_fn(model: nn.Module, params, model_state, x, y, train: bool, count=None):
  """Mean cross-entropy over the batch (its first `count` examples if given).

  Returns (loss, (logits, new_model_state)).
  """
  variables = {'params': params, **model_state}
  if train and model_state:
    logits, new_state = model.apply(variables, x, train=True, mutable=list(model_state))
  else:
    logits, new_state = model.apply(variables, x, train=train), model_state
  if count is None:
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  else:
    loss = masked_cross_entropy(logits, y, count)
  return loss, (logits, new_state)


def init_params(model: nn.Module, rng: jax.Array, input_shape: tuple[int, ...]):
  """(params, model_state) of one model replica."""
  return _split_variables(model.init(rng, jnp.zeros((1, *input_shape)), train=False))


def make_init(
  model: nn.Module, tx: optax.GradientTransformation, workers: Workers, input_shape: tuple[int, ...]
) -> Callable[[jax.Array], TrainState]:
  """A jitted `rng -> TrainState`: every worker starts from the same replica."""

  def init(rng):
    params, model_state = init_params(model, rng, input_shape)
    stack = lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (workers.count, *x.shape)), t)
    params, model_state = stack(params), stack(model_state)
    return TrainState(params, model_state, jax.vmap(tx.init)(params))

  return jax.jit(init, out_shardings=workers.sharding)


def make_train_step(
  model: nn.Module,
  tx: optax.GradientTransformation,
  workers: Workers,
  staggered: bool = False,
  counted: bool = False,
  per_worker: str = 'auto',
) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
  """A jitted `(state, x_WxBx..., y_WxB[, counts_W[, scale_W]]) -> (state, metrics)`; donates state.

  Each device runs its workers' forward/backward passes, then the optax
  chain (which may communicate over `workers.axis_name`) for all of them.
  How the simulated workers of a device compute their gradients is
  `per_worker`:

  - `'vmap'`: together, one batched program. Every worker has its own
    weights, so each convolution becomes a grouped convolution, which XLA
    runs far slower than a dense one (on the CPU, 8 workers on one device at
    about a quarter of the samples/s of one plain batch).
  - `'loop'`: one after the other (`lax.map`, one loop body whatever the
    number of workers), each worker's convolutions dense; only one worker's
    activations are alive at a time. On the CPU the convolutions in the loop
    are given the NHWC/HWIO layout that XLA's CPU backend needs to call its
    Eigen kernels (it rewrites layouts only outside loops; see
    `_canonical_convs`).
  - `'auto'` (default): `'loop'` on the CPU when a device holds more than one
    worker, else `'vmap'` (not yet measured on accelerators).

  Both compute the same per-worker functions: numbers differ only by float
  reassociation inside the convolutions. With `staggered`, the workers go
  one after the other under rematerialisation (`lax.map` over
  `jax.checkpoint`ed passes), the system form of Wavelet's tick-tock waves
  (`jaxdist.train.waves`); `per_worker` must then be `'auto'` or `'loop'`.

  With `counted`, worker k trains on the first counts[k] of its B examples
  (per-worker batch sizes with static shapes: changing them never
  recompiles), and the chain gets the count as optax's extra argument
  `weight` (for `jd.sync.weighted_allreduce`). A `scale` multiplies each
  worker's update after the chain: the learning rate scaled for this step
  only (ScaDLES's linear scaling by Σb / B; exact for any optax optimizer,
  whose update is the learning rate times a direction).

  Keyword arguments reach the chain as optax's extra arguments, one value
  per worker (e.g. `candidate=` of `compressed_allreduce(ratios=...)`).

  Metrics, replicated: `loss` and `accuracy` averaged over workers (over
  examples, with `counted`); with a compressed all-reduce in the chain,
  each worker's `norms` and `gains` (its `CompressedState`); and
  `wire`: for each `Transfer` in the optimizer state (in tree order), how many
  times it ran this step summed over workers.
  """

  def gradients(params, model_state, x, y, *count):
    grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
    (loss, (logits, model_state)), grads = grad_fn(model, params, model_state, x, y, True, *count)
    correct = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
    accuracy = masked_mean(correct, *count) if count else jnp.mean(correct)
    return grads, model_state, loss, accuracy

  def update(grads, opt_state, params, tx_args, *extra):  # extra: (count,) or (count, scale)
    kwargs = {'weight': extra[0]} if extra else {}
    updates, opt_state = tx.update(grads, opt_state, params, **kwargs, **tx_args)
    if len(extra) > 1:
      updates = jax.tree.map(lambda u: u * extra[1].astype(u.dtype), updates)
    return optax.apply_updates(params, updates), opt_state

  if per_worker not in ('auto', 'vmap', 'loop'):
    raise ValueError(f"per_worker must be 'auto', 'vmap' or 'loop', got {per_worker!r}")
  if staggered and per_worker == 'vmap':
    raise ValueError("staggered runs workers one after the other: per_worker='vmap' contradicts it")
  on_cpu = workers.mesh.devices.flat[0].platform == 'cpu'
  if per_worker == 'auto':
    per_worker = 'loop' if on_cpu and workers.per_device > 1 else 'vmap'
  one_worker = _canonical_convs(gradients) if on_cpu else gradients

  def device_step(state: TrainState, x, y, tx_args, *extra):  # leading: this device's workers
    args = (state.params, state.model_state, x, y, *extra[:1])
    if staggered:
      wave = jax.checkpoint(lambda args: one_worker(*args))
      grads, model_state, loss, accuracy = jax.lax.map(wave, args)
    elif per_worker == 'loop':
      grads, model_state, loss, accuracy = jax.lax.map(lambda args: one_worker(*args), args)
    else:
      grads, model_state, loss, accuracy = jax.vmap(gradients)(*args)
    params, opt_state = jax.vmap(update, axis_name=SIM)(
      grads, state.opt_state, state.params, tx_args, *extra
    )
    return TrainState(params, model_state, opt_state), {'loss': loss, 'accuracy': accuracy}

  mapped = jax.shard_map(
    device_step, mesh=workers.mesh, in_specs=P(DATA), out_specs=P(DATA), check_vma=False
  )

  def step(state, x, y, *extra, **tx_args):
    if counted != bool(extra) or len(extra) > 2:
      raise ValueError(
        f'this step was made with counted={counted}: pass counts (and a scale) iff counted'
      )
    state, per_worker = mapped(state, x, y, tx_args, *extra)
    counts = extra[:1]
    if counts:  # a mean over examples: workers weighted by their batches
      w = counts[0].astype(jnp.float32) / jnp.maximum(jnp.sum(counts[0]), 1)
      metrics = {k: jnp.sum(v * w) for k, v in per_worker.items()}
    else:
      metrics = {k: jnp.mean(v) for k, v in per_worker.items()}
    metrics['wire'] = tuple(jnp.sum(t.count) for t in comm.find_transfers(state.opt_state))
    metrics.update(_probes(state.opt_state))
    return state, metrics

  return jax.jit(
    step,
    donate_argnums=0,
    out_shardings=(workers.sharding, workers.replicated),
    compiler_options=compiler_options(workers.mesh.devices.flat[0].platform),
  )


def _is_canonical(dimension_numbers: jax.lax.ConvDimensionNumbers) -> bool:
  """Whether a convolution's operands are NH..WC, H..WIO and NH..WC, XLA CPU's Eigen layout."""
  lhs, rhs, out = dimension_numbers
  n = len(lhs) - 2
  spatial = tuple(range(1, n + 1))
  return (
    tuple(lhs) == (0, n + 1, *spatial)
    and tuple(rhs) == (n + 1, n, *range(n))
    and tuple(out) == (0, n + 1, *spatial)
  )


def _canonical_conv(lhs, rhs, *, dimension_numbers, **params):
  """`conv_general_dilated` with its operands transposed to the canonical layout.

  The same convolution (the window's spatial dimensions keep their order);
  only the layout XLA sees changes.
  """
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  n = len(lhs_spec) - 2
  canonical = jax.lax.ConvDimensionNumbers(
    (0, n + 1, *range(1, n + 1)), (n + 1, n, *range(n)), (0, n + 1, *range(1, n + 1))
  )
  lhs = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
  rhs = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
  out = _CONV.bind(lhs, rhs, dimension_numbers=canonical, **params)
  # out is (batch, *spatial, feature); put each where out_spec says.
  order = (out_spec[0], *out_spec[2:], out_spec[1])
  return jnp.transpose(out, tuple(order.index(d) for d in range(n + 2)))


_CONV = jcore.primitives.conv_general_dilated_p
_CALLS = (jcore.primitives.jit_p, jcore.primitives.closed_call_p)


def _needs_rewrite(eqn) -> bool:
  if eqn.primitive is _CONV:
    p = eqn.params
    return (
      p['feature_group_count'] == 1
      and p['batch_group_count'] == 1
      and not _is_canonical(p['dimension_numbers'])
    )
  if eqn.primitive in _CALLS:
    return any(_needs_rewrite(e) for j in jcore.jaxprs_in_params(eqn.params) for e in j.eqns)
  return False


def _eval_canonical(jaxpr, consts, args):
  """Evaluates `jaxpr` as `jax.core.eval_jaxpr` does, convolutions made canonical."""
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts, strict=True))
  env.update(zip(jaxpr.invars, args, strict=True))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    if not _needs_rewrite(eqn):
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
      outs = outs if eqn.primitive.multiple_results else [outs]
    elif eqn.primitive is _CONV:
      outs = [_canonical_conv(*ins, **eqn.params)]
    else:  # a call holding such a convolution: inline it
      (closed,) = [eqn.params[k] for k in ('jaxpr', 'call_jaxpr') if k in eqn.params]
      outs = _eval_canonical(closed.jaxpr, closed.consts, ins)
    env.update(zip(eqn.outvars, outs, strict=True))
  return [read(v) for v in jaxpr.outvars]


def _canonical_convs(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` with every dense convolution in NH..WC / H..WIO layout, for XLA's CPU backend.

  XLA CPU runs a convolution with its Eigen kernels only in that layout, and
  its pass that transposes other convolutions into it visits only the entry
  computation (`ConvCanonicalization`, xla/service/cpu): a convolution inside
  a loop body keeps its layout and is emitted as naive loops. Autodiff's
  convolutions (the input and weight gradients) have other layouts, so a
  backward pass under `lax.map` ran 20x slower than the same pass outside a
  loop (CNN, 64 examples: 305 ms against 13 ms). Traces `fn` (with the
  gradients it takes) to a jaxpr and evaluates it with those convolutions
  transposed to the canonical layout, as the pass would have done; the
  arithmetic is unchanged.
  """

  def canonical(*args):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not any(_needs_rewrite(e) for e in closed.jaxpr.eqns):
      return fn(*args)
    out = _eval_canonical(closed.jaxpr, closed.consts, jax.tree.leaves(args))
    return jax.tree.unflatten(jax.tree.structure(shape), out)

  return canonical


# XLA CPU's YNNPACK fusions, less reductions (see `compiler_options`).
_CPU_YNN_FUSIONS = 'LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION'


@functools.cache
def compiler_options(platform: str) -> dict[str, str] | None:
  """XLA options the steps are compiled with on `platform` (None: XLA's defaults).

  On the CPU, the XLA of jax 0.10 hands reductions to YNNPACK fusions that run
  about 100x slower than its own loops (a sum over 8 rows of 131,072 floats:
  10 ms against 0.1 ms). Every vmapped `psum` over simulated workers is such a
  reduction (over the `sim` axis), as are bias gradients and means over
  workers: 64 workers on 8 devices spent 100 ms of a step in them. These
  options keep YNNPACK's other default fusions (dots, convolutions) and leave
  reductions to XLA. Probed once per process: an XLA without the option gets
  its defaults.

  Args:
    platform: `'cpu'`, `'gpu'` or `'tpu'`.

  Returns:
    `compiler_options` for `jax.jit`.
  """
  if platform != 'cpu':
    return None
  options = {'xla_cpu_experimental_ynn_fusion_type': _CPU_YNN_FUSIONS}
  try:
    jax.jit(jnp.sum, compiler_options=options).lower(jnp.zeros(2)).compile()
  except jax.errors.JaxRuntimeError:
    return None
  return options


def make_noise_step(
  model: nn.Module, workers: Workers, counted: bool = False
) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """A jitted `(state, x, y[, counts]) -> (mean_k ‖g_k‖², ‖ḡ‖²)`: Scavenger's noise ingredients.

  Each worker's gradient g_k of its loss on its batch at its own parameters
  (the gradient the train step would compute on the same batch), and the
  aggregated gradient ḡ (the mean over workers; with `counted`, weighted
  by the counts, as `weighted_allreduce` aggregates). The numerator is the
  plain mean (1/K) Σ_k ‖g_k‖², as Eq. 2 of Scavenger writes it. With equal
  weights γ = numerator / denominator ≥ 1: 1 when the workers' gradients
  agree, K when they are orthogonal, and more than K when they point
  against each other (non-IID shards do: digits with one label per worker
  gives γ/K ≈ 3).

  A measurement beside training, not part of it: it runs a forward and
  backward pass of its own and one all-reduce that the ledger does not
  count (the trainer runs it every `config.noise_every` steps, off the
  clock).
  """

  def one(params, model_state, x, y, *count):
    grads = jax.grad(lambda p: loss_fn(model, p, model_state, x, y, True, *count)[0])(params)
    return grads, optax.tree.norm(grads, squared=True)

  def device(state: TrainState, x, y, *counts):
    grads, sq = jax.vmap(one)(state.params, state.model_state, x, y, *counts)
    w = counts[0].astype(jnp.float32) if counts else jnp.ones(sq.shape, jnp.float32)
    weighted = jax.tree.map(lambda g: jnp.tensordot(w, g.astype(jnp.float32), axes=1), grads)
    sq_sum, w_sum, g_sum = jax.lax.psum((jnp.sum(sq), jnp.sum(w), weighted), DATA)
    mean = jax.tree.map(lambda g: g / jnp.maximum(w_sum, 1e-30), g_sum)
    return sq_sum / workers.count, optax.tree.norm(mean, squared=True)

  mapped = jax.shard_map(
    device, mesh=workers.mesh, in_specs=P(DATA), out_specs=P(), check_vma=False
  )

  def noise(state, x, y, *counts):
    if counted != bool(counts):
      raise ValueError(f'this step was made with counted={counted}: pass counts iff counted')
    return mapped(state, x, y, *counts)

  return jax.jit(
    noise,
    out_shardings=workers.replicated,
    compiler_options=compiler_options(workers.mesh.devices.flat[0].platform),
  )


def _probes(opt_state) -> dict[str, jax.Array]:
  """Per-worker gain ingredients of the chain's compressed all-reduce, if any (`norms`, `gains`)."""
  found = [
    s
    for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, CompressedState))
    if isinstance(s, CompressedState)
  ]
  if not found:
    return {}
  return {'norms': found[-1].norms, 'gains': found[-1].gains}


def trained_params(state: TrainState) -> optax.Params:
  """The weights being trained: `state.params`, unless the chain hands the model others.

  `linear_weight_prediction` gives the forward pass extrapolated weights ŵ
  and keeps the true weights in its state; those are the ones to evaluate.
  """
  found = [
    s.weights
    for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: isinstance(x, PredictionState))
    if isinstance(s, PredictionState)
  ]
  return found[-1] if found else state.params


def make_eval_step(model: nn.Module, workers: Workers) -> Callable[..., dict[str, jax.Array]]:
  """A jitted `(state, x_Nx..., y_N, mask_N) -> sums` on the worker-averaged model.

  The model evaluated is the mean of the workers' trained parameters
  (`trained_params`) and batch-norm statistics: for synchronous methods
  every worker holds it already; for local methods it is the consensus
  model. Returns masked sums of loss and correct predictions, and the
  count, so chunks can be added up.
  """

  def evaluate(state: TrainState, x, y, mask):
    mean = lambda t: jax.tree.map(lambda a: jnp.mean(a, axis=0), t)
    variables = {'params': mean(trained_params(state)), **mean(state.model_state)}
    logits = model.apply(variables, x, train=False)
    loss_vec = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    correct = (jnp.argmax(logits, -1) == y) * mask
    return {'loss': jnp.sum(loss_vec * mask), 'correct': jnp.sum(correct), 'count': jnp.sum(mask)}

  return jax.jit(
    evaluate,
    out_shardings=workers.replicated,
    compiler_options=compiler_options(workers.mesh.devices.flat[0].platform),
  )


def make_reference_step(
  model: nn.Module, tx: optax.GradientTransformation
) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
  """One device, no workers: `(params, model_state, opt_state, x, y) -> (..., loss)`.

  The single-device computation every synchronous method is checked against,
  and the baseline of the step benchmark. `tx` must not communicate.
  """

  def step(params, model_state, opt_state, x, y):
    grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
    (loss, (_, model_state)), grads = grad_fn(model, params, model_state, x, y, True)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state, loss

  return jax.jit(
    step, donate_argnums=(0, 2), compiler_options=compiler_options(jax.default_backend())
  )
