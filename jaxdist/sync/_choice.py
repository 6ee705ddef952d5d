"""Which exchange `compressed_allreduce` runs each step: the pieces that choose, and the switch.

A `Choice` holds the compressors the transform may send with (its stages,
one compressor state each), how a step's stage is found, and the
collectives each stage may cross with. Its exchanges are every (stage,
collective) pair, stage-major, then, when the caller steers, the dense
all-reduce (`exchanges`: the order of the transform's `wire`). The pieces:

- `fixed(c)`: one compressor, no switch.
- `warmup(c, steps, stages)`: DGC's sparsity warm-up, the stage from the step.
- `candidates(c, ratios)`: the compressor at each ratio, the stage given by
  the caller each step (extra argument `candidate`; out of range: dense).
- `per_collective(choice, collectives, network, algorithm)`: the collective
  of each stage: the only one, the cheapest under the α-β model, or (with
  candidates) the one the extra argument `via` names.

`switch` compiles the exchanges a step may run as the branches of one
`lax.switch` on an index every worker agrees on, so only the chosen
exchange's collectives run, and the compressor states and error-feedback
memory carry across changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist import comm, compress, netmodel
from jaxdist.compress.base import Compressor
from jaxdist.sync._exchange import DENSE, Exchange

Stage = Callable[[jax.Array, Mapping[str, Any]], jax.Array]  # (count, extra arguments) -> index
Price = Callable[[Sequence[comm.Transfer], int], float]  # (transfers, workers) -> seconds


class Choice(NamedTuple):
  """Which exchange runs each step (static; the index it computes is traced).

  Attributes:
    stages: the compressors sent with; the state keeps each one's state.
    stage: (count, extra arguments) -> this step's stage, traced and equal
      on every worker; None: always the first stage, no switch.
    steered: the caller gives the stage (`candidate`); a dense all-reduce
      follows the stages, for any index out of range.
    collectives: the collectives each stage may cross with.
    price: with several collectives, the α-β model's time of an exchange's
      transfers; each stage runs its cheapest (or, steered, `via`'s).
  """

  stages: tuple[Compressor, ...]
  stage: Stage | None = None
  steered: bool = False
  collectives: tuple[str, ...] = ()
  price: Price | None = None


def fixed(c: Compressor) -> Choice:
  """Always `c`."""
  return Choice((c,))


def warmup(c: Compressor, steps: int, stages: int) -> Choice:
  """DGC's sparsity warm-up: the ratio ramps to `c`'s over `steps` steps, in `stages` stages.

  The stages keep `compress.warmup_ratios(c.ratio, stages)`, each for
  `steps // stages` steps (at least 1), the last (`c`'s ratio) from then on.
  Without steps, `fixed(c)`.
  """
  if steps < 0 or stages < 1:
    raise ValueError(f'warmup_steps must be >= 0 and warmup_stages >= 1, got {steps}, {stages}')
  if not steps:
    return fixed(c)
  if not hasattr(c, 'ratio') or c.ratio is None:
    raise ValueError(f'sparsity warm-up needs a compressor with a ratio, got {c!r}')
  ratios = compress.warmup_ratios(c.ratio, stages)
  per_stage = max(1, steps // stages)
  return Choice(
    tuple(dataclasses.replace(c, ratio=r) for r in ratios),
    stage=lambda count, extra: jnp.minimum(count // per_stage, stages),
  )


def candidates(c: Compressor, ratios: Sequence[float]) -> Choice:
  """`c` at each of `ratios` (checked), the index given each step as `candidate`; then dense."""
  if not hasattr(c, 'ratio'):
    raise ValueError(f'ratios needs a compressor with a ratio, got {c!r}')
  for r in ratios:
    if not 0.0 < r <= 1.0:
      raise ValueError(f'ratios must all be in (0, 1], got {tuple(ratios)}')
  if len(set(ratios)) != len(ratios):
    raise ValueError(f'ratios must be distinct, got {tuple(ratios)}')
  fixed_k = {'k': None} if hasattr(c, 'k') else {}
  return Choice(
    tuple(dataclasses.replace(c, ratio=float(r), **fixed_k) for r in ratios),
    stage=lambda count, extra: jnp.asarray(extra['candidate'], jnp.int32),
    steered=True,
  )


def per_collective(
  choice: Choice, collectives: Sequence[str], network: netmodel.Network, algorithm: str
) -> Choice:
  """`choice` with each stage crossing with one of `collectives`.

  With one, that one. With several, each stage takes the one whose transfers
  the α-β model (`network`, `algorithm`) prices lowest for that stage's
  ratio, the first of equals; a steered choice compiles every pair and the
  extra argument `via` (an index into `collectives`) may name another.
  """
  price = lambda ts, n: netmodel.comm_time(ts, n, network, algorithm, counts=[1] * len(ts))
  return choice._replace(collectives=tuple(collectives), price=price)


def exchanges(choice: Choice) -> tuple[Exchange, ...]:
  """Every exchange `choice` may run: (stage, collective) pairs stage-major, then dense."""
  pairs = tuple(Exchange(c, col) for c in choice.stages for col in choice.collectives)
  return pairs + ((DENSE,) if choice.steered else ())


def cheapest(choice: Choice, wire: Sequence[Sequence[comm.Transfer]], n: int) -> list[int]:
  """Per stage, the index of its collective that costs least with `n` workers.

  `wire`: each exchange's transfers, in `exchanges` order.
  """
  ways = len(choice.collectives)
  if ways == 1:
    return [0] * len(choice.stages)
  cost = lambda s: lambda w: choice.price(wire[s * ways + w], n)
  return [min(range(ways), key=cost(s)) for s in range(len(choice.stages))]


def switch(choice: Choice, wire, n: int, count, extra, axis_name, run, operands):
  """Runs the exchange this step's index names; its results and each transfer's count.

  `run(exchange, wanted, compressor_states)` performs one exchange (see
  `_exchange.run`); `operands` are (wanted, every stage's compressor
  states); `wire` is each exchange's transfers and `extra` the extra
  arguments. Returns (mean, kept back, Σ‖sent‖², mask, compressor states,
  int32 counts of the flattened `wire`: 1 for the transfers that ran).
  """
  stages, ways = len(choice.stages), len(choice.collectives)
  chosen = cheapest(choice, wire, n)
  by_via = choice.steered and ways > 1  # every pair compiled; `via` may pick the collective
  pairs = [(s, w) for s in range(stages) for w in range(ways)] if by_via else enumerate(chosen)
  branches = [_branch(choice, s * ways + w, s, wire, run) for s, w in pairs]
  if choice.steered:
    branches.append(_branch(choice, stages * ways, None, wire, run))
  if choice.stage is None:
    return branches[0](*operands)
  index = choice.stage(count, extra)
  if by_via:
    cheap = jnp.asarray(chosen, jnp.int32)
    way = cheap[jnp.clip(index, 0, stages - 1)] if extra['via'] is None else extra['via']
    way = jnp.clip(jnp.asarray(way, jnp.int32), 0, ways - 1)
    index = jnp.where(
      (index < 0) | (index >= stages), len(branches) - 1, index * ways + way
    )  # out of range: dense
  elif choice.steered:
    index = jnp.where((index < 0) | (index > stages), stages, index)  # else dense
  return lax.switch(comm.agree(index, axis_name), branches, *operands)


def _branch(choice: Choice, i: int, s: int | None, wire, run):
  """Exchange `i` (of stage `s`; None: dense) as a branch of the switch."""
  exchange = exchanges(choice)[i]

  def branch(wanted, cstates):
    own = None if s is None else cstates[s]
    mean, rest, sent_sq, mask, new = run(exchange, wanted, own)
    if s is not None:
      cstates = tuple(new if j == s else cs for j, cs in enumerate(cstates))
    counts = [int(j == i) for j, ts in enumerate(wire) for _ in ts]
    return mean, rest, sent_sq, mask, cstates, jnp.asarray(counts, jnp.int32)

  return branch
