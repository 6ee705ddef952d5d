"""SparseLoCo: DiLoCo whose outer step is SGD on an error-fed, sparse, 2-bit pseudo-gradient."""

from __future__ import annotations

import optax

from jaxdist import comm
from jaxdist.sync import _averaging, _checks
from jaxdist.sync.chunked import chunked_allgather
from jaxdist.sync.diloco import diloco


def sparseloco(
  period: int = 15,
  *,
  axis_name: comm.AxisName,
  density: float = 0.03125,
  bits: int = 2,
  chunk: int = 64,
  error_decay: float = 0.95,
  outer_learning_rate: float = 1.0,
  value_range: float = 6.0,
  average: str = 'selected',
) -> optax.GradientTransformation:
  """SparseLoCo: every `period` steps, SGD on the mean of sparse, 2-bit, error-fed pseudo-gradients.

  `diloco` with outer SGD (no momentum) and `chunked_allgather` as its
  averager. Each worker n keeps an error accumulator e_n in place of the
  outer momentum; at an outer step, with a the anchor (outer parameters) and
  w_n the worker's parameters after its `period` inner steps,

    Δ_n = a − w_n;   e_n <- β·e_n + Δ_n;
    s_n = Q(Top-k per tile(e_n));   e_n <- e_n − s_n;
    a <- a − α · mean over workers of the s_n;   every worker restarts from a

  Top-k keeps round(density · size) entries of every tile (64x64 for a
  matrix, 64-long segments of a vector); Q is the statistical quantiser (one
  per tensor: 2^bits bins 1.5σ wide about the mean, each decoded to its bins'
  mean). The payload (12-bit in-tile positions, packed codes, a 5-float table
  per tensor) is all-gathered. The inner optimizer keeps its state.

  Readings taken where the paper is silent or the authors' code departs from it:
  α is applied once, to the update (the code also scales Δ by α when
  accumulating: α² in all; the same at the paper's α = 1); the mean is over
  the workers that selected each entry, as the code's scatter-mean
  (`average='all'`: the paper's (1/N)Σ); the quantiser is per tensor and its
  error stays in e_n, as in the code; tensors of more than 2 dimensions are
  tiled as matrices prod(leading) x last (the code takes only matrices and
  vectors). Sent as Templar's wire format counts it (12-bit positions, 2-bit
  codes packed four to a byte), not the code's uint8 / int64.

  Args:
    period: inner steps H between outer steps (the authors' 512M runs: 15).
    axis_name: the worker axis (or tuple of axes).
    density: kept fraction of each tile (0.03125 = 128 of 4,096, the paper's
      "3 %"; 0.015625 = 64, Templar's production run).
    bits: bits per sent value (2 = 4 bins; 1, 4, 8); 32 sends float32 values.
    chunk: the longest tile side (64).
    error_decay: β of the error accumulator (0.95).
    outer_learning_rate: α of the outer SGD (1.0).
    value_range: the quantiser's range in standard deviations (6).
    average: 'selected' (the code's mean over the workers that sent each entry)
      or 'all' (the paper's 1/N).

  Returns:
    An `optax.GradientTransformation` whose state is a `DiLoCoState` (its
    averager a `ChunkedState`); put it after the inner optimizer.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jaxdist import runtime, sync, testing
    >>> tx = optax.chain(optax.sgd(1.0), sync.sparseloco(1, axis_name=runtime.AXES,
    ...                                                  density=0.5, bits=32))
    >>> run = testing.Run(tx, {'x': jnp.zeros(2)}, workers=2)
    >>> run({'x': jnp.array([[4.0, 1.0], [2.0, 3.0]])})['x']  # 4 and 3 sent; 1 and 2 kept back
    Array([[-4., -3.],
           [-4., -3.]], dtype=float32)

  References:
    Sarfi, Thérien, Lidin, Belilovsky. Communication Efficient LLM Pre-training
    with SparseLoCo. 2025. https://arxiv.org/abs/2508.15706
    Douillard et al. DiLoCo: Distributed Low-Communication Training of
    Language Models. 2023. https://arxiv.org/abs/2311.08105
  """
  _averaging.check_period(period)
  _checks.check('outer_learning_rate', outer_learning_rate, lambda a: a > 0, '> 0')
  averager = chunked_allgather(
    axis_name=axis_name,
    density=density,
    chunk=chunk,
    bits=bits,
    value_range=value_range,
    error_decay=error_decay,
    average=average,
  )
  return diloco(optax.sgd(outer_learning_rate), period, axis_name=axis_name, averager=averager)
