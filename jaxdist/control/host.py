"""The host controllers' interface: optax's shape, on the host, between steps.

A `Controller` is three pure functions over a state it owns:

- `init() -> state`;
- `plan(state, t) -> Plan`: what step t (0-based) runs with, decided before
  it runs: per-worker batches, a learning-rate scale, the chain's extra
  arguments (a candidate ratio, a collective), whether to keep or go back
  to a copy of the train state;
- `observe(state, record) -> (state, fields)`: the step's `Record` (the plan
  that ran, its logged fields and the metrics fetched from the device), and
  the fields the controller adds to the step's log.

`chain(**controllers)` runs several as one, each under its name. A state is
a NamedTuple of numbers and NumPy arrays (nested NamedTuples allowed), so
the trainer checkpoints every controller's state generically, as one item.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np


class Plan(NamedTuple):
  """What the host decides before a step runs; None / empty / False: nothing to change.

  Attributes:
    batches: [K] examples drawn per worker (None: the uniform batch).
    counts: [K] examples each worker trains on (0: dropped).
    lr_scale: the step's learning rate is the schedule's × this.
    tx_args: the chain's extra arguments, one value per worker.
    snapshot: keep a copy of the train state before the step.
    restore: go back to the copy before the step.
    exploring: the coming steps will be undone: evaluations and saves wait.
    needs_last: this controller's next plan reads this step's record.
  """

  batches: np.ndarray | None = None
  counts: np.ndarray | None = None
  lr_scale: float | None = None
  tx_args: Mapping[str, np.ndarray] = {}
  snapshot: bool = False
  restore: bool = False
  exploring: bool = False
  needs_last: bool = False


class Record(NamedTuple):
  """A step as a controller observes it.

  Attributes:
    step: 1-based, as the log numbers them.
    plan: the plan the step ran.
    fields: its log record so far (loss, modelled times, ...).
    fetched: the step's metrics fetched from the device.
  """

  step: int
  plan: Plan
  fields: Mapping[str, Any]
  fetched: Mapping[str, Any]


class Controller(NamedTuple):
  """A host controller: pure functions over a state it owns (see the module docstring).

  Attributes:
    init: `() -> state`.
    plan: `(state, t) -> Plan`, what step t (0-based) runs with.
    observe: `(state, record) -> (state, fields)`, the fields added to the step's log.
    summary: `state -> dict`, what the controller adds to the run's summary.
  """

  init: Callable[[], Any]
  plan: Callable[[Any, int], Plan]
  observe: Callable[[Any, Record], tuple[Any, dict[str, Any]]]
  summary: Callable[[Any], dict[str, Any]] = lambda state: {}


_MERGED = ('batches', 'counts', 'lr_scale', 'tx_args')
_ANY = ('snapshot', 'restore', 'exploring', 'needs_last')


def _given(value: Any) -> bool:
  return value is not None and not (isinstance(value, Mapping) and not value)


def merge(plans: Mapping[str, Plan]) -> Plan:
  """One plan from several: a value set by two controllers is a ValueError.

  Args:
    plans: each controller's plan, by its name.

  Returns:
    A `Plan` with each value the one controller that set it gave, and each
    flag true if any plan sets it.

  Raises:
    ValueError: if two controllers set the same value.
  """
  out: dict[str, Any] = {}
  for field in _MERGED:
    setters = [name for name, p in plans.items() if _given(getattr(p, field))]
    if len(setters) > 1:
      raise ValueError(f'plan.{field} is set by more than one controller: {setters}')
    if setters:
      out[field] = getattr(plans[setters[0]], field)
  for field in _ANY:
    out[field] = any(getattr(p, field) for p in plans.values())
  return Plan(**out)


def chain(**controllers: Controller) -> Controller:
  """The controllers as one: states by name, plans merged, fields of all.

  Args:
    **controllers: the controllers, each under the name its state is kept by.

  Returns:
    A `Controller` whose state is a dict of theirs, whose plan is their plans
    `merge`d, and whose fields and summary are all of theirs.

  Example:
  >>> count = Controller(lambda: 0, lambda s, t: Plan(), lambda s, r: (s + 1, {'seen': s + 1}))
  >>> both = chain(a=count, b=count._replace(plan=lambda s, t: Plan(lr_scale=2.0)))
  >>> state = both.init()
  >>> both.plan(state, 0).lr_scale
  2.0
  >>> state, fields = both.observe(state, Record(1, Plan(), {}, {}))
  >>> state, fields
  ({'a': 1, 'b': 1}, {'seen': 1})
  """

  def init() -> dict[str, Any]:
    return {name: c.init() for name, c in controllers.items()}

  def plan(state: Mapping[str, Any], t: int) -> Plan:
    return merge({name: c.plan(state[name], t) for name, c in controllers.items()})

  def observe(state: Mapping[str, Any], record: Record) -> tuple[dict[str, Any], dict[str, Any]]:
    new, fields = {}, {}
    for name, c in controllers.items():
      new[name], more = c.observe(state[name], record)
      fields.update(more)
    return new, fields

  def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, c in controllers.items():
      out.update(c.summary(state[name]))
    return out

  return Controller(init, plan, observe, summary)


def to_tree(state: Any) -> Any:
  """A controller state as JSON-ready values: NamedTuples as dicts, arrays as lists, NaN None.

  Args:
    state: a controller's state (NamedTuples, mappings, arrays, numbers).

  Returns:
    The same values as dicts, lists and Python numbers.
  """
  if isinstance(state, tuple) and hasattr(state, '_fields'):
    return {k: to_tree(v) for k, v in state._asdict().items()}
  if isinstance(state, Mapping):
    return {k: to_tree(v) for k, v in state.items()}
  if isinstance(state, np.ndarray | np.generic):
    return to_tree(state.tolist())
  if isinstance(state, list | tuple):
    return [to_tree(v) for v in state]
  if isinstance(state, float) and np.isnan(state):
    return None
  return state


def from_tree(template: Any, tree: Any) -> Any:
  """`to_tree`'s inverse, shaped by `template` (a state of the same controller, e.g. `init()`).

  Fields missing from `tree` keep the template's value (a state saved before a
  field was added).

  Args:
    template: a state of the controller, giving the types and dtypes.
    tree: what `to_tree` gave (e.g. read back from JSON).

  Returns:
    A state of the template's types.
  """
  if isinstance(template, tuple) and hasattr(template, '_fields'):
    return type(template)(*(
      from_tree(v, tree[k]) if k in tree else v for k, v in template._asdict().items()
    ))  # fmt: skip
  if isinstance(template, Mapping):
    return {k: from_tree(v, tree[k]) if k in tree else v for k, v in template.items()}
  if isinstance(template, np.ndarray):
    if tree is None:  # saved before anything was seen
      return np.full_like(template, np.nan)
    values = np.asarray([np.nan if v is None else v for v in np.ravel(np.asarray(tree, object))])
    return values.astype(template.dtype).reshape(np.shape(tree))
  if isinstance(template, float):
    return float('nan') if tree is None else float(tree)
  if isinstance(template, tuple):  # a plain tuple of numbers (NaN saved as None)
    return tuple(float('nan') if v is None else v for v in tree)
  return type(template)(tree) if template is not None and tree is not None else tree
