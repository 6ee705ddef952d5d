"""Config -> the host controller that chooses compressed_allreduce's ratio (`config.adaptive`).

The controllers are `jaxdist.control.ratio`'s.
"""

from __future__ import annotations

import numpy as np

from jaxdist import control
from jaxdist.control.gravac import ratios as kept_fractions
from jaxdist.train import config as config_lib
from jaxdist.train.factory.sections import call

CONTROLLERS = ('none', 'gravac', 'scadles', 'adopt')


def ratios(config, compressor_ratio: float | None) -> tuple[float, ...]:
  """The candidate ratios `compressed_allreduce` compiles for `config.adaptive` (() if none)."""
  kind = config.adaptive
  if kind not in CONTROLLERS:
    raise ValueError(f'config.adaptive must be one of {CONTROLLERS}, got {kind!r}')
  where = 'sync.compressed_allreduce.ratios'
  given = config_lib.numbers(config.sync.compressed_allreduce.ratios, where)
  if kind == 'none':
    if given:
      raise ValueError(
        'config.sync.compressed_allreduce.ratios are chosen per step by a controller: set '
        "config.adaptive ('gravac', 'scadles' or 'adopt') or leave the ratios empty"
      )
    return given
  if config.sync.method != 'compressed_allreduce':
    raise ValueError(
      f'config.adaptive={kind!r} chooses the ratio of sync.method=compressed_allreduce, '
      f'got {config.sync.method!r}'
    )
  if kind == 'gravac':
    g = config.gravac
    try:
      factors = control.candidate_factors(g.theta_min, g.theta_max, g.policy)
    except ValueError as e:
      raise ValueError(f'config.gravac: {e}') from e
    out = kept_fractions(factors)
    if given and given != out:
      raise ValueError(
        f'config.adaptive=gravac compiles the ratios of its factors {factors}: leave '
        f'config.sync.compressed_allreduce.ratios empty, got {given}'
      )
    return out
  if kind == 'adopt':
    return _adopt_ratios(config, given)
  if compressor_ratio is None and not given:
    raise ValueError(
      "config.adaptive='scadles' needs a ratio: the compressor's, or "
      'config.sync.compressed_allreduce.ratios'
    )
  if len(given) > 1:
    raise ValueError(
      f"config.adaptive='scadles' compresses at one ratio or sends dense: give one ratio in "
      f'config.sync.compressed_allreduce.ratios, got {given}'
    )
  return given or (float(compressor_ratio),)


def _adopt_ratios(config, given: tuple[float, ...]) -> tuple[float, ...]:
  """ADOPT's candidates (the module's `ADOPT_CANDIDATES` unless given), checked."""
  if config.compress.name != 'topk':
    raise ValueError(
      f"config.adaptive='adopt' prices and measures Top-k: set config.compress.name='topk', "
      f'got {config.compress.name!r}'
    )
  if config.sync.compressed_allreduce.collective != 'auto':
    raise ValueError(
      "config.adaptive='adopt' chooses the collective too: set "
      "config.sync.compressed_allreduce.collective='auto', got "
      f'{config.sync.compressed_allreduce.collective!r}'
    )
  out = given or control.ADOPT_CANDIDATES
  if len(out) < 4 or np.any(np.diff(out) >= 0) or not 0 < out[-1] <= out[0] < 1:
    raise ValueError(
      "config.adaptive='adopt' needs at least four candidate ratios in (0, 1), strictly "
      f'decreasing, in config.sync.compressed_allreduce.ratios; got {out}'
    )
  return tuple(out)


def compiled(config) -> tuple[float, ...]:
  """The candidate ratios compressed_allreduce compiles for `config.adaptive` (() if none)."""
  return ratios(config, config.compress[config.compress.name].get('ratio'))


def build(config, num_workers: int, networks, num_params: int = 0) -> control.Controller | None:
  """The controller `config.adaptive` names (None for 'none')."""
  kind = config.adaptive
  if kind == 'none':
    return None
  candidates = compiled(config)
  if kind == 'gravac':
    if not 0.0 <= config.gravac.decay < 1.0:
      raise ValueError(f'config.gravac: decay must be in [0, 1), got {config.gravac.decay}')
    if not networks:
      raise ValueError(
        "config.adaptive='gravac' times each factor on the modelled clock: give "
        'config.network.profiles (e.g. 1gbps)'
      )
    network = next(iter(networks))
    return call(
      control.gravac_control, 'gravac', config.gravac, ratios=candidates,
      num_workers=num_workers, network=network, samples=config.batch_size,
    )  # fmt: skip
  if kind == 'adopt':
    if not networks:
      raise ValueError(
        "config.adaptive='adopt' prices each ratio on the network in force: give "
        'config.network.profiles (e.g. adopt_c1@50, its varying network)'
      )
    section = dict(config.adopt)
    section['weights'] = config_lib.numbers(section['weights'], 'adopt.weights')
    return call(
      control.adopt_control, 'adopt', section, ratios=candidates, num_workers=num_workers,
      network=next(iter(networks.values())), num_params=num_params,
      algorithms=(config.network.algorithm,), leader=config.sync.compressed_allreduce.leader,
    )  # fmt: skip
  return call(
    control.scadles_control, 'scadles_compression', config.scadles_compression,
    ratios=candidates, num_workers=num_workers,
  )  # fmt: skip
