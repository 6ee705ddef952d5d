"""ResNet-20 on CIFAR-10 with 8 data-parallel workers (for users who have CIFAR-10 prepared).

  tfds build cifar10 --file_format=array_record     # once, needs TensorFlow + internet
  python experiments/train.py --config=configs/cifar10_resnet20.py --workdir=/tmp/c10 \
      --config.sync.method=local_sgd --config.sync.period=8

Variants: `runlocal` trains a few steps on synthetic data of CIFAR-10's shapes
(32x32x3, 10 classes), so it runs anywhere (CI, Colab) without the dataset.
Hyper-parameters follow He et al. (2016): SGD momentum 0.9, lr 0.1 at batch
128 (scaled linearly here), weight decay 1e-4, 160 epochs.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = 'cifar10'
  config.dataset.data_dir = ''
  config.dataset.download = False
  config.dataset.train_split = 'train'
  config.dataset.test_split = 'test'
  # used when name == 'synthetic'
  config.dataset.image_shape = '32,32,3'
  config.dataset.num_classes = 10
  config.dataset.train_size = 2048
  config.dataset.test_size = 512

  config.model = ml_collections.ConfigDict()
  config.model.name = 'resnet20'

  config.workers = 8
  config.devices = 0
  config.batch_size = 256  # global: 32 per worker
  config.steps = 31_250  # 160 epochs of 50,000 images

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = 'sgd'
  config.optimizer.learning_rate = 0.2  # 0.1 per 128 examples
  config.optimizer.momentum = 0.9
  config.optimizer.nesterov = False
  config.optimizer.weight_decay = 1e-4
  config.optimizer.schedule = 'cosine'
  config.optimizer.warmup_steps = 500

  config.sync = ml_collections.ConfigDict()
  # allreduce | compressed | local_sgd | diloco | selsync | ssp | async | delayed | gossip | sma
  config.sync.method = 'allreduce'
  # less synchronisation (see jaxdist.sync): local_sgd, diloco
  config.sync.period = 4  # local steps between averages / DiLoCo's inner steps H
  config.sync.local_warmup = 0  # post-local SGD: average every step for this many steps
  config.sync.outer_lr = 0.7  # DiLoCo's outer Nesterov SGD
  config.sync.outer_momentum = 0.9
  config.sync.outer_nesterov = True
  # selsync
  config.sync.threshold = 0.3  # delta
  config.sync.window = 25
  config.sync.ewma_alpha = 0.01
  config.sync.norm = 'layer_sum'  # layer_sum (the authors' code) | global
  config.sync.squared = False
  # ssp / async / delayed
  config.sync.staleness = 2  # bound s (async: the largest delay)
  config.sync.delay_p = 0.5  # async: geometric delays
  config.sync.delay_seed = 0
  # gossip
  config.sync.topology = 'ring'  # ring | torus | exponential | complete
  config.sync.torus_rows = 0  # 0 = sqrt(workers)
  # sma (Crossbow)
  config.sync.sma_alpha = 0.125
  config.sync.sma_momentum = 0.9
  # local_sgd / diloco / selsync: synchronise through the compressor below
  config.sync.compress_sync = False
  # compressed: the compressor and collective (see jaxdist.sync.compressed_allreduce)
  # compressed: compressor and collective (see jaxdist.sync.compressed_allreduce)
  config.sync.compressor = 'topk'  # topk mstopk dgc randomk threshold qsgd terngrad
  #                                  sign ef_sign onebit powersgd cast identity
  config.sync.ratio = 0.01  # kept fraction (sparsifiers)
  config.sync.tau = 0.0  # threshold
  config.sync.levels = 127  # qsgd (127 = 8 bits)
  config.sync.bucket_size = 512  # qsgd
  config.sync.rank = 2  # powersgd
  config.sync.dtype = 'bfloat16'  # cast
  config.sync.collective = 'allgather'  # allgather | allreduce (AR-Top-k) | auto
  config.sync.auto_network = '10gbps'  # what `auto` prices against
  config.sync.leader = 'star'  # AR-Top-k leader: star | var
  config.sync.error_feedback = True
  config.sync.fused = True  # compress the whole model as one vector
  config.sync.min_size = 0  # smaller tensors are all-reduced dense
  config.sync.momentum_correction = 0.0  # DGC (then use momentum 0 in the optimizer)
  config.sync.nesterov = False
  config.sync.warmup_steps = 0  # DGC sparsity warm-up
  config.sync.clip = 0.0  # DGC local gradient clipping (max global norm; 0 = off)

  # Modelled communication time (alpha-beta) on these networks, logged per step.
  config.network = ml_collections.ConfigDict()
  # names ('1gbps'), specs ('20gbps@4ms') or ADOPT's varying network ('adopt_c1@50':
  # 50 steps per phase)
  config.network.profiles = '1gbps,10gbps'
  config.network.algorithm = 'ring'  # all-reduce algorithm: ring | tree | ps

  config.eval_every = 1000
  config.eval_batch_size = 1000
  config.checkpoint_every = 2000
  config.keep_checkpoints = 2
  config.progress = True

  config.fault = ml_collections.ConfigDict()
  config.fault.kill_at_step = 0

  # Named variants for experiments/compare.py: overrides of the fields above.
  # `compare` lists the ones it trains (the default `make run`).
  compressed = dict(method='compressed', error_feedback=True)
  config.variants = ml_collections.ConfigDict(
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
    }
  )
  config.compare = 'dense,topk1_ef,artopk1,powersgd2'

  if arg == 'runlocal':
    config.dataset.name = 'synthetic'
    config.batch_size = 64
    config.steps = 6
    config.eval_every = 3
    config.checkpoint_every = 3
    config.optimizer.warmup_steps = 1
    config.optimizer.learning_rate = 0.05
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of configs/cifar10_resnet20.py; choose 'runlocal' or none"
    )
  return config
