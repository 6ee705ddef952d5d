"""What the code around an optax chain reads from its state, as the states' classes declare it.

The training step knows no particular transform: a state class says what it
holds for others by class attributes (plain assignments, not fields):

- `PROBES = ('norms', 'gains')`: fields the train step reports as metrics
  (`metrics`; `jd.sync.compressed_allreduce`'s per-worker gain ingredients).
- `TRAINED = 'weights'`: the field holding the weights being trained, where
  the chain hands the model others (`trained_params`;
  `jd.sync.linear_weight_prediction`).
- `SYNCED_MODEL = ('anchor', 'just_synced')`: the fields holding the
  synchronised model and whether the last update synchronised
  (`apply_updates`; `local_sgd`, `diloco`, `selsync`; `streaming_diloco`'s
  flag is a tree, one per leaf).

Applying updates so that the workers that synchronised hold one model,
bitwise: a model-synchronising transform moves worker n from its model w_n
to the synchronised model m with the update u_n = m − w_n, but w_n + (m − w_n)
is not always m in floating point: after `optax.apply_updates` the workers'
models differ from m, and from each other, by a rounding (up to an ulp of
max(|w_n|, |m|) in some of the elements). No choice of u_n avoids it: where
|m| is much smaller than |w_n| (workers of opposite signs), w_n + u_n lies
on the coarser grid of w_n's magnitude, which may not hold m. So these
transforms keep m in their state with a flag saying whether the last update
synchronised, and `apply_updates` puts m in.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax


def declaring(tree: Any, attribute: str) -> list[Any]:
  """The states in `tree` whose class declares `attribute`, in tree order.

  Args:
    tree: an optimizer state (any pytree of states).
    attribute: the class attribute, e.g. 'PROBES' or 'TRAINED'.

  Returns:
    A list of the states (nodes of `tree`) whose class sets `attribute`.
  """
  declares = lambda x: getattr(type(x), attribute, None) is not None
  return [s for s in jax.tree.leaves(tree, is_leaf=declares) if declares(s)]


def metrics(opt_state: Any) -> dict[str, jax.Array]:
  """The fields the last state in `opt_state` declaring `PROBES` names, by name ({} if none).

  Args:
    opt_state: the chain's state.

  Returns:
    A dict from field name to that field's value.
  """
  found = declaring(opt_state, 'PROBES')
  return {name: getattr(found[-1], name) for name in found[-1].PROBES} if found else {}


def trained_params(params: optax.Params, opt_state: Any) -> optax.Params:
  """The weights being trained: the last `TRAINED` field in `opt_state`, else `params`.

  Args:
    params: the model's parameters.
    opt_state: the chain's state.

  Returns:
    The weights the gradients should be taken at.
  """
  found = declaring(opt_state, 'TRAINED')
  return getattr(found[-1], found[-1].TRAINED) if found else params


def apply_updates(params: optax.Params, updates: optax.Updates, opt_state: Any) -> optax.Params:
  """`optax.apply_updates`, with the synchronised model itself after a synchronisation.

  Where the chain whose state is `opt_state` holds a model-synchronising
  transform (`local_sgd`, `diloco`, `selsync`) and its last update
  synchronised, the new parameters are its synchronised model, bitwise the
  same on every worker; otherwise they are `optax.apply_updates(params,
  updates)`. With plain `optax.apply_updates` the workers' models differ
  from the synchronised one by the rounding of w + (m − w) (see the module
  docstring); use this function in a loop of your own. The library's loops
  (`jd.train`, `jd.testing.Run`) do.

  The synchronising transform must be the last in the chain, its documented
  place: the updates of a transform after it are not applied on the steps
  that synchronise. Wrappers of the whole chain (`accumulate`,
  `skip_nonfinite`, `optax.MultiSteps`) may keep the state of a step that
  synchronised over steps they skip; those steps' updates are zero and the
  workers hold that model already, so it is put in again unchanged. A
  transform that holds only some of the parameters (under `optax.masked` or
  `optax.multi_transform`, e.g. a period per parameter group) puts its model
  into those alone, after its own synchronisations.

  Args:
    params: the parameters before the step.
    updates: the chain's updates of this step.
    opt_state: the chain's state after this step (the one its `update`
      returned with `updates`).

  Returns:
    The new parameters, with the structure and dtypes of `params`.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jaxdist import sync
    >>> tx = optax.chain(optax.sgd(1.0), sync.local_sgd(1, axis_name='i'))
    >>> def step(w):
    ...   updates, state = tx.update(jnp.zeros(()), tx.init(w), w)
    ...   return optax.apply_updates(w, updates), sync.apply_updates(w, updates, state)
    >>> plain, exact = jax.vmap(step, axis_name='i')(jnp.array([0.2, -0.1]))
    >>> plain.tolist()  # w + (m - w): the mean m, float32's 0.05, rounded two ways
    [0.04999999701976776, 0.05000000447034836]
    >>> exact.tolist()
    [0.05000000074505806, 0.05000000074505806]
  """
  new = optax.apply_updates(params, updates)
  for state in declaring(opt_state, 'SYNCED_MODEL'):
    new = _put_in(new, state)
  return new


def _put_in(new: optax.Params, state: Any) -> optax.Params:
  """`new`, with `state`'s synchronised model in the leaves it holds if its last update synced.

  The flag is one boolean for the whole model, or a tree of booleans with the
  model's structure, one per leaf, where a step synchronises only some leaves
  (`streaming_diloco`'s fragments).
  """
  model, flag = (getattr(state, name) for name in state.SYNCED_MODEL)
  held = lambda a: not isinstance(a, optax.MaskedNode)
  synced = jax.tree.map(lambda n, a: jnp.asarray(a).astype(n.dtype) if held(a) else n, new, model)
  if jax.tree_util.treedef_is_leaf(jax.tree.structure(flag)):
    return lax.cond(flag, lambda: synced, lambda: new)
  masked = lambda x: isinstance(x, optax.MaskedNode)
  pick = lambda f, s, n: n if masked(f) else jnp.where(f, s, n)
  return jax.tree.map(pick, flag, synced, new, is_leaf=masked)
