"""DeMo: decoupled momentum; the fast DCT components of each worker's momentum are exchanged."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdist import comm
from jaxdist.sync import _checks
from jaxdist.sync.chunked import ChunkedState, chunked_allgather


class DeMoState(NamedTuple):
  """State of `demo`.

  Attributes:
    count: steps so far (the learning-rate schedule's step). Replicated.
    exchange: the momentum m (`ChunkedState.error`: what was not sent yet)
      and the all-gather's transfer. Per-worker.
  """

  count: jax.Array
  exchange: ChunkedState


def demo(
  learning_rate: optax.ScalarOrSchedule,
  *,
  axis_name: comm.AxisName,
  momentum_decay: float = 0.999,
  topk: int = 32,
  chunk: int = 64,
  sign: bool = True,
  weight_decay: float = 0.0,
) -> optax.GradientTransformation:
  """DeMo: each worker sends the top-k DCT components of its momentum; sign-SGD on their mean.

  The whole optimizer (it replaces the gradient all-reduce and AdamW). With
  η the learning rate of this step, worker n with gradient g_n

    m_n <- β·m_n + η·g_n
    C_n = DCT(m_n) per tile;  keep the k largest |C_n| in each tile;  q_n = IDCT(kept)
    m_n <- m_n − q_n                       (the sent "fast" components leave the momentum)
    all-gather (positions, values);  Q = IDCT(mean of the kept coefficients over the
                                              workers that sent each one)
    θ <- (1 − η·λ)·θ − η·sign(Q)           (η·Q with sign=False)

  Tiles: each leaf viewed as a matrix (1-D: 1xn; more dimensions: prod(leading)
  x last), cut along each side by its largest divisor at most `chunk`; the
  DCT is the separable orthonormal 2-D DCT-II of a tile. k = min(topk, tile
  size): 32 of 4,096 for a 64x64 tile, 32 of 64 for a vector segment.

  Readings taken, after the authors' code (demo.py): the momentum accumulates
  η·g (the learning rate inside the momentum, and again in the step); the
  mean is over the workers that sent each coefficient; values go as float32
  (the parameters' dtype there) and in-tile positions as 12 bits (the code's
  int64; the byte count is the wire format's); tensors of more than 2
  dimensions, which the code refuses, are tiled as prod(leading) x last. The
  gradient is each worker's own (clip it locally before, as OLMo does).

  Args:
    learning_rate: η, a float or an optax schedule of the step.
    axis_name: the worker axis (or tuple of axes).
    momentum_decay: β in [0, 1) (0.999).
    topk: kept DCT coefficients per tile (32).
    chunk: the longest tile side (64).
    sign: step on sign(Q) (as the code always does) or on Q itself.
    weight_decay: λ of the decoupled weight decay (0, as the released configs).

  Returns:
    An `optax.GradientTransformationExtraArgs`: the whole optimizer.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxdist import runtime, sync, testing
    >>> tx = sync.demo(0.1, axis_name=runtime.AXES, topk=1)
    >>> run = testing.Run(tx, {'x': jnp.zeros(2)}, workers=2)
    >>> run({'x': jnp.array([[1.0, 1.0], [3.0, 3.0]])})['x']  # the mean (DC) component only
    Array([[-0.1, -0.1],
           [-0.1, -0.1]], dtype=float32)

  References:
    Peng, Quesnelle, Kingma. DeMo: Decoupled Momentum Optimization. 2024.
    https://arxiv.org/abs/2411.19870
  """
  _checks.check('momentum_decay', momentum_decay, lambda b: 0 <= b < 1, 'in [0, 1)')
  _checks.check('weight_decay', weight_decay, lambda w: w >= 0, '>= 0')
  if not callable(learning_rate):
    _checks.check('learning_rate', learning_rate, lambda r: r > 0, '> 0')
  exchange = chunked_allgather(
    axis_name=axis_name, topk=topk, chunk=chunk, dct=True, error_decay=momentum_decay
  )

  def init_fn(params):
    return DeMoState(jnp.zeros([], jnp.int32), exchange.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    if weight_decay:
      _checks.needs_params('demo with weight_decay', params)
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    scaled = jax.tree.map(lambda g: lr * g.astype(jnp.float32), updates)
    mean, exchanged = exchange.update(scaled, state.exchange)
    step = jax.tree.map(jnp.sign, mean) if sign else mean
    out = jax.tree.map(lambda s: -lr * s, step)
    if weight_decay:
      out = jax.tree.map(lambda u, p: u - lr * weight_decay * p, out, params)
    out = jax.tree.map(lambda u, g: u.astype(g.dtype), out, updates)
    return out, DeMoState(optax.safe_increment(state.count), exchanged)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
