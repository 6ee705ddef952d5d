"""Heterogeneous workers: Tyagi & Sharma 2020's H-levels, uniform against dynamic batches
(`make results`: experiments/results/heterogeneous.md)."""

from typing import Any

SETTINGS = {'workers': 3, 'batch_size': 96}


def hetero(cores: str, batching: str) -> dict[str, Any]:
  """Workers with `cores` (`config.cluster.cores`), batches by `batching`."""
  return {
    'cluster': {'cores': cores},
    'batching': batching,
    'dynamic_batching': {'b_max': 64},
  }


VARIANTS = {
  'uniform_h2': hetero('h2', 'uniform'),
  'dynamic_h2': hetero('h2', 'dynamic'),
  'uniform_h10': hetero('h10', 'uniform'),
  'dynamic_h10': hetero('h10', 'dynamic'),
}
