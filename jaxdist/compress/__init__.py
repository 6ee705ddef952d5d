"""Pure gradient compressors: encode / decode / exact wire size; no communication.

c = jd.compress.topk(ratio=0.01)     # also mstopk, dgc, randomk, threshold,
                                     # qsgd, terngrad, sign, ef_sign, onebit,
                                     # twobit, cast, identity

`PowerSGD` (`powersgd`) holds the pure maths of `jaxdist.sync.powersgd`;
`bernoulli` is the stochastic quantisers' coin (Philox bits, see its docstring).
"""

from __future__ import annotations

from jaxdist.compress.base import (
  RNG_BITS,
  Compressor,
  bernoulli,
  bits_for,
  buckets,
  check_ratio,
  num_kept,
  pack_bits,
  unpack_bits,
)
from jaxdist.compress.lowrank import PowerSGD, orthogonalize
from jaxdist.compress.quantize import (
  QSGD,
  Cast,
  EFSign,
  Identity,
  OneBit,
  Sign,
  TernGrad,
  TwoBit,
  with_rng_bits,
)
from jaxdist.compress.sparsify import DGC, MSTopK, RandomK, Threshold, TopK, scatter, take

identity = Identity
topk = TopK
mstopk = MSTopK
dgc = DGC
randomk = RandomK
threshold = Threshold
qsgd = QSGD
terngrad = TernGrad
sign = Sign
ef_sign = EFSign
onebit = OneBit
cast = Cast
powersgd = PowerSGD
twobit = TwoBit


def _subclasses(cls: type[Compressor]) -> list[type[Compressor]]:
  return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


# name -> class, for configs and flags: every public compressor of this package, by
# its `name`; these are what `compressed_allreduce` takes. PowerSGD is not one: its
# all-reduces sit inside its power iteration, so it is the transform
# `jaxdist.sync.powersgd` (`PowerSGD` here is its pure maths).
REGISTRY: dict[str, type[Compressor]] = {
  c.name: c for c in _subclasses(Compressor) if not c.__name__.startswith('_')
}


def warmup_ratios(final_ratio: float, stages: int) -> list[float]:
  """DGC's exponential sparsity warm-up: stage e keeps final_ratio**((e+1)/(stages+1)).

  With final 0.001 and 4 stages: 0.25, 0.063, 0.016, 0.004, then 0.001 — the
  75% -> 99.9% sparsity ramp of Lin et al. (2018).

  Args:
    final_ratio: the ratio kept after the warm-up, in (0, 1].
    stages: how many warm-up stages (>= 1).

  Returns:
    The stages' ratios followed by `final_ratio`: stages + 1 floats.
  """
  check_ratio(final_ratio)
  if stages < 1:
    raise ValueError(f'stages must be >= 1, got {stages}')
  return [final_ratio ** ((e + 1) / (stages + 1)) for e in range(stages)] + [final_ratio]


__all__ = [
  'DGC',
  'QSGD',
  'REGISTRY',
  'RNG_BITS',
  'Cast',
  'Compressor',
  'EFSign',
  'Identity',
  'MSTopK',
  'OneBit',
  'PowerSGD',
  'RandomK',
  'Sign',
  'TernGrad',
  'Threshold',
  'TopK',
  'TwoBit',
  'bernoulli',
  'bits_for',
  'buckets',
  'cast',
  'check_ratio',
  'dgc',
  'ef_sign',
  'identity',
  'mstopk',
  'num_kept',
  'onebit',
  'orthogonalize',
  'pack_bits',
  'powersgd',
  'qsgd',
  'randomk',
  'scatter',
  'sign',
  'take',
  'terngrad',
  'threshold',
  'topk',
  'twobit',
  'unpack_bits',
  'warmup_ratios',
  'with_rng_bits',
]
