"""The train step's jaxprs rewritten for XLA's CPU backend.

Two of XLA CPU's choices (jax 0.10) cost simulated workers most of their
time, and both can be avoided from JAX by writing the same arithmetic in
another form: `rewritten` traces a function to a jaxpr and evaluates it,
equation by equation, with some equations replaced (`conv_rule`: convolutions
into the layout XLA CPU's Eigen kernels take; `sum_rule`: sums of a few long
rows as dots, `sum_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

_CONV = jcore.primitives.conv_general_dilated_p
_PSUM = jcore.primitives.psum_p
_REDUCE_SUM = jcore.primitives.reduce_sum_p
_CALLS = (jcore.primitives.jit_p, jcore.primitives.closed_call_p)
# A sum over a few rows of a long array (rows <= outputs, outputs >= this) is written as a dot.
_MIN_SUM_OUTPUTS = 4096


def _canonical(n: int) -> jax.lax.ConvDimensionNumbers:
  """NH..WC input and output, H..WIO kernel: the layout XLA CPU's Eigen convolutions take."""
  return jax.lax.ConvDimensionNumbers(
    (0, n + 1, *range(1, n + 1)), (n + 1, n, *range(n)), (0, n + 1, *range(1, n + 1))
  )


def conv_rule(eqn) -> Callable[..., list[Any]] | None:
  """A dense convolution out of that layout -> the same one with its operands transposed.

  XLA CPU calls Eigen only for the canonical layout, and its pass that
  transposes other convolutions into it (`ConvCanonicalization`,
  xla/service/cpu) visits only the entry computation: a convolution inside a
  loop body keeps its layout and is emitted as naive loops. Autodiff's
  convolutions (input and weight gradients) have other layouts, so a CNN's
  backward pass under `lax.map` ran about 20x slower than outside a loop.
  Transposing them here does what the pass would have done.
  """
  if eqn.primitive is not _CONV:
    return None
  p = eqn.params
  dn = p['dimension_numbers']
  n = len(dn.lhs_spec) - 2
  if p['feature_group_count'] != 1 or p['batch_group_count'] != 1 or dn == _canonical(n):
    return None
  lhs_spec, rhs_spec, out_spec = dn
  order = (out_spec[0], *out_spec[2:], out_spec[1])  # the canonical output's dimensions

  def conv(lhs, rhs):
    lhs = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    rhs = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    out = _CONV.bind(lhs, rhs, **{**p, 'dimension_numbers': _canonical(n)})
    return [jnp.transpose(out, tuple(order.index(d) for d in range(n + 2)))]

  return conv


def few_rows(aval, axes) -> bool:
  """Whether summing `axes` of an array of `aval` adds a few rows of many numbers."""
  rows = math.prod(aval.shape[a] for a in axes)
  outputs = math.prod(aval.shape) // max(rows, 1)
  return jnp.issubdtype(aval.dtype, jnp.floating) and outputs >= max(rows, _MIN_SUM_OUTPUTS)


def sum_rows(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """`x.sum(axes)` as a dot with ones.

  XLA CPU runs a sum of a few rows of many numbers as a YNNPACK reduce fusion
  about 100x slower than its own loops or a dot (8 rows of 131,072 floats:
  10 ms against 0.1 ms), and every `psum` over simulated workers is one: it
  cost 64 workers on 8 devices (CNN) half of their step. YNNPACK stays for
  the sums it does well (batch-norm statistics: many rows, few outputs).
  """
  rows = math.prod(x.shape[a] for a in axes)
  rest = [d for d in range(x.ndim) if d not in axes]
  flat = jnp.transpose(x, (*axes, *rest)).reshape(rows, -1)
  total = jnp.dot(jnp.ones(rows, x.dtype), flat, precision=jax.lax.Precision.HIGHEST)
  return total.reshape([x.shape[d] for d in rest])


def sum_rule(eqn) -> Callable[..., list[Any]] | None:
  """`reduce_sum`, and `psum` over positional (vmapped) axes, of a few long rows -> `sum_rows`."""
  p = eqn.params
  if eqn.primitive is _REDUCE_SUM:
    axes = tuple(p['axes'])
    return (lambda x: [sum_rows(x, axes)]) if few_rows(eqn.invars[0].aval, axes) else None
  if eqn.primitive is not _PSUM or p.get('axis_index_groups') is not None:
    return None
  positional = tuple(a for a in p['axes'] if isinstance(a, int))
  named = tuple(a for a in p['axes'] if not isinstance(a, int))
  if not positional or not any(few_rows(v.aval, positional) for v in eqn.invars):
    return None

  def psum(*xs):
    xs = [
      sum_rows(x, positional)
      if few_rows(v.aval, positional)
      else _REDUCE_SUM.bind(x, axes=positional, out_sharding=None)
      for x, v in zip(xs, eqn.invars, strict=True)
    ]
    return list(jax.lax.psum(xs, named)) if named else xs

  return psum


def _rule_applies(eqn, rule) -> bool:
  if eqn.primitive in _CALLS:
    return any(_rule_applies(e, rule) for j in jcore.jaxprs_in_params(eqn.params) for e in j.eqns)
  return rule(eqn) is not None


def _evaluate(jaxpr, consts, args, rule):
  """`jax.core.eval_jaxpr`, with `rule(eqn)`'s replacement where it gives one (calls inlined)."""
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts, strict=True))
  env.update(zip(jaxpr.invars, args, strict=True))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    if not _rule_applies(eqn, rule):
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
      outs = outs if eqn.primitive.multiple_results else [outs]
    elif eqn.primitive in _CALLS:
      (closed,) = [eqn.params[k] for k in ('jaxpr', 'call_jaxpr') if k in eqn.params]
      outs = _evaluate(closed.jaxpr, closed.consts, ins, rule)
    else:
      with eqn.ctx.manager:
        outs = rule(eqn)(*ins)
    env.update(zip(eqn.outvars, outs, strict=True))
  return [read(v) for v in jaxpr.outvars]


def rewritten(fn: Callable[..., Any], rule) -> Callable[..., Any]:
  """`fn` (positional arguments) traced to a jaxpr and evaluated with `rule`'s replacements.

  `rule(eqn)` returns a function of the equation's inputs giving its outputs
  (the same values, computed in another form), or None to keep it. Equations
  inside `jit`s are reached; those inside other higher-order primitives
  (`cond`, `scan`, `checkpoint`) are kept as they are.
  """

  def rewritten(*args):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not any(_rule_applies(e, rule) for e in closed.jaxpr.eqns):
      return fn(*args)
    out = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), rule)
    return jax.tree.unflatten(jax.tree.structure(shape), out)

  return rewritten


def mean_over_workers(a: jax.Array) -> jax.Array:
  """`a.mean(0)`, a few long rows as a dot with ones (`sum_rows`; for the CPU).

  The CNN's evaluation of 512 examples on 8 CPU devices: 61 -> 16 ms with 64 workers,
  204 -> 18 ms with 256.
  """
  if few_rows(a, (0,)):  # summed in float32 at least, as jnp.mean does
    wide = a.astype(jnp.promote_types(a.dtype, jnp.float32))
    return (sum_rows(wide, (0,)) / a.shape[0]).astype(a.dtype)
  return jnp.mean(a, axis=0)
