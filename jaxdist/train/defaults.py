"""Defaults of the sync and network options every experiment config shares.

Configs take them whole (`config.sync = defaults.sync()`) and override what
they need; every option is listed and explained here once. Only data: the
trainer turns these names into transforms (`jaxdist.train.trainer`).
"""

from __future__ import annotations

import ml_collections


def sync() -> ml_collections.ConfigDict:
  """How workers synchronise: `sync.method` and the options of each method."""
  sync = ml_collections.ConfigDict()
  # allreduce | compressed | local_sgd | diloco | selsync | ssp | async | delayed | gossip | sma
  sync.method = 'allreduce'
  # less synchronisation (see jaxdist.sync): local_sgd, diloco
  sync.period = 4  # local steps between averages / DiLoCo's inner steps H
  sync.local_warmup = 0  # post-local SGD: average every step for this many steps
  sync.outer_lr = 0.7  # DiLoCo's outer Nesterov SGD
  sync.outer_momentum = 0.9
  sync.outer_nesterov = True
  # selsync
  sync.threshold = 0.3  # delta
  sync.window = 25
  sync.ewma_alpha = 0.01
  sync.norm = 'layer_sum'  # layer_sum (the authors' code) | global
  sync.squared = False
  # ssp / async / delayed
  sync.staleness = 2  # bound s (async: the largest delay)
  sync.delay_p = 0.5  # async: geometric delays
  sync.delay_seed = 0
  # gossip
  sync.topology = 'ring'  # ring | torus | exponential | complete
  sync.torus_rows = 0  # 0 = sqrt(workers)
  # sma (Crossbow)
  sync.sma_alpha = 0.125
  sync.sma_momentum = 0.9
  # delay-tolerant: od_sgd | ssd_sgd | cd_sgd (the optimizer above is the global one)
  sync.local_lr = 0.05  # the workers' local optimizer (SGD)
  sync.local_momentum = 0.0
  sync.delay = 1  # OD/CD-SGD: 1 step, or 0 = synchronous
  sync.delay_warmup = 20  # synchronous steps first (the authors' code: 200 / 500 / 1000)
  sync.k = 5  # SSD-SGD: take the global model every k steps; CD-SGD: dense every k
  sync.compensation = 0.0  # DC-ASGD lambda of the local update (SSD-SGD's GLU: 0.04)
  sync.twobit_threshold = 0.05  # CD-SGD's 2-bit quantiser (the authors: 0.5 on larger grads)
  # delayed_gradients (pipelined backprop's staleness): BSP + gradients D steps late
  sync.pipeline_delay = '4'  # an int, or 'stages' (one stage per layer)
  sync.pipeline_fix = 'none'  # none | sc | lwp | sc+lwp
  sync.pipeline_momentum = 0.9  # momentum of spike compensation
  # tick_tock (Wavelet): waves of workers, alternating updates
  sync.waves = 2
  sync.staggered = False  # system form: a device's waves run one after the other, rematerialised
  # bucketed: dense (or compressed) all-reduce per fixed-size bucket
  sync.bucket_bytes = 65536
  # local_sgd / diloco / selsync / bucketed: synchronise through the compressor below
  sync.compress_sync = False
  # compressed: the compressor and collective (see jaxdist.sync.compressed_allreduce)
  # compressed: compressor and collective (see jaxdist.sync.compressed_allreduce)
  sync.compressor = 'topk'  # topk mstopk dgc randomk threshold qsgd terngrad
  #                                  sign ef_sign onebit powersgd cast identity
  sync.ratio = 0.01  # kept fraction (sparsifiers)
  sync.tau = 0.0  # threshold
  sync.levels = 127  # qsgd (127 = 8 bits)
  sync.bucket_size = 512  # qsgd
  sync.rank = 2  # powersgd
  sync.dtype = 'bfloat16'  # cast
  sync.collective = 'allgather'  # allgather | allreduce (AR-Top-k) | auto
  sync.auto_network = '10gbps'  # what `auto` prices against
  sync.leader = 'star'  # AR-Top-k leader: star | var
  sync.error_feedback = True
  sync.fused = True  # compress the whole model as one vector
  sync.min_size = 0  # smaller tensors are all-reduced dense
  sync.momentum_correction = 0.0  # DGC (then use momentum 0 in the optimizer)
  sync.nesterov = False
  sync.warmup_steps = 0  # DGC sparsity warm-up
  sync.clip = 0.0  # DGC local gradient clipping (max global norm; 0 = off)
  return sync


