"""Which examples each worker trains on: IID, SelSync's SelDP, non-IID labels, data injection.

Host-side NumPy only. `make_sampler(partition, labels, num_workers)` returns a
`Sampler` whose `indices(step, sizes)` gives worker k's `sizes[k]` example
indices at `step`: a pure function of (seed, step, sizes), so a resumed run
sees exactly the batches it would have seen.

Kinds (`Partition.kind`):

* `'iid'`: the global batch of `sum(sizes)` examples of `data.batch_indices`
  cut into consecutive slices, worker k taking the k-th (with equal sizes b,
  the rows of `data.worker_indices`).
* `'seldp'`: SelSync's SelDP, the paper's circular queue of chunks (not the
  authors' code's per-rank permutation, whose batches overlap across workers).
* `'labels'`: non-IID; worker k holds the examples of only
  `labels_per_worker` labels.

Randomised data injection (`inject_alpha`, `inject_beta`) works with all three.

References:
  Tyagi & Swany, "Accelerating Distributed ML Training via Selective
  Synchronization" (SelSync), IEEE CLUSTER 2023, https://arxiv.org/abs/2307.07950
  (SelDP; randomised data injection, Eq. 3).
  Tyagi & Swany, "ScaDLES: Scalable Deep Learning over Streaming data at the
  Edge", IEEE BigData 2022, https://sahiltyagi4.github.io/files/scadles.pdf (§V-F).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from jaxdist.data.loader import DatasetError, batch_indices

KINDS = ('iid', 'seldp', 'labels')

# Tolerance for rounding products of fractions (0.3 * 10 == 3.0000000000000004).
_EPS = 1e-9
# The second word of a random stream's seed (seed, tag, ...), one per use. They are large so no
# stream equals the dataset permutation's (seed, epoch): NumPy seeds ignore trailing zeros.
_ASSIGN = 0x5E1D_0001
_SHARD = 0x5E1D_0002
_INJECT = 0x5E1D_0003


@dataclasses.dataclass(frozen=True)
class Partition:
  """How the training examples are spread over workers, and what they share each step.

  Attributes:
    kind: `'iid'` (slices of one global batch), `'seldp'` (SelSync's circular
      queue of chunks) or `'labels'` (non-IID, `labels_per_worker` labels
      per worker).
    labels_per_worker: of `'labels'`: how many distinct labels each worker
      holds. Ignored by the other kinds.
    inject_alpha: randomised data injection: fraction α of the workers that
      share data each step, in [0, 1]; 0 turns injection off.
    inject_beta: fraction β of a sender's own batch that it shares, in
      [0, 1]; 0 turns injection off.
    seed: seeds every random choice (dataset permutations, label assignment,
      senders).

  Example:
    >>> from jaxdist import data
    >>> data.Partition('labels', labels_per_worker=2, inject_alpha=0.5, inject_beta=0.5)
    Partition(kind='labels', labels_per_worker=2, inject_alpha=0.5, inject_beta=0.5, seed=0)
  """

  kind: str = 'iid'
  labels_per_worker: int = 1
  inject_alpha: float = 0.0
  inject_beta: float = 0.0
  seed: int = 0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'kind must be one of {KINDS}, got {self.kind!r}')
    if isinstance(self.labels_per_worker, bool) or not isinstance(
      self.labels_per_worker, int | np.integer
    ):
      raise ValueError(f'labels_per_worker must be an int >= 1, got {self.labels_per_worker!r}')
    if self.labels_per_worker < 1:
      raise ValueError(
        f'labels_per_worker must be >= 1 (labels held by each worker), got {self.labels_per_worker}'
      )
    for name, what in (
      ('inject_alpha', 'the fraction of workers that share data each step'),
      ('inject_beta', "the fraction of a sender's own batch that it shares"),
    ):
      value = getattr(self, name)
      if not 0 <= value <= 1:  # False for NaN too
        raise ValueError(f'{name} must be in [0, 1] ({what}; 0 turns injection off), got {value}')

  @property
  def injects(self) -> bool:
    """Whether data injection is on (both fractions positive)."""
    return self.inject_alpha > 0 and self.inject_beta > 0


class Batch(NamedTuple):
  """One step's example indices per worker.

  Attributes:
    indices: worker k's example indices, exactly `sizes[k]` of them (int64):
      its own examples first, then those it received, sender by sender in
      worker order.
    injected: [K] int64: how many of worker k's examples it received from
      other workers this step (0 without injection). Multiply by the bytes
      of one example for the bytes each worker receives.
  """

  indices: list[np.ndarray]
  injected: np.ndarray


class Sampler:
  """Per-worker example indices of any step for one `Partition`; made by `make_sampler`.

  Attributes:
    partition: the `Partition`.
    num_examples: examples in the training split.
    num_workers: workers K.
    shards: of `'labels'`: worker k's examples (sorted indices); else None.
    worker_labels: of `'labels'`: the labels worker k holds (sorted); else None.

  Example:
    >>> import numpy as np
    >>> from jaxdist import data
    >>> sampler = data.make_sampler(data.Partition('seldp'), np.zeros(12, np.int32), num_workers=3)
    >>> rows = sampler.indices(0, [2, 2, 2]).indices  # disjoint across workers
    >>> len(set(np.concatenate(rows).tolist()))
    6
  """

  def __init__(
    self,
    partition: Partition,
    num_examples: int,
    num_workers: int,
    shards: list[np.ndarray] | None = None,
    worker_labels: list[tuple[int, ...]] | None = None,
  ):
    self.partition = partition
    self.num_examples = num_examples
    self.num_workers = num_workers
    self.shards = shards
    self.worker_labels = worker_labels
    self._shard_perms: dict[int, tuple[int, np.ndarray]] = {}  # worker -> (shard epoch, perm)

  def __repr__(self) -> str:
    return (
      f'Sampler({self.partition}, num_examples={self.num_examples}, num_workers={self.num_workers})'
    )

  def indices(self, step: int, sizes: Sequence[int]) -> Batch:
    """Worker k's `sizes[k]` example indices at `step`; a pure function of (seed, step, sizes).

    Args:
      step: the training step (>= 0).
      sizes: [K] per-worker batch sizes, each >= 1. They may differ between
        workers and from step to step (dynamic batching, streaming).

    Returns:
      The `Batch`.

    Raises:
      ValueError: bad sizes, or injection that leaves a worker no examples of
        its own, or that rounds a sender's share to 0 examples.
      DatasetError: a batch larger than the data it is drawn from.
    """
    sizes = self._check_sizes(sizes)
    step = int(step)
    if step < 0:
      raise ValueError(f'step must be >= 0, got {step}')
    kind = self.partition.kind
    if kind == 'iid':
      base = self._iid(step, sizes)
    elif kind == 'seldp':
      base = self._seldp(step, sizes)
    else:
      base = self._labels(step, sizes)
    if not self.partition.injects:
      return Batch(base, np.zeros(self.num_workers, np.int64))
    return self._inject(step, sizes, base)

  def senders(self, step: int) -> np.ndarray:
    """The workers that share data at `step` (sorted); empty without injection.

    ⌈α·K⌉ workers drawn without replacement, seeded by (seed, step).

    Args:
      step: the training step.

    Returns:
      int64 array of worker indices, ascending.
    """
    if not self.partition.injects:
      return np.zeros(0, np.int64)
    count = math.ceil(self.partition.inject_alpha * self.num_workers - _EPS)
    rng = np.random.default_rng((self.partition.seed, _INJECT, int(step)))
    return np.sort(rng.choice(self.num_workers, size=count, replace=False)).astype(np.int64)

  def shares(self, sizes: Sequence[int]) -> np.ndarray:
    """[K] examples each worker shares when it is a sender (Eq. 3 with ceil, then floor).

    b'_k = ⌈sizes[k] / (1 + αβK)⌉ is SelSync's own-batch size (Eq. 3) and a
    sender shares ⌊β·b'_k⌋ examples of it.

    Args:
      sizes: [K] per-worker batch sizes.

    Returns:
      int64 array [K] (zeros without injection).
    """
    sizes = self._check_sizes(sizes)
    a, b = self.partition.inject_alpha, self.partition.inject_beta
    if not self.partition.injects:
      return np.zeros(self.num_workers, np.int64)
    own = [math.ceil(s / (1 + a * b * self.num_workers) - _EPS) for s in sizes]
    return np.asarray([math.floor(b * o + _EPS) for o in own], np.int64)

  def _check_sizes(self, sizes: Sequence[int]) -> list[int]:
    raw = np.asarray(sizes).reshape(-1)
    sizes = [int(s) for s in raw]
    if not np.array_equal(raw, sizes):
      raise ValueError(f'per-worker batch sizes must be integers, got {raw.tolist()}')
    if len(sizes) != self.num_workers:
      raise ValueError(f'sizes must have one entry per worker ({self.num_workers}), got {sizes}')
    if min(sizes) < 1:
      raise ValueError(f'every per-worker batch size must be >= 1, got {sizes}')
    return sizes

  def _iid(self, step: int, sizes: list[int]) -> list[np.ndarray]:
    flat = batch_indices(
      step, seed=self.partition.seed, num_examples=self.num_examples, batch_size=sum(sizes)
    )
    return np.split(flat, np.cumsum(sizes)[:-1])

  def _seldp(self, step: int, sizes: list[int]) -> list[np.ndarray]:
    n, k = self.num_examples, self.num_workers
    chunk, window = n // k, max(sizes)
    if window > chunk:
      raise DatasetError(
        f'seldp: a per-worker batch of {window} is larger than a chunk of {chunk} examples '
        f'({n} examples over {k} workers); batches would overlap across workers'
      )
    used = k * chunk
    epoch, j = divmod(step, used // window)
    perm = _permutation(self.partition.seed, epoch, n)
    return [perm[(w * chunk + j * window + np.arange(s)) % used] for w, s in enumerate(sizes)]

  def _labels(self, step: int, sizes: list[int]) -> list[np.ndarray]:
    out = []
    for w, (shard, s) in enumerate(zip(self.shards, sizes, strict=True)):
      if s > len(shard):
        raise DatasetError(
          f'labels: worker {w} holds {len(shard)} examples (labels '
          f'{list(self.worker_labels[w])}), fewer than its batch of {s}'
        )
      epoch, i = divmod(step, len(shard) // s)
      cached = self._shard_perms.get(w)
      if cached is None or cached[0] != epoch:
        rng = np.random.default_rng((self.partition.seed, _SHARD, w, epoch))
        cached = (epoch, rng.permutation(len(shard)))
        self._shard_perms[w] = cached
      out.append(shard[cached[1][i * s : (i + 1) * s]])
    return out

  def _inject(self, step: int, sizes: list[int], base: list[np.ndarray]) -> Batch:
    a, b = self.partition.inject_alpha, self.partition.inject_beta
    senders = self.senders(step)
    share = self.shares(sizes)
    for s in senders:
      if share[s] == 0:
        raise ValueError(
          f'injection: worker {s} would share 0 examples: inject_beta={b} of its own batch of '
          f"{math.ceil(sizes[s] / (1 + a * b * self.num_workers) - _EPS)} (Eq. 3's b') rounds "
          f'down to 0. Raise inject_beta or the batch size, or set inject_beta=0.'
        )
    indices, injected = [], np.zeros(self.num_workers, np.int64)
    for w, size in enumerate(sizes):
      received = [base[s][: share[s]] for s in senders if s != w]
      injected[w] = sum(len(r) for r in received)
      own = size - int(injected[w])
      needed = max(1, int(share[w]) if w in senders else 0)
      if own < needed:
        raise ValueError(
          f'injection: worker {w} (batch {size}) receives {injected[w]} examples from '
          f'{len(received)} senders, leaving {own} of its own where it needs {needed} '
          f'(at least 1, and the examples it shares). Lower inject_alpha={a} or '
          f'inject_beta={b}, or raise the batch size.'
        )
      indices.append(np.concatenate([base[w][:own], *received]))
    return Batch(indices, injected)


def make_sampler(partition: Partition, labels: np.ndarray, num_workers: int) -> Sampler:
  """A `Sampler` of `partition` over a training split with these `labels`.

  Readings (where the papers leave room):

  * `'iid'`: worker k takes the k-th consecutive slice of
    `data.batch_indices(step, batch_size=sum(sizes))`; with equal sizes b these
    are the rows of `data.worker_indices(step, per_worker=b)`.
  * `'seldp'` (SelSync's SelDP, the paper's rotation): each epoch the dataset
    is permuted (seeded by (seed, epoch), the permutation `batch_indices`
    uses) and its first K·c examples, c = n // K, cut into K chunks of c
    (the n − K·c left over are skipped that epoch). Worker k reads the
    chunks in the order k, k+1, ..., k−1 as one stream, i.e. position p of
    its stream is permuted example (k·c + p) mod K·c. Step j of an epoch
    reads positions [j·b, j·b + b): workers are then in distinct chunks at
    every position, so a step's batches are disjoint (needs b <= c), and an
    epoch is ⌊K·c / b⌋ steps in which every worker reads the whole of its
    stream (when b divides K·c), so every worker sees all K·c examples once.
    With unequal sizes the step reads a window of b = max(sizes) positions
    and worker k takes its first sizes[k] (still disjoint; the rest of its
    window is skipped).
  * `'labels'`: the classes (the distinct values of `labels`) are permuted
    (seeded) and dealt in order into K·k slots, worker w taking slots
    w·k, ..., w·k + k − 1 (mod C): so each worker's k labels are distinct and
    each label is held by ⌊K·k/C⌋ or ⌈K·k/C⌉ workers (10 workers × 1 label
    over 10 classes: each label once; K·k < C leaves labels unused). The
    examples of a label are shuffled (seeded) and split into nearly equal
    disjoint parts among its holders. Worker w reads its shard epoch by
    epoch, ⌊|shard| / sizes[w]⌋ steps an epoch, each shard epoch a fresh
    permutation seeded by (seed, w, epoch).
  * Injection (ScaDLES §V-F's broadcast, with SelSync's Eq. 3 for the sizes):
    each step ⌈α·K⌉ senders drawn at random (seeded by (seed, step)); sender s
    shares the first ⌊β·b'_s⌋ examples of its own batch, where
    b'_s = ⌈sizes[s] / (1 + αβK)⌉ is Eq. 3's own-batch size, with every other
    worker. Each worker keeps its batch at sizes[k]: it trains on the first
    sizes[k] − received of its own (non-injected) batch plus everything it
    received, and `Batch.injected[k]` counts the received examples (bytes
    are per receiving worker). A share that rounds to 0, or a worker left
    with no examples of its own (or fewer than it shares), is a ValueError.

  Args:
    partition: the `Partition`.
    labels: [n] integer labels of the training split (only `'labels'` reads
      their values; every kind takes n from their length).
    num_workers: workers K (>= 1).

  Returns:
    The `Sampler`.

  Raises:
    ValueError: bad `num_workers` or `labels`, or `labels_per_worker` more
      than the number of classes.

  Example:
    >>> import numpy as np
    >>> from jaxdist import data
    >>> labels = np.arange(40) % 10
    >>> sampler = data.make_sampler(data.Partition('labels', seed=1), labels, num_workers=10)
    >>> sorted(l for (l,) in sampler.worker_labels)  # each label held by one worker
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> batch = sampler.indices(0, [2] * 10)
    >>> all(len(set(labels[i]) - set(sampler.worker_labels[w])) == 0
    ...     for w, i in enumerate(batch.indices))
    True
    >>> sampler = data.make_sampler(
    ...   data.Partition('seldp', inject_alpha=0.5, inject_beta=0.5), labels, num_workers=4)
    >>> batch = sampler.indices(3, [6, 6, 6, 6])
    >>> [len(i) for i in batch.indices], sorted(batch.injected.tolist())
    ([6, 6, 6, 6], [1, 1, 2, 2])
  """
  if isinstance(num_workers, bool) or not isinstance(num_workers, int | np.integer):
    raise ValueError(f'num_workers must be an int >= 1, got {num_workers!r}')
  if num_workers < 1:
    raise ValueError(f'num_workers must be >= 1, got {num_workers}')
  labels = np.asarray(labels)
  if labels.ndim != 1 or len(labels) == 0 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
      f'labels must be a non-empty 1-D integer array, got shape {labels.shape} {labels.dtype}'
    )
  num_workers = int(num_workers)
  if partition.kind != 'labels':
    return Sampler(partition, len(labels), num_workers)
  shards, worker_labels = _label_shards(partition, labels, num_workers)
  return Sampler(partition, len(labels), num_workers, shards, worker_labels)


def _label_shards(
  partition: Partition, labels: np.ndarray, num_workers: int
) -> tuple[list[np.ndarray], list[tuple[int, ...]]]:
  classes = np.unique(labels)
  c, k = len(classes), partition.labels_per_worker
  if k > c:
    raise ValueError(
      f'labels_per_worker={k} is more than the {c} classes in the labels; use at most {c}'
    )
  rng = np.random.default_rng((partition.seed, _ASSIGN))
  order = classes[rng.permutation(c)]
  held = [order[(w * k + np.arange(k)) % c] for w in range(num_workers)]
  parts: list[list[np.ndarray]] = [[] for _ in range(num_workers)]
  for label in classes:  # in sorted order, so the draws do not depend on the dealing
    examples = np.flatnonzero(labels == label)
    examples = examples[rng.permutation(len(examples))]
    holders = [w for w in range(num_workers) if label in held[w]]
    if not holders:  # K·k < C: this label is unused
      continue
    for w, part in zip(holders, np.array_split(examples, len(holders)), strict=True):
      parts[w].append(part)
  shards = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
  worker_labels = [tuple(int(x) for x in np.sort(h)) for h in held]
  return shards, worker_labels


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  # The epoch permutation `data.batch_indices` uses.
  return np.random.default_rng((seed, epoch)).permutation(n)
