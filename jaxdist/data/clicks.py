"""Synthetic click-through data from a known teacher: a DLRM-shaped stream, nothing to download.

Each example has `num_dense` standard-normal dense features and one categorical
id per table. Ids follow a Zipf law, p(rank r) ∝ (r + 1)^-zipf over the `rows`
of a table (rank 0 the most frequent), with a fixed random permutation per
table so the hot rows are scattered over the table. The label is a Bernoulli
draw of the teacher's click probability

  logit = b0 + x·w + Σ_t β_t[i_t] + Σ_{t<u} ⟨V_t[i_t], V_u[i_u]⟩

(per-row biases β and per-row latent vectors V, all seeded), so the teacher's
own log-loss on a split is the best any model can expect (`bayes_logloss`).

The stream is a pure function of (seed, step): `batch(step, size)` returns the
same examples every time it is asked, so a job rolled back to a checkpoint
trains on exactly the batches it trained on before (full recovery recomputes
the same steps), and the test split is drawn from its own seeded stream.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_TEACHER, _TRAIN, _TEST = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class ClickBatch:
  """Examples in host memory: `dense` [n, F] float32, `ids` [n, T] int32, `labels` [n] float32.

  Attributes:
    dense: [n, F] float32 dense features.
    ids: [n, T] int32, one row id per table.
    labels: [n] float32 clicks, 0 or 1.
  """

  dense: np.ndarray
  ids: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.labels)


@dataclasses.dataclass(frozen=True, eq=False)
class Clicks:
  """A seeded click stream; build it with `clicks(...)`.

  Attributes:
    num_tables: categorical features, one embedding table each (T).
    rows: rows per table (R), ids in [0, R).
    num_dense: dense features (F).
    zipf: exponent of the id distribution (0 = uniform).
    seed: seeds the teacher, the train stream and the test split.
    probs: [R] probability of each rank, most frequent first.
    perm: [T, R] row id of each rank, per table.
    bias: teacher's scalar b0.
    w: [F] teacher's dense weights.
    beta: [T, R] teacher's per-row biases.
    latent: [T, R, K] teacher's per-row vectors.
  """

  num_tables: int
  rows: int
  num_dense: int
  zipf: float
  seed: int
  probs: np.ndarray
  perm: np.ndarray
  bias: float
  w: np.ndarray
  beta: np.ndarray
  latent: np.ndarray

  def _sample(self, rng: np.random.Generator, n: int) -> ClickBatch:
    dense = rng.standard_normal((n, self.num_dense), dtype=np.float32)
    ranks = rng.choice(self.rows, size=(n, self.num_tables), p=self.probs)
    ids = self.perm[np.arange(self.num_tables)[None, :], ranks].astype(np.int32)
    p = self.probability(dense, ids)
    labels = (rng.random(n) < p).astype(np.float32)
    return ClickBatch(dense, ids, labels)

  def batch(self, step: int, size: int) -> ClickBatch:
    """The `size` training examples of step `step` (the same on every call).

    Args:
      step: the training step (>= 0).
      size: examples (>= 1).

    Returns:
      A `ClickBatch` of `size` examples, seeded by (seed, step, size).
    """
    if step < 0 or size < 1:
      raise ValueError(f'step must be >= 0 and size >= 1, got step={step}, size={size}')
    return self._sample(np.random.default_rng((self.seed, _TRAIN, step, size)), size)

  def test(self, size: int) -> ClickBatch:
    """A held-out split of `size` examples from its own stream.

    Args:
      size: examples (>= 1).

    Returns:
      A `ClickBatch`, the same for the same size.
    """
    if size < 1:
      raise ValueError(f'size must be >= 1, got {size}')
    return self._sample(np.random.default_rng((self.seed, _TEST, size)), size)

  def logit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The teacher's logit of each example.

    Args:
      dense: [n, F] dense features.
      ids: [n, T] row ids.

    Returns:
      float32 [n], b0 + x·w + Σ_t β_t[i_t] + Σ_{t<u} ⟨V_t[i_t], V_u[i_u]⟩.
    """
    tables = np.arange(self.num_tables)[None, :]
    v = self.latent[tables, ids]  # [n, T, K]
    gram = np.einsum('ntk,nuk->ntu', v, v)
    pairs = (gram.sum((1, 2)) - np.einsum('ntt->n', gram)) / 2
    return (self.bias + dense @ self.w + self.beta[tables, ids].sum(1) + pairs).astype(np.float32)

  def probability(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The teacher's click probability of each example.

    Args:
      dense: [n, F] dense features.
      ids: [n, T] row ids.

    Returns:
      [n], the sigmoid of `logit`.
    """
    return 1 / (1 + np.exp(-self.logit(dense, ids)))

  def bayes_logloss(self, split: ClickBatch) -> float:
    """Log-loss of the teacher's own probabilities on `split` (the best achievable, noise aside).

    Args:
      split: labelled examples, e.g. `test(size)`.

    Returns:
      The mean log-loss, a float (probabilities clipped to [1e-7, 1 − 1e-7]).
    """
    p = np.clip(self.probability(split.dense, split.ids), 1e-7, 1 - 1e-7)
    y = split.labels
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

  def frequencies(self) -> np.ndarray:
    """[T, R] probability that an example looks up each row.

    Returns:
      float [T, R]; each table's row sums to 1.
    """
    out = np.zeros((self.num_tables, self.rows))
    for t in range(self.num_tables):
      out[t, self.perm[t]] = self.probs
    return out


def clicks(
  num_tables: int = 8,
  rows: int = 2000,
  num_dense: int = 8,
  zipf: float = 1.05,
  latent_dim: int = 4,
  bias_scale: float = 0.8,
  latent_scale: float = 0.2,
  dense_scale: float = 0.5,
  base_logit: float = -1.0,
  seed: int = 0,
) -> Clicks:
  """A seeded DLRM-shaped click stream labelled by a random teacher.

  Args:
    num_tables: categorical features (embedding tables).
    rows: rows per table.
    num_dense: dense features.
    zipf: exponent of the Zipf law of the ids (1.05: a few rows take most lookups).
    latent_dim: width K of the teacher's per-row vectors.
    bias_scale: standard deviation of the teacher's per-row biases.
    latent_scale: standard deviation of one pairwise interaction term.
    dense_scale: standard deviation of the dense part of the logit.
    base_logit: the teacher's constant (−1: about a third of examples click).
    seed: seeds everything.

  Returns:
    The `Clicks` stream.

  >>> data = clicks(num_tables=2, rows=10, num_dense=3, seed=0)
  >>> b = data.batch(0, 4)
  >>> b.dense.shape, b.ids.shape, b.labels.shape
  ((4, 3), (4, 2), (4,))
  >>> bool((data.batch(0, 4).ids == b.ids).all())
  True
  """
  if min(num_tables, rows, num_dense, latent_dim) < 1:
    raise ValueError(
      f'num_tables, rows, num_dense and latent_dim must be >= 1, got {num_tables}, {rows}, '
      f'{num_dense}, {latent_dim}'
    )
  if zipf < 0:
    raise ValueError(f'zipf must be >= 0, got {zipf}')
  rng = np.random.default_rng((seed, _TEACHER))
  probs = (np.arange(1, rows + 1, dtype=np.float64)) ** -zipf
  probs /= probs.sum()
  perm = np.stack([rng.permutation(rows) for _ in range(num_tables)]).astype(np.int32)
  w = (rng.standard_normal(num_dense) * dense_scale / np.sqrt(num_dense)).astype(np.float32)
  beta = (rng.standard_normal((num_tables, rows)) * bias_scale).astype(np.float32)
  # each pair term ⟨V_t, V_u⟩ has variance K·s⁴: s = (latent_scale² / K)^(1/4)
  s = (latent_scale**2 / latent_dim) ** 0.25
  latent = (rng.standard_normal((num_tables, rows, latent_dim)) * s).astype(np.float32)
  return Clicks(
    num_tables, rows, num_dense, float(zipf), seed, probs, perm, float(base_logit), w, beta, latent
  )
