"""DLRM's hybrid layout: tables model-parallel, MLP data-parallel, in one `shard_map` step.

Worker k of N (one device each, mesh axis `data`) holds tables
[k·T/N, (k+1)·T/N) of the stack (`P('data')` on its table axis), a replica of
the MLP (`P()`), and its slice of the global batch. One training step:

1. `jaxdist.models.dlrm.sharded_lookup`: an all-to-all of ids to the tables'
   owners, a local gather, an all-to-all of vectors back;
2. forward and backward of the dense part on the worker's examples; the
   backward of the second all-to-all is an all-to-all that returns each
   example's vector gradients to the owner of its table;
3. the MLP's gradients are averaged over the workers (an all-reduce); each
   owner's table gradients already sum every worker's examples (the
   transpose of the all-to-all) and are divided by N: both become gradients
   of the mean loss over the global batch;
4. the update: plain SGD on the MLP; on the tables plain SGD
   (`optimizer='sgd'`) or row-wise Adagrad (`'rowwise_adagrad'`, DLRM's
   usual choice: one accumulator per row, the mean of its squared gradient,
   so rows that are seen often take smaller steps), each owner updating its
   own tables.

`make_reference_step` is the same model on one device and the same global
batch; the tests hold the two equal.

`shard_map` runs with `check_vma=False`, as `jaxdist.runtime` does: the MLP
enters replicated, so its per-device gradient is the worker's own (no
implicit sum) and the explicit `pmean` averages it; the equivalence test keeps
this honest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdist.models import dlrm
from jaxdist.runtime import DATA

OPTIMIZERS = ('sgd', 'rowwise_adagrad')


class DLRMState(NamedTuple):
  """Parameters of the DLRM and the tables' optimizer state.

  Attributes:
    tables: [T, R, D] embedding tables; in the hybrid layout sharded over the
      workers along T (model-parallel), each worker holding T / N tables.
    mlp: the dense part's Flax parameters; replicated (data-parallel).
    accum: [T, R] row-wise Adagrad's sum of each row's mean squared gradient
      (zeros, unused, with SGD); sharded as `tables`.
  """

  tables: jax.Array
  mlp: optax.Params
  accum: jax.Array


Batch = tuple[jax.Array, jax.Array, jax.Array]  # dense_BxF, ids_BxT, labels_B


def init_state(
  model: dlrm.DLRM, rng: jax.Array, *, num_tables: int, rows: int, num_dense: int
) -> DLRMState:
  """Tables uniform in ±1/√R and the MLP's Flax initialisation.

  Args:
    model: the dense part.
    rng: the PRNG key.
    num_tables: T.
    rows: R, rows per table.
    num_dense: F, dense features.

  Returns:
    The `DLRMState` (accumulators zero), on the default device.
  """
  k_tab, k_mlp = jax.random.split(rng)
  tables = dlrm.init_tables(k_tab, num_tables, rows, model.embed_dim)
  dense = jnp.zeros((1, num_dense))
  emb = jnp.zeros((1, num_tables, model.embed_dim))
  accum = jnp.zeros((num_tables, rows), jnp.float32)
  return DLRMState(tables, model.init(k_mlp, dense, emb)['params'], accum)


def logits(model: nn.Module, state: DLRMState, dense_BxF: jax.Array, ids_BxT: jax.Array):
  """The model's click logits on one device (the whole stack of tables).

  Args:
    model: the dense part.
    state: the parameters.
    dense_BxF: [B, F] dense features.
    ids_BxT: [B, T] row ids.

  Returns:
    [B] logits.
  """
  return model.apply({'params': state.mlp}, dense_BxF, dlrm.lookup(state.tables, ids_BxT))


class _Update(NamedTuple):
  optimizer: str
  lr_tables: float
  lr_mlp: float
  eps: float = 1e-8

  def __call__(self, state: DLRMState, g_tables: jax.Array, g_mlp: optax.Params) -> DLRMState:
    mlp = jax.tree.map(lambda p, g: p - self.lr_mlp * g, state.mlp, g_mlp)
    if self.optimizer == 'sgd':
      return DLRMState(state.tables - self.lr_tables * g_tables, mlp, state.accum)
    accum = state.accum + jnp.mean(g_tables**2, axis=-1)
    step = self.lr_tables * g_tables / (jnp.sqrt(accum)[..., None] + self.eps)
    return DLRMState(state.tables - step, mlp, accum)


def _update(optimizer: str, lr_tables: float, lr_mlp: float) -> _Update:
  if optimizer not in OPTIMIZERS:
    raise ValueError(f'optimizer must be one of {OPTIMIZERS}, got {optimizer!r}')
  for name, lr in (('lr_tables', lr_tables), ('lr_mlp', lr_mlp)):
    if not lr > 0:
      raise ValueError(f'{name} must be > 0, got {lr}')
  return _Update(optimizer, lr_tables, lr_mlp)


def make_reference_step(
  model: nn.Module, *, lr_tables: float, lr_mlp: float, optimizer: str = 'sgd'
) -> Callable[[DLRMState, jax.Array, jax.Array, jax.Array], tuple[DLRMState, jax.Array]]:
  """A jitted one-device `(state, dense, ids, labels) -> (state, loss)` on the global batch.

  Args:
    model: the dense part.
    lr_tables: learning rate of the tables.
    lr_mlp: SGD learning rate of the MLP.
    optimizer: of the tables, 'sgd' or 'rowwise_adagrad'.

  Returns:
    The step, as `make_hybrid_step`'s on one device.
  """
  update = _update(optimizer, lr_tables, lr_mlp)

  def step(state, dense, ids, labels):
    def loss_fn(tables, mlp):
      s = DLRMState(tables, mlp, state.accum)
      return optax.sigmoid_binary_cross_entropy(logits(model, s, dense, ids), labels).mean()

    loss, (g_tables, g_mlp) = jax.value_and_grad(loss_fn, (0, 1))(state.tables, state.mlp)
    return update(state, g_tables, g_mlp), loss

  return jax.jit(step)


def shardings(mesh: Mesh) -> tuple[DLRMState, NamedSharding]:
  """(state shardings, batch sharding) of the hybrid layout on `mesh` (axis `data`).

  Args:
    mesh: a 1-D mesh with axis `data`.

  Returns:
    (a `DLRMState` of shardings: tables and accumulators split on their
    first axis, the MLP replicated; the batch's, split on its first axis).
  """
  rows = NamedSharding(mesh, P(DATA))
  return DLRMState(rows, NamedSharding(mesh, P()), rows), rows


def make_hybrid_step(
  model: nn.Module, mesh: Mesh, *, lr_tables: float, lr_mlp: float, optimizer: str = 'sgd'
) -> Callable[[DLRMState, jax.Array, jax.Array, jax.Array], tuple[DLRMState, jax.Array]]:
  """A jitted `(state, dense, ids, labels) -> (state, loss)` in the hybrid layout; donates state.

  Args:
    model: the dense part (`jaxdist.models.dlrm.DLRM`).
    mesh: a 1-D mesh with axis `data`; its N devices are the workers. The
      number of tables and the global batch must be multiples of N.
    lr_tables: SGD learning rate of the embedding tables.
    lr_mlp: SGD learning rate of the MLP.
    optimizer: of the tables, 'sgd' or 'rowwise_adagrad'.

  Returns:
    The step; `state` laid out as `shardings(mesh)` says (the step places it
    so on its first call), the batch split over the workers along its first
    axis. `loss` is the mean over the global batch.
  """

  update = _update(optimizer, lr_tables, lr_mlp)

  def per_worker(tables_LxRxD, mlp, accum_LxR, dense, ids, labels):
    n = lax.axis_size(DATA)

    def loss_fn(tables_LxRxD, mlp):
      emb_BxTxD = dlrm.sharded_lookup(tables_LxRxD, ids, DATA)
      out = model.apply({'params': mlp}, dense, emb_BxTxD)
      return optax.sigmoid_binary_cross_entropy(out, labels).mean()

    loss, (g_tables, g_mlp) = jax.value_and_grad(loss_fn, argnums=(0, 1))(tables_LxRxD, mlp)
    # g_tables sums the N workers' mean losses (the all-to-all's transpose): divide by N
    new = update(DLRMState(tables_LxRxD, mlp, accum_LxR), g_tables / n, lax.pmean(g_mlp, DATA))
    return (*new, lax.pmean(loss, DATA))

  mapped = jax.shard_map(
    per_worker,
    mesh=mesh,
    in_specs=(P(DATA), P(), P(DATA), P(DATA), P(DATA), P(DATA)),
    out_specs=(P(DATA), P(), P(DATA), P()),
    check_vma=False,
  )
  state_sharding, batch_sharding = shardings(mesh)

  def step(state, dense, ids, labels):
    *new, loss = mapped(*state, dense, ids, labels)
    return DLRMState(*new), loss

  return jax.jit(
    step,
    in_shardings=(state_sharding, batch_sharding, batch_sharding, batch_sharding),
    out_shardings=(state_sharding, NamedSharding(mesh, P())),
    donate_argnums=0,
  )


def make_eval(model: nn.Module) -> Callable[[DLRMState, jax.Array, jax.Array], jax.Array]:
  """A jitted `(state, dense, ids) -> click probabilities`.

  Args:
    model: the dense part.

  Returns:
    The function, on one device.
  """
  return jax.jit(lambda state, dense, ids: jax.nn.sigmoid(logits(model, state, dense, ids)))