def network() -> ml_collections.ConfigDict:
  """Networks the modelled clock prices each step's communication on."""
  # Modelled communication time (alpha-beta) on these networks, logged per step.
  network = ml_collections.ConfigDict()
  # names ('1gbps'), specs ('20gbps@4ms') or ADOPT's varying network ('adopt_c1@50':
  # 50 steps per phase)
  network.profiles = '1gbps,10gbps'
  network.algorithm = 'ring'  # all-reduce algorithm: ring | tree | ps
  return network


def variants() -> ml_collections.ConfigDict:
  """Named overrides for `experiments/compare.py`: one per method studied."""
  # Named variants for experiments/compare.py: overrides of the fields above.
  # `compare` lists the ones it trains (the default `make run`).
  compressed = dict(method='compressed', error_feedback=True)
  slow = {'learning_rate': 0.05, 'nesterov': False}

  def delayed(delay, fix):
    return {'method': 'delayed_gradients', 'pipeline_delay': str(delay), 'pipeline_fix': fix}

  variants = ml_collections.ConfigDict(
    {
      'dense': {'sync': {'method': 'allreduce'}},
      'topk1_ef': {'sync': dict(compressed, compressor='topk', ratio=0.01, collective='allgather')},
      'artopk1': {'sync': dict(compressed, compressor='topk', ratio=0.01, collective='allreduce')},
      'powersgd2': {
        'sync': dict(compressed, compressor='powersgd', rank=2, collective='allreduce')
      },
      'qsgd8': {'sync': dict(compressed, compressor='qsgd', levels=127, collective='allgather')},
      'topk1_noef': {'sync': dict(compressed, compressor='topk', ratio=0.01, error_feedback=False)},
      # less synchronisation
      'bsp': {'sync': {'method': 'allreduce'}},
      'local4': {'sync': {'method': 'local_sgd', 'period': 4}},
      'local16': {'sync': {'method': 'local_sgd', 'period': 16}},
      'diloco8': {'sync': {'method': 'diloco', 'period': 8}},
      'selsync': {'sync': {'method': 'selsync', 'threshold': 0.3}},
      'selsync01': {'sync': {'method': 'selsync', 'threshold': 0.1}},
      'ssp2': {'sync': {'method': 'ssp', 'staleness': 2}},
      'async4': {'sync': {'method': 'async', 'staleness': 4}},
      'gossip_ring': {'sync': {'method': 'gossip', 'topology': 'ring'}},
      'sma': {'sync': {'method': 'sma'}},
      # delay-tolerant training and scheduling
      'od_sgd': {'sync': {'method': 'od_sgd'}},
      'ssd_sgd': {'sync': {'method': 'ssd_sgd', 'k': 5, 'compensation': 0.04}},
      'cd_sgd': {'sync': {'method': 'cd_sgd', 'k': 5}},
      # delayed gradients (pipeline staleness) at a learning rate they survive
      'bsp_lr05': {'optimizer': slow},
      'delay2': {'optimizer': slow, 'sync': delayed(2, 'none')},
      'delay2_sc': {'optimizer': slow, 'sync': delayed(2, 'sc')},
      'delay4': {'optimizer': slow, 'sync': delayed(4, 'none')},
      'delay4_sc': {'optimizer': slow, 'sync': delayed(4, 'sc')},
      'delay4_lwp': {'optimizer': slow, 'sync': delayed(4, 'lwp')},
      'delay4_sc_lwp': {'optimizer': slow, 'sync': delayed(4, 'sc+lwp')},
      'tick_tock': {'sync': {'method': 'tick_tock', 'waves': 2}},
      'bucketed': {'sync': {'method': 'bucketed', 'bucket_bytes': 65536}},
    }
  )
  return variants
