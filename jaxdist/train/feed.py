"""What reaches the devices: each step's global batch, and the test split for evaluation.

`put_batch` draws step t's examples for every worker (`Experiment.sampler`)
and places them on the layout's devices; `eval_chunks` cuts the test split
into padded, device-sharded chunks, which `evaluate` runs the evaluation
step over.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxdist import runtime
from jaxdist.train.experiment import Experiment


def put_batch(
  exp: Experiment, t: int, sizes=None, scale: float | None = None, counts=None
) -> tuple[tuple[jax.Array, ...], np.ndarray]:
  """Global batch `t` as [workers, held, ...] arrays, and [K] examples each worker received.

  `exp.sampler` chooses each worker's examples (`jd.data.Partition`: iid,
  SelDP, non-IID labels, with or without data injection). With per-worker
  batch `sizes` ([K] ints), worker k's examples are repeated to fill its
  `exp.held` slots (the step trains on the first sizes[k]); with
  `exp.counted` the `counts` (default: the sizes; 0 for a dropped worker,
  whose drawn examples are then lost) come as a third array and a
  learning-rate `scale`, if given, as a fourth. Each process loads its own
  workers.
  """
  w, split = exp.workers, exp.dataset.train
  batch = exp.sampler.indices(t, [exp.per_worker] * w.count if sizes is None else sizes)
  idx = np.stack([np.resize(part, exp.held) for part in batch.indices])[w.local_workers()]
  arrays = list(exp.dataset.inputs(split, idx))
  if exp.counted:
    counts = sizes if counts is None else counts
    arrays.append(np.asarray(counts, np.int32)[w.local_workers()])
    if scale is not None:
      arrays.append(np.full(w.count, scale, np.float32)[w.local_workers()])
  put = lambda a: jax.make_array_from_process_local_data(w.sharding, a, (w.count, *a.shape[1:]))
  return tuple(put(a) for a in arrays), batch.injected


def eval_chunks(exp: Experiment) -> list[tuple[jax.Array, ...]]:
  """The test split (its first `exp.eval_examples`, if set) in device-sharded, padded chunks
  (x, y, mask)."""
  split, w = exp.dataset.test, exp.workers
  total = min(exp.eval_examples or len(split), len(split))
  chunk = -(-min(exp.eval_batch_size, total) // w.devices) * w.devices
  sharding = jax.NamedSharding(w.mesh, jax.sharding.PartitionSpec(runtime.DATA))
  chunks = []
  for start in range(0, total, chunk):
    n = min(chunk, total - start)
    arrays = (*exp.dataset.inputs(split, np.arange(start, start + n)), np.ones(n, np.float32))
    arrays = [np.concatenate([a, np.zeros((chunk - n, *a.shape[1:]), a.dtype)]) for a in arrays]
    chunks.append(
      tuple(jax.make_array_from_callback(a.shape, sharding, lambda i, a=a: a[i]) for a in arrays)
    )
  return chunks


def evaluate(eval_step, state, chunks) -> dict[str, float]:
  """Test loss and accuracy of the worker-averaged model over all chunks."""
  sums = [jax.device_get(eval_step(state, *c)) for c in chunks]
  count = sum(float(s['count']) for s in sums)
  return {
    'test_loss': sum(float(s['loss']) for s in sums) / count,
    'test_accuracy': sum(float(s['correct']) for s in sums) / count,
  }
