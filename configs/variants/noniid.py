"""Non-IID data, one label per worker, and randomised data injection (`make results`:
experiments/results/noniid.md)."""

from typing import Any

SETTINGS = {'workers': 10, 'batch_size': 160}


def partition(kind: str, alpha: float = 0.0, beta: float = 0.0, **sync: Any) -> dict[str, Any]:
  """Data partition `kind` (`config.partition`), injection alpha/beta, `sync` overrides."""
  out = {'partition': {'kind': kind, 'inject_alpha': alpha, 'inject_beta': beta}}
  return {**out, 'sync': sync} if sync else out


VARIANTS = {
  'iid': partition('iid'),
  'seldp': partition('seldp'),
  'labels1': partition('labels'),
  'labels1_inject10': partition('labels', 0.1, 0.1),
  'labels1_inject50': partition('labels', 0.5, 0.5),
  'selsync_labels1_inject50': partition(
    'labels', 0.5, 0.5, method='selsync', selsync={'threshold': 0.3}
  ),
  'selsync005_labels1_inject50': partition(
    'labels', 0.5, 0.5, method='selsync', selsync={'threshold': 0.05}
  ),
}
