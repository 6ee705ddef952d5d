"""The columns of the tables a run prints and writes, each explained once.

A run's tables are of two kinds. A *per-run* table has one figure per run:
its final accuracy, totals over its steps, the time it took to a target. A
*per-step* table has means over the run's steps, in units per step. No
table mixes the two. `legend` prints under a table the meaning of each of
its columns, from the list below; the binaries' `--help` ends with the list.
`A` stands for an accuracy, `N` for a number of steps and `NET` for the name
of a network profile (`config.network.profiles`, e.g. `1gbps`).

Per run:

- `variant`: the variant's name in its variants file; it trains in `<workdir>/<variant>`.
- `sync`: the synchronisation method, `config.sync.method` (a `jd.sync` transform).
- `workers`: the data-parallel workers K (`N → M at step S`: a run of N
  workers that went on from its checkpoint at step S on M, `elastic.py`).
- `steps`: the run's training steps.
- `test acc`: the test accuracy of the worker-averaged model after the last step.
- `vs first (pp)`: `test acc` less the first variant's, in percentage points.
- `time to A @NET`: modelled seconds on network `NET` until the test accuracy
  first reached A, the first variant's final test accuracy, and the step at
  which it did (the test set is evaluated every `config.eval_every` steps);
  `not reached` if it never did.
- `N steps @NET (s)`: modelled seconds of the run's N steps on network
  `NET`: each step's compute (`worker step s`, or each worker's on a
  heterogeneous cluster, `config.cluster`) and its α-β communication time.
- `cost @NET`: the price of those seconds: K × hours × `config.cluster.price`.
- `test loss`: the test loss (cross-entropy) of that model.
- `val loss`: a language model's validation loss (cross-entropy per token,
  in nats) of the worker-averaged model after the last step.
- `bits/char`: that loss in bits (÷ ln 2) per token: per character at
  character level, per byte at byte level.
- `vs first (%)`: `val loss` less the first variant's, as a percentage of
  the first variant's.
- `time to L @NET`: modelled seconds on network `NET` until the validation
  loss first fell to L, the first variant's final validation loss, and the
  step at which it did (evaluated every `config.eval_every` steps); `not
  reached` if it never did.
- `train loss (last step)`: the training loss of the last step's batches.
- `Δ vs uninterrupted (pp)`: `test acc` less that of the run that never
  stopped, in percentage points.
- `test acc range after the resume step (pp)`: the highest less the lowest
  test accuracy of the run's evaluations after the resume step, in
  percentage points: the noise a `Δ vs uninterrupted` sits in.
- `samples/s`: training examples per second of wall-clock time, all workers
  together, as measured on this machine (the compiling first step,
  evaluations and checkpoints left out).
- `sent B/worker`: bytes one worker sent over the whole run (the sum of
  `sent B/worker/step` over its steps).
- `γ/K`: Scavenger's gradient noise γ = E[mean_k ‖g_k‖²] / E[‖ḡ‖²] over the
  K workers' gradients g_k and their mean ḡ (smoothed over the run), divided
  by K: 1/K when the workers' gradients agree, 1 when they are orthogonal
  (when noise dominates them; `jd.control.scavenger`).
- `peak buffer (samples)`: streamed data (ScaDLES): the most samples that
  waited in the workers' buffers together at any step.
- `compressed steps`: an adaptive-compression controller's fraction of steps
  that compressed (the rest sent the dense gradient).

Per step (means over the run's steps):

- `synced`: the fraction of steps whose collectives carried the model's data
  (gradients or parameters): 100% for synchronous methods, 1/H for local SGD
  averaging every H steps.
- `payload B/worker/step`: bytes of the collectives' operands one worker
  contributes (e.g. a Top-k's values and their indices), before an
  algorithm moves them.
- `sent B/worker/step`: bytes one worker puts on the network for that
  payload with bandwidth-optimal algorithms: 2(K − 1)/K of it for a ring
  all-reduce, (K − 1) times it for an all-gather (`jd.netmodel.sent_bytes`).
- `peak sent B/worker/step`: the most bytes one worker sent in any one
  step: what a link must carry at once (Streaming DiLoCo spreads DiLoCo's
  peak over its fragments).
- `injected B/worker/step`: data injection: bytes each worker received.
- `step s, all workers`: the median measured wall-clock seconds of one step
  of all K workers on this machine (simulated workers share its devices).
- `worker step s`: one worker's measured seconds of a step without
  communication: the compute term of the modelled clock, which adds each
  step's α-β communication time on each network (`jd.netmodel`).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from typing import NamedTuple

WIDTH = 100  # of a legend's lines


class Column(NamedTuple):
  """A table's column.

  Attributes:
    key: the rows' key of its values.
    heading: its heading.
    name: its entry in this module's list, if not `heading` (a heading with a
      value in it, e.g. 'time to 0.9861 @1gbps', is 'time to A @NET').
  """

  key: str
  heading: str
  name: str = ''

  @property
  def entry(self) -> str:
    """The column's entry in this module's list: `name`, else `heading`."""
    return self.name or self.heading


def meanings() -> dict[str, str]:
  """Every column's meaning by its name, from this module's docstring.

  Returns:
    A dict from name to meaning ({} with docstrings stripped).
  """
  items = re.findall(r'^- `([^`]+)`: (.*?)(?=^- `|^\S|\Z)', __doc__ or '', re.M | re.S)
  return {name: ' '.join(text.split()) for name, text in items}


def legend(columns: Iterable[Column]) -> str:
  """The meaning of each of `columns`, one line each (one per name, in their order).

  Args:
    columns: the table's columns.

  Returns:
    The legend, wrapped and indented ('' with docstrings stripped).

  Raises:
    KeyError: a column whose name this module does not explain.
  """
  known = meanings()
  if not known:  # docstrings stripped (python -OO)
    return ''
  names = list(dict.fromkeys(c.entry for c in columns))
  missing = [n for n in names if n not in known]
  if missing:
    raise KeyError(f'columns with no meaning in jaxdist.train.columns: {missing}')
  return '\n'.join(
    textwrap.fill(f'{name}: {known[name]}', WIDTH, initial_indent='  ', subsequent_indent='    ')
    for name in names
  )


def help_text() -> str:
  """Every column and its meaning: what the binaries' `--help` ends with.

  Returns:
    The text.
  """
  return 'Columns of the tables:\n\n' + legend(Column('', n) for n in meanings())
