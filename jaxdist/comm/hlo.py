"""What a compiled program really sends: the collectives of an HLO module.

`collectives(jitted.lower(*args).compile().as_text())` lists every
collective with the dtypes and bytes of its operands, so a transform's own
accounting (`Transfer.nbytes`) can be checked against what XLA will run.
"""

from __future__ import annotations

import dataclasses
import math
import re

from jaxdist.comm.collectives import KINDS

_ITEMSIZE = {
  'pred': 1, 's4': 1, 'u4': 1, 's8': 1, 'u8': 1, 'f8e4m3fn': 1, 'f8e5m2': 1, 'f8e4m3': 1,
  'f8e4m3b11fnuz': 1, 'f8e4m3fnuz': 1, 'f8e5m2fnuz': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2,
  's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16,
}  # fmt: skip
_DEF = re.compile(
  r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|[\w]+\[[\d,]*\](?:\{[^}]*\})?)\s+([\w\-]+)\((.*)$'
)
_ARRAY = re.compile(r'(\w+)\[([\d,]*)\]')
_COMMENT = re.compile(r'/\*.*?\*/')
_COMPUTATION = re.compile(r'^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$')
_BRANCHES = re.compile(
  r'(?:branch_computations=\{([^}]*)\}|true_computation=%?([\w.\-]+).*?false_computation=%?([\w.\-]+))'
)


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective instruction of an HLO module.

  Attributes:
    kind: `all-reduce`, `all-gather`, `all-to-all` or `collective-permute`.
    dtypes: dtype of each operand, e.g. ('f32',) or ('f32', 's32').
    nbytes: bytes of all operands together (what each participant sends in).
    computation: the HLO computation it sits in (e.g. a conditional's branch).
  """

  kind: str
  dtypes: tuple[str, ...]
  nbytes: int
  computation: str = ''


def _arrays(type_text: str) -> list[tuple[str, int]]:
  return [
    (dtype, _ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(',') if d))
    for dtype, dims in _ARRAY.findall(type_text)
  ]


def _operands(rest: str) -> list[str]:
  """The comma-separated operands before the closing parenthesis, split at depth 0."""
  out, depth, current = [], 0, ''
  for ch in rest:
    if ch in '([{':
      depth += 1
    elif ch in ')]}':
      if depth == 0:
        break
      depth -= 1
    if ch == ',' and depth == 0:
      out.append(current.strip())
      current = ''
    else:
      current += ch
  out.append(current.strip())
  return [o for o in out if o]


def collectives(hlo_text: str) -> list[Collective]:
  """Collectives of a compiled (optimised) HLO module, in program order.

  Asynchronous pairs (`all-reduce-start` / `-done`) count once, at the start.

  Args:
    hlo_text: the module's text, e.g. `jitted.lower(*args).compile().as_text()`.

  Returns:
    A list of `Collective`s, one per collective instruction.
  """
  types: dict[str, str] = {}
  found = []
  computation = ''
  for line in hlo_text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{'):
      head = _COMPUTATION.match(line)
      computation = head.group(1) if head else computation
    m = _DEF.match(line)
    if not m:
      continue
    name, type_text, op, rest = m.groups()
    types[name] = type_text
    kind = op.removesuffix('-start')
    if kind not in KINDS or op.endswith('-done'):
      continue
    arrays = []
    for operand in _operands(rest):
      operand = _COMMENT.sub('', operand).strip()  # XLA prints `/*index=5*/%x` past five
      inline = _arrays(operand)  # some dumps print `f32[3] %x`
      if inline:
        arrays += inline
      elif operand:
        arrays += _arrays(types.get(operand.lstrip('%'), ''))
    found.append(
      Collective(kind, tuple(d for d, _ in arrays), sum(b for _, b in arrays), computation)
    )
  return found


def conditional_branches(hlo_text: str) -> set[str]:
  """Names of the computations that are branches of a `conditional`, and what they call.

  Args:
    hlo_text: the module's text, as for `collectives`.

  Returns:
    The set of computation names: every branch of every conditional, and
    every computation they call, transitively.
  """
  branches: set[str] = set()
  for line in hlo_text.splitlines():
    if ' conditional(' not in line:
      continue
    for listed, true_b, false_b in _BRANCHES.findall(line):
      names = [n.strip().lstrip('%') for n in listed.split(',')] if listed else [true_b, false_b]
      branches.update(n for n in names if n)
  # collectives may sit in computations a branch calls (e.g. fused or wrapped ops)
  calls = re.compile(r'(?:to_apply|calls)=%?([\w.\-]+)')
  body: dict[str, set[str]] = {}
  current = ''
  for line in hlo_text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{'):
      head = _COMPUTATION.match(line)
      current = head.group(1) if head else current
    body.setdefault(current, set()).update(calls.findall(line))
  frontier = list(branches)
  while frontier:
    for callee in body.get(frontier.pop(), ()):
      if callee not in branches:
        branches.add(callee)
        frontier.append(callee)
  return branches
