"""PowerSGD: rank-r approximation of each gradient matrix by one power iteration.

Pure pieces only; the transform `jaxdist.sync.powersgd` puts the two
all-reduces between them:

  P = M orthogonalize(Q);  P <- mean over workers;  P^ = orthogonalize(P)
  Q = M^T P^;  Q <- mean over workers;  approximation = P^ Q^T

with Q warm-started from the previous step and M = gradient + error memory.
Q is orthogonalised before it multiplies M, as in PyTorch's `powerSGD_hook`
and the maintained epfml/powersgd (the paper's first code used it as it
was). In exact arithmetic that changes nothing: Q and its orthonormal basis
span the same columns, and so do the two P's. In float32 it does: a
warm-started Q = M^T P^ carries M's leading singular values in its columns,
so M Q's condition number is about (σ_1 / σ_r)², against σ_1 / σ_r for M
times an orthonormal Q, and what P^ loses grows with it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


def orthogonalize(p: jax.Array, eps: float = 1e-8) -> jax.Array:
  """An orthonormal basis of the columns of p [m, r]: Gram–Schmidt, applied twice.

  One pass of (modified) Gram–Schmidt leaves columns that are orthogonal only
  to about float32's epsilon times p's condition number; a second pass over
  its output brings them to working precision for any p not numerically
  rank-deficient ("twice is enough": Giraud, Langou, Rozložník, 2005), as
  the Householder QR that PyTorch's `powerSGD_hook` (rank > 2) and
  epfml/powersgd use does. Column i spans what columns 0..i of p span;
  `eps` is added to each norm, so a zero column stays zero instead of
  becoming NaN.

  Args:
    p: the matrix [m, r] whose columns to orthonormalise.
    eps: added to each column's norm before dividing by it.

  Returns:
    [m, r], orthonormal columns (a zero column stays zero).
  """
  return _gram_schmidt(_gram_schmidt(p, eps), eps)


def _gram_schmidt(p: jax.Array, eps: float) -> jax.Array:
  """One pass of modified Gram–Schmidt over the columns of p [m, r]."""
  cols = []
  for i in range(p.shape[1]):
    col = p[:, i]
    for prev in cols:
      col = col - jnp.sum(prev * col) * prev
    cols.append(col / (jnp.linalg.norm(col) + eps))
  return jnp.stack(cols, axis=1)


@dataclasses.dataclass(frozen=True)
class PowerSGD:
  """Rank-`rank` PowerSGD compressor of matrices, with warm-started Q.

  A tensor of shape (..., out) is treated as the matrix [prod(...), out]
  (flax kernels put the output features last); 1-D tensors are not
  compressed. The rank is capped at the matrix's smaller side.

  Attributes:
    rank: r, the approximation's rank (>= 1).
    warm_start: start each step's power iteration from the last Q (read by
      `jd.sync.powersgd`; `init_q` draws the first).
    seed: seed of the initial Q when `init_q` is given no key.

  Reference: Vogels, Karimireddy, Jaggi. PowerSGD: Practical Low-Rank
  Gradient Compression for Distributed Optimization. NeurIPS 2019.
  https://arxiv.org/abs/1905.13727
  """

  rank: int = 2
  warm_start: bool = True
  seed: int = 0
  name = 'powersgd'
  summable = True

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f'rank must be >= 1, got {self.rank}')

  @staticmethod
  def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The matrix a tensor is compressed as: its leading axes flattened.

    Args:
      shape: the tensor's shape (..., out).

    Returns:
      (prod(...), out).
    """
    return math.prod(shape[:-1]), shape[-1]

  def rank_for(self, shape: tuple[int, ...]) -> int:
    """The rank used for a tensor of `shape`: `rank`, capped at its matrix's smaller side.

    Args:
      shape: the tensor's shape.

    Returns:
      The rank r.
    """
    return min(self.rank, *self.matrix_shape(shape))

  def init_q(self, shape: tuple[int, ...], key: jax.Array | None = None) -> jax.Array:
    """Initial Q [cols, r] ~ N(0, 1); the same on every worker (shared seed).

    Args:
      shape: the tensor's shape.
      key: the PRNG key (None: `jax.random.key(seed)`).

    Returns:
      float32 [cols, r], with (rows, cols) the tensor's `matrix_shape`.
    """
    key = jax.random.key(self.seed) if key is None else key
    _, cols = self.matrix_shape(shape)
    return jax.random.normal(key, (cols, self.rank_for(shape)), jnp.float32)

  def wire_bytes(self, shape: tuple[int, ...]) -> tuple[int, int]:
    """Bytes of P and of Q for a tensor of `shape` (float32).

    Args:
      shape: the tensor's shape.

    Returns:
      (bytes of P [rows, r], bytes of Q [cols, r]).
    """
    rows, cols = self.matrix_shape(shape)
    r = self.rank_for(shape)
    return 4 * rows * r, 4 * cols * r

  @staticmethod
  def project(m: jax.Array, q: jax.Array) -> jax.Array:
    """P = M orthogonalize(Q) [rows, r]: Q's columns made orthonormal first.

    Args:
      m: the matrix M [rows, cols].
      q: Q [cols, r].

    Returns:
      P [rows, r].
    """
    return m @ orthogonalize(q)

  @staticmethod
  def back(m: jax.Array, p_hat: jax.Array) -> jax.Array:
    """The new Q = M^T P^ [cols, r].

    Args:
      m: the matrix M [rows, cols].
      p_hat: P^, the orthonormalised mean P [rows, r].

    Returns:
      Q [cols, r].
    """
    return m.T @ p_hat

  @staticmethod
  def decode(p_hat: jax.Array, q: jax.Array) -> jax.Array:
    """The approximation P^ Q^T [rows, cols].

    Args:
      p_hat: P^ [rows, r].
      q: the (mean) Q [cols, r].

    Returns:
      The rank-r matrix [rows, cols].
    """
    return p_hat @ q.T

  def roundtrip(self, m: jax.Array, q: jax.Array | None = None) -> jax.Array:
    """One worker's rank-r approximation of the matrix m (no communication).

    Args:
      m: the matrix [rows, cols].
      q: the starting Q [cols, r] (None: `init_q`'s).

    Returns:
      P^ Q^T [rows, cols], Q = M^T P^ after one power iteration.
    """
    q = self.init_q((m.shape[0], m.shape[1])) if q is None else q
    p_hat = orthogonalize(self.project(m, q))
    return self.decode(p_hat, self.back(m, p_hat))
