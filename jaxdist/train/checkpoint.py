"""Orbax checkpoints of the whole training state, written atomically.

Orbax writes each checkpoint into a temporary directory and renames it when
complete, so a process killed mid-write leaves the previous checkpoint as the
latest one. Saved with the state: a JSON record of the data position (the
step: batches are a pure function of seed and step) and of the run (`meta`),
and the host controllers' states (`control`, JSON: `jd.control.host.to_tree`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

DIRECTORY = 'checkpoints'  # a run's checkpoints: <workdir>/checkpoints


class Checkpointer:
  """Saves and restores (state, metadata) under `directory`.

  Args:
    directory: the checkpoints' directory (created if missing).
    keep: how many checkpoints to keep (the oldest go).
  """

  def __init__(self, directory: str, *, keep: int):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=('state', 'meta', 'control')
    )
    self.saved_step: int | None = None  # the step this object last saved

  def latest_step(self) -> int | None:
    """The step of the latest checkpoint.

    Returns:
      The step, or None where there is none.
    """
    return self._manager.latest_step()

  def save(
    self, step: int, state: Any, meta: dict[str, Any], control: dict[str, Any] | None = None
  ) -> None:
    """Starts writing checkpoint `step`; device buffers are copied before it returns.

    Args:
      step: the checkpoint's step.
      state: the train state (a pytree of arrays).
      meta: JSON metadata (the config, the data position, ...).
      control: the host controllers' states, as JSON ({} if None).
    """
    self.saved_step = step
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave(meta),
        control=ocp.args.JsonSave(control or {}),
      ),
      force=True,
    )

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """State (with the shardings of `abstract_state`) and metadata of `step`.

    Args:
      step: the checkpoint's step.
      abstract_state: the restore target (`abstract`).

    Returns:
      (the state, the metadata dict).
    """
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
      ),
    )
    return restored['state'], restored['meta']

  def wait(self) -> None:
    """Blocks until every checkpoint started is written."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def abstract(tree: Any, shardings: Any) -> Any:
  """`ShapeDtypeStruct`s of `tree` carrying `shardings` (a restore target).

  Args:
    tree: arrays or shape structs.
    shardings: a sharding per leaf of `tree`.

  Returns:
    `tree` as `jax.ShapeDtypeStruct`s.
  """
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def read(directory: str, step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
  """A checkpoint as plain NumPy, whatever devices or processes wrote it.

  Args:
    directory: the `checkpoints` directory of a run.
    step: which checkpoint (default the latest).

  Returns:
    (state as nested dicts of np.ndarray with a leading worker axis, metadata).
  """
  if step is None:
    step = latest_step(directory)
    if step is None:
      raise FileNotFoundError(f'no checkpoint in {directory}')
  path = os.path.join(os.path.abspath(directory), str(step))
  reader = ocp.PyTreeCheckpointer()
  tree = reader.metadata(os.path.join(path, 'state')).item_metadata.tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  state = reader.restore(
    os.path.join(path, 'state'), args=ocp.args.PyTreeRestore(restore_args=restore_args)
  )
  return state, read_meta(directory, step)


def latest_step(directory: str) -> int | None:
  """The step of the latest complete checkpoint in `directory`, or None; writes nothing.

  Args:
    directory: the checkpoints' directory (it may not exist).

  Returns:
    The step, or None.
  """
  found = steps(directory)
  return found[-1] if found else None


def steps(directory: str) -> list[int]:
  """The steps of the complete checkpoints in `directory`, ascending; writes nothing.

  Args:
    directory: the checkpoints' directory (it may not exist).

  Returns:
    The steps (none: []).
  """
  if not os.path.isdir(directory):
    return []
  # the names `Checkpointer`'s manager gives, uncommitted ones ignored
  return sorted(m.step for m in ocp.path.step.standard_name_format().find_all(directory))


def read_meta(directory: str, step: int) -> dict[str, Any]:
  """The metadata (JSON) of checkpoint `step` in `directory`, without its state.

  Args:
    directory: the checkpoints' directory.
    step: the checkpoint's step.

  Returns:
    The metadata dict.
  """
  with open(os.path.join(os.path.abspath(directory), str(step), 'meta', 'metadata')) as f:
    return json.load(f)


CONTROLLERS = ('batching', 'adaptive', 'noise')  # the control item's entries


def read_control(directory: str, step: int) -> dict[str, Any]:
  """The host controllers' states saved with checkpoint `step` (`Checkpointer.save`'s control).

  A checkpoint written before the control item kept them in its metadata,
  the ratio controller's without its `inner` level: read from there.

  Args:
    directory: the checkpoints' directory.
    step: the checkpoint's step.

  Returns:
    The states as JSON, by controller name.
  """
  path = os.path.join(os.path.abspath(directory), str(step), 'control', 'metadata')
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  meta = read_meta(directory, step)
  out = {k: meta[k] for k in CONTROLLERS if meta.get(k)}
  if 'adaptive' in out:
    a = out['adaptive']
    inner = (
      {'gravac': a['gravac'], 'ewma': a.get('ewma')} if 'gravac' in a
      else a['adopt'] if 'adopt' in a else {'sums': a.get('sums')}
    )  # fmt: skip
    if 'gravac' in a and 'ewma' not in a and a.get('sums'):  # an EWMA of every candidate's
      g, sums = a['gravac'], a['sums']  # ‖C_r(w)‖², then ‖w‖²: θ_min's and θ_c's carry on
      inner['ewma'] = [sums[g['min_index']], sums[g['cand_index']], sums[-1]]
    out['adaptive'] = {'index': a['index'], 'compressed': a['compressed'], 'steps': a['steps'],
                       'inner': inner}  # fmt: skip
  return out
