"""The base config every experiment builds on, and `:arg` parsing for config files.

Each method and each compressor has a section whose keys ARE the arguments of
its factory (`config.sync.local_sgd.period` is `jd.sync.local_sgd(period=...)`,
`config.compress.dgc.sample_ratio` is `jd.compress.dgc(sample_ratio=...)`);
`config.sync.method` and `config.compress.name` pick the section that runs,
as big_vision picks a model by name. Arguments the trainer supplies itself
(`axis_name`, the local optimizer, gossip's `num_workers`) are not in the
sections. Three kinds of value stand for objects the trainer builds:

- an optimizer argument (`diloco.outer_optimizer`, `od_sgd.local_optimizer`)
  is a dict like `config.optimizer` (name, learning_rate, momentum, ...);
- `averager` names the transform that averages a worker's change since the
  last sync: '' (average the models themselves), 'allreduce',
  'compressed_allreduce' (with `config.compress`), 'quantized_allreduce'
  (with `config.sync.quantized_allreduce`) or 'powersgd';
- `bucketed_allreduce.buckets` is a bucket size in bytes (DDP-style fixed
  buckets in backward order).

The config files that come with jaxdist (the repository's configs/) are
found by name from anywhere, installed or not: `config_path('digits.py')`;
`factory.load_config('digits.py:runlocal')` and the binaries' `--config=`
take the name where no file of that path exists.

Only data here: `jaxdist.train.factory` turns names into objects. `method`
and `compressed` write a variant's overrides for the variants files
(configs/variants/<group>.py, read by `jaxdist.train.compare`).
"""

from __future__ import annotations

from typing import Any

import ml_collections
from ml_collections import config_dict

from jaxdist.train.config_files import config_path, find, parse_arg  # noqa: F401 (public here)


def _int() -> config_dict.FieldReference:
  """An int argument whose default is None that a flag can set (a new reference each time)."""
  return config_dict.placeholder(int)


def optimizer(name: str = 'sgd', learning_rate: float = 0.1, **kw: Any) -> dict[str, Any]:
  """An optimizer section: what `factory.build_optimizer` reads.

  Args:
    name: 'sgd', 'adam' or 'adamw'.
    learning_rate: the peak learning rate.
    **kw: momentum, nesterov, weight_decay, schedule ('constant' or 'cosine',
      with a linear warm-up), warmup_steps, lr_scale, and any other key.

  Returns:
    The section as a dict.
  """
  return dict(
    name=name,  # sgd | adam | adamw
    learning_rate=learning_rate,
    lr_scale=kw.pop('lr_scale', 1.0),  # x learning_rate: a variant's ratio to a config's rate
    momentum=kw.pop('momentum', 0.0),
    nesterov=kw.pop('nesterov', False),
    weight_decay=kw.pop('weight_decay', 0.0),
    schedule=kw.pop('schedule', 'constant'),  # constant | cosine (with linear warm-up)
    warmup_steps=kw.pop('warmup_steps', 0),
    **kw,
  )


def _compressed_allreduce() -> dict[str, Any]:
  """`config.sync.compressed_allreduce` (a function of its own: `sync` stays short)."""
  return dict(
    collective='allgather',  # allgather | allreduce (AR-Top-k, summed payloads) | auto
    error_feedback=True,
    fused=True,  # compress the whole model as one vector
    min_size=0,  # smaller tensors go dense
    leader='star',  # AR-Top-k's leader: star (round-robin) | var (largest norm)
    momentum_correction=0.0,  # DGC (then use momentum 0 in the optimizer)
    nesterov=False,
    warmup_steps=0,  # DGC's sparsity warm-up
    warmup_stages=4,
    ratios='',  # candidate ratios chosen per step by config.adaptive, e.g. '0.1,0.01'
    network='10gbps',  # what 'auto' prices against
    algorithm='ring',
    seed=0,
  )


def _diloco_family(s: ml_collections.ConfigDict) -> None:
  """The sections of DiLoCo and its descendants in `config.sync` (`sync` stays short)."""
  # eager: Kale et al.'s eager updates; exchange: inline | deferred (eager only: on its own thread);
  # by_steps: the outer mean weighted by the inner steps each worker took (with batching='window')
  s.diloco = dict(
    period=4, averager='', eager=False, exchange='inline', by_steps=False,
    outer_optimizer=optimizer('sgd', 0.7, momentum=0.9, nesterov=True),  # schedule: outer steps
  )  # fmt: skip
  # Streaming DiLoCo: `fragments` fragments, each synchronised every `period` steps, staggered
  # by period/fragments; the average arrives `delay` steps later (< period/fragments) and is
  # blended with the local fragment by `alpha` (weight on the local value); layout:
  # sequential | strided (jd.sync.fragment_labels); exchange: inline | deferred (the all-reduce
  # on its own thread beside the next steps, jaxdist.train.overlap; one CPU device a process)
  s.streaming_diloco = dict(
    period=4, fragments=2, delay=1, alpha=0.5, layout='sequential',
    outer_optimizer=optimizer('sgd', 0.7, momentum=0.9, nesterov=True),
    averager='', exchange='inline',
  )  # fmt: skip
  # SparseLoCo (arXiv 2508.15706): DiLoCo with outer SGD on an error-fed pseudo-gradient, Top-k
  # per 64x64 tile (density 0.03125 = 128 of 4,096), 2-bit values, all-gathered. The authors'
  # 512M runs: H 15, outer lr 1, error decay 0.95.
  s.sparseloco = dict(
    period=15,
    density=0.03125,
    bits=2,  # 1, 2, 4 or 8; 32: float32 values, not quantised
    chunk=64,
    error_decay=0.95,
    outer_learning_rate=1.0,
    value_range=6.0,  # the quantiser's range in standard deviations
    average='selected',  # the code's mean over the workers that sent an entry | 'all' (1/N)
  )
  # DeMo (arXiv 2411.19870) is the whole optimizer: config.optimizer's learning-rate schedule
  # is its learning_rate (sign steps: about 1e-3 to 3e-4 where AdamW would take 1e-3).
  s.demo = dict(momentum_decay=0.999, topk=32, chunk=64, sign=True, weight_decay=0.0)


def sync() -> ml_collections.ConfigDict:
  """`config.sync`: the method, and one section of factory arguments per method.

  Returns:
    The section, with its defaults.
  """
  s = ml_collections.ConfigDict()
  s.method = 'allreduce'  # a row of jaxdist.train.methods: the jaxdist.sync factory of that name
  # Gradient averaging (the local optimizer follows).
  s.allreduce = {}
  s.compressed_allreduce = _compressed_allreduce()  # the compressor: config.compress
  # Hierarchical Top-k (HiTopKComm) with the sparsifier of config.compress: the devices are
  # the nodes and a device's simulated workers its local workers (workers=16, devices=2:
  # 2 nodes x 8); the ledger prices its intra-node collectives on config.network.intra.
  s.hitopk_allreduce = dict(error_feedback=True, seed=0)
  s.powersgd = dict(rank=2, start_step=0, error_feedback=True, min_size=0, warm_start=True, seed=0)
  # Block-scaled quantised all-reduce (torchft fp8 / ZeRO++ qgZ): int8 | fp8 | float32 (none),
  # a float32 scale per block_size elements; alltoall (2 roundings) | allgather (1, N/2 x bytes).
  s.quantized_allreduce = dict(format='int8', block_size=256, collective='alltoall')
  s.bucketed_allreduce = dict(buckets=65536, averager='')  # buckets: bytes per bucket
  s.stale_sync = dict(max_delay=2, delays='uniform', read_my_writes=False, p=0.5, seed=0)
  s.ssp = dict(staleness=2, seed=0)
  s.async_sgd = dict(max_delay=4, p=0.5, seed=0)
  # Pipelined backprop's staleness: all-reduce, then every gradient `delay` steps late.
  s.gradient_delay = dict(delay='4')  # an int, or 'stages' (one stage per layer)
  # Kosson et al.'s fixes for gradient_delay: '' or spike_compensation,linear_weight_prediction
  s.compensation = ''
  s.spike_compensation = dict(momentum=0.9)  # carries the momentum (the optimizer's is dropped)
  s.linear_weight_prediction = {}
  # Model averaging (after the local optimizer).
  s.local_sgd = dict(period=4, warmup_steps=0, averager='')
  _diloco_family(s)
  # ring | torus | exponential | one_peer_exponential (SGP's time-varying graph) | complete
  s.gossip = dict(topology='ring', rows=_int())
  s.sma = dict(alpha=0.125, momentum=0.9)
  # Methods that take the local optimizer as their first argument.
  s.selsync = dict(
    threshold=0.3, window=25, alpha=0.01, norm='layer_sum', squared=False, averager=''
  )
  s.tick_tock = dict(waves=2)
  local = optimizer('sgd', 0.05)  # delay-tolerant methods' local optimizer
  s.od_sgd = dict(local_optimizer=local, warmup_steps=20, delay=1, compensation=0.0)
  s.ssd_sgd = dict(local_optimizer=local, k=5, warmup_steps=20, compensation=0.0)
  s.cd_sgd = dict(
    local_optimizer=local,
    k=5,
    threshold=0.05,
    warmup_steps=20,
    delay=1,
    compensation=0.0,
    flush_residual=False,
  )
  # Whole optimizers: config.optimizer gives only the learning-rate schedule; its name and
  # weight decay are not used (weight_decay here).
  s.onebit_adam = dict(warmup_steps=100, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                       bias_correction=True, clip=10.0)  # fmt: skip
  s.zero_one_adam = dict(var_freeze_step=100, var_update_scaler=16, local_step_scaler=100,
                         local_step_clipper=16, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                         bias_correction=True, clip=10.0)  # fmt: skip
  # DGC's local gradient clipping before any gradient-averaging method (0 = off).
  s.local_clip = dict(max_norm=0.0)
  # System form of tick-tock: a device's workers run their passes in turn, rematerialised.
  s.staggered = False
  # How a device's simulated workers compute their gradients (make_train_step's per_worker):
  # 'auto' (loop on the CPU; elsewhere 'mean' where exact, else vmap), 'vmap', 'loop',
  # 'shared' (one copy of the weights for the forward pass: only for the one-model methods,
  # methods.Method.one_model), 'mean' (one backward pass of the device's mean loss: only
  # where the update sees the gradients only through their sum, Method.mean_only) or
  # 'device' ('mean', and one model per device in the train state, the chain run once per
  # device: memory that does not grow with the simulated workers; Method.device 'model';
  # for compressed_allreduce, 'split': each worker's own gradient at its
  # device's model, its residual kept per worker, the optimizer once per device; a run
  # with it resumes only a checkpoint of the same workers, devices and per_worker).
  s.per_worker = 'auto'
  return s


def compress() -> ml_collections.ConfigDict:
  """`config.compress`: the compressor of `compressed_allreduce`, one section each.

  Sparsifiers take exactly one of `ratio` and `k`: to give k, also set ratio
  to None (in a config file or in Python; a flag cannot set None).

  Returns:
    The section, with its defaults.
  """
  c = ml_collections.ConfigDict()
  c.name = 'topk'
  c.identity = {}
  c.topk = dict(ratio=0.01, k=_int(), selection='auto')  # selection: see compress.TopK
  c.mstopk = dict(ratio=0.01, k=_int(), rounds=25)
  c.dgc = dict(
    ratio=0.01, k=_int(), sample_ratio=0.01, min_sample=2048, max_sample=16384, bins_per_k=2
  )
  c.randomk = dict(ratio=0.01, rescale=True)
  c.threshold = dict(ratio=0.01, k=_int(), tau=0.0)
  c.qsgd = dict(levels=127, bucket_size=512)
  c.terngrad = dict(bucket_size=_int())
  c.sign = {}
  c.ef_sign = dict(bucket_size=_int())
  c.onebit = dict(bucket_size=_int())
  c.twobit = dict(threshold=0.5)
  c.cast = dict(dtype='bfloat16', block_size=256)  # dtype: bfloat16, float16, float8_e4m3fn/e5m2
  return c


def cluster() -> ml_collections.ConfigDict:
  """`config.cluster`: the workers the modelled clock pretends to have (`jd.netmodel.Cluster`).

  All empty or zero: equal workers, each step one measured worker step plus
  its communication. Otherwise each worker computes at its own speed and the
  method's waiting rule (BSP waits for the slowest, SSP up to its staleness,
  async never, gossip for its neighbours, local SGD at its syncs) sets the
  time (`jd.netmodel.WorkerClock`); the summary adds the cost.

  Returns:
    The section, with its defaults.
  """
  c = ml_collections.ConfigDict()
  c.speeds = ''  # relative speed per worker, e.g. '1,1,1,0.25'
  c.cores = ''  # or speeds from cores: '9,12,18', or the H-levels 'h2' | 'h10'
  c.straggler_p = 0.0  # probability a worker straggles at a step
  c.straggler_slowdown = 2.0  # its compute time then, times this
  c.seed = 0
  c.phases = ''  # speeds that change, repeated: 'steps:factor,...;steps:factor,...'
  # samples/s into each worker (ScaDLES): numbers, or 'S1'|'S2'|'S10'|'S20' drawn with `seed`
  c.stream_rates = ''
  c.price = 0.0  # per worker-hour
  c.fixed_s = ''  # each worker's seconds a step whatever its batch (its host loop), e.g. '0,0,0.04'
  return c


def network() -> ml_collections.ConfigDict:
  """`config.network`: networks the modelled clock prices each step's communication on.

  Returns:
    The section, with its defaults.
  """
  n = ml_collections.ConfigDict()
  # names ('1gbps'), specs ('20gbps@4ms') or ADOPT's varying network
  # ('adopt_c1@50': 50 steps per phase)
  n.profiles = '1gbps,10gbps'
  n.algorithm = 'ring'  # all-reduce algorithm: ring | tree | ps
  # Where the workers sit on nodes (the devices are the nodes, a device's simulated workers
  # its local workers), collectives inside a node (hitopk_allreduce's, Transfer.link='intra')
  # run over this link; the profiles above are then the inter-node network. Default: 150 GB/s
  # at 5 us, an NVLink-class link (a V100 node's, as in Shi et al.'s cluster and
  # experiments/bench_hitopk.py). Flat collectives span all workers on the profiles.
  n.intra = '1200gbps@5us'
  # the m rails of a node share its NIC (a rail's all-gather gets 1/m of it); False: one each
  n.shared_nic = True
  # The compute term: one worker's step in seconds (e.g. a step timed on the hardware being
  # modelled). 0: measured here, one worker's step on one local device, once per run (with a
  # ratio controller, once per candidate); given, every candidate is charged the same.
  n.compute_s = 0.0
  # Seconds of timed steps for that measurement (the median of at most 20 steps, at least 3);
  # with a ratio controller a quarter of it per candidate. `runlocal` configs spend less.
  n.compute_budget_s = 2.0
  return n


def batching() -> dict[str, Any]:
  """`config.batching`, the per-worker batches, and its controllers' sections.

  Returns:
    The keys to set on the config, with their defaults.
  """
  # Per-worker batches (Tyagi & Sharma 2020): 'uniform', 'static' (∝ config.cluster's speeds) or
  # 'dynamic' (jd.control.dynamic_batching on the modelled times), weighted b_k / G (allreduce).
  # Each worker holds b_max (default: the global batch) and trains on its first b_k: all b_max
  # computed, masked, or with micro_batch=m > 0 only the ⌈b_k / m⌉ micro-batches holding them.
  # 'stream': ScaDLES's stream-proportional batches (config.cluster.stream_rates, config.streams),
  # weighted b_k / Σb, the lr scaled by Σb / B; with stream rates, 'uniform' waits for B / K.
  # 'window' (sync.diloco): B / K on the inner steps of a round that fit a worker's window, else 0.
  return dict(
    batching='uniform',
    dynamic_batching=dict(
      b_min=1, b_max=_int(), deadband=0.05, decay=0.5, interval=10, micro_batch=0
    ),
    # ScaDLES's buffers and bounds (jd.control.streams; b_max 0: B); realtime: waits in wall-clock
    streams=dict(b_min=8, b_max=_int(), buffer='truncation', interval_s=1.0, realtime=False),
  )


def partition() -> dict[str, Any]:
  """`config.partition`: which examples each worker trains on (`jd.data.Partition`).

  `kind`: 'iid' (slices of one shuffled global batch), 'seldp' (SelSync's
  rotation: every worker reads the whole dataset, from its own chunk on) or
  'labels' (non-IID: each worker holds labels_per_worker labels), with
  randomised data injection: a fraction inject_alpha of the workers shares
  inject_beta of its batch with every other worker each step (bytes counted).

  Returns:
    The section as a dict, with its defaults.
  """
  return dict(kind='iid', labels_per_worker=1, inject_alpha=0.0, inject_beta=0.0)


def adaptive() -> dict[str, Any]:
  """`config.adaptive`, the controller that picks the compression ratio, and its sections.

  Adaptive compression (jaxdist.control.ratio): 'gravac' (Tyagi & Swany, CLOUD
  2023), 'scadles' (ScaDLES's compress-or-not rule) or 'adopt' (ADOPT) choose
  compressed_allreduce's candidate ratio (or dense; ADOPT also the collective)
  each step from the workers' measured compression gains; 'none' keeps it fixed.

  Returns:
    The keys to set on the config, with their defaults.
  """
  return dict(
    adaptive='none',
    gravac=dict(
      epsilon=0.7, omega=0.01, window=500, policy='exponential', theta_min=10.0,
      theta_max=1000.0, decay=0.9,
    ),
    scadles_compression=dict(delta=0.3, decay=0.9),
    # 'adopt' (Tyagi & Swany, BigData 2023): ratios from sync.compressed_allreduce.ratios
    # (default jd.control.ADOPT_CANDIDATES), collective='auto', on the first network profile
    adopt=dict(
      warmup_steps=20, explore_steps=10, gain_threshold=0.1, window=5, smoothing=0.01,
      weights='0.6,0.4', seed=1,
    ),
  )  # fmt: skip


def fault() -> ml_collections.ConfigDict:
  """`config.fault`: fault injection (`jaxdist.faults.inject`).

  kill_at_step: send `signal` to this process after this step is logged (0 =
  never). signal: 'SIGKILL' (a crash: the steps since the last checkpoint are
  lost), 'SIGTERM' (a scheduler's preemption) or 'SIGINT' (Ctrl-C): the run
  saves a checkpoint at the step it reached and ends. straggle:
  'worker:factor@start-end', comma-separated: the worker computes factor x
  slower on steps start+1..end (the modelled clock; each method's waiting
  rule decides who waits). drop: 'worker@start[-end]': the worker takes no
  part in steps start+1..end (for good without an end); the weighted
  all-reduce averages over the others (needs sync.method=allreduce).

  Returns:
    The section, with its defaults.
  """
  return ml_collections.ConfigDict(
    {'kill_at_step': 0, 'signal': 'SIGKILL', 'straggle': '', 'drop': ''}
  )


# --- override helpers for the variants files (configs/variants/<group>.py) ---------------


def method(name: str, **args: Any) -> dict[str, Any]:
  """A variant's overrides: sync method `name`, with `args` set in its section.

  Args:
    name: the method (`config.sync.method`).
    **args: keys of its section.

  Returns:
    The overrides, a nested dict.
  """
  return {'sync': {'method': name, name: args}} if args else {'sync': {'method': name}}


def compressed(name: str, collective: str = 'allgather', **args: Any) -> dict[str, Any]:
  """A variant's overrides: `compressed_allreduce` with compressor `name`(**args).

  Args:
    name: the compressor (`config.compress.name`).
    collective: `compressed_allreduce`'s collective.
    **args: keys of the compressor's section.

  Returns:
    The overrides, a nested dict.
  """
  return {
    'sync': {'method': 'compressed_allreduce', 'compressed_allreduce': {'collective': collective}},
    'compress': {'name': name, name: args},
  }


ADOPT_RATIOS = (0.1, 0.0333, 0.0111, 0.0037, 0.0012)  # jd.control.ADOPT_CANDIDATES


def base() -> ml_collections.ConfigDict:
  """Every option with its default; experiment configs override what they need.

  Returns:
    The config.
  """
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = 'digits'  # 'synthetic', or any tfds image dataset as array_record
  config.dataset.data_dir = ''  # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
  config.dataset.download = False
  config.dataset.train_split = 'train'
  config.dataset.test_split = 'test'
  # used when name == 'synthetic' (class prototypes plus noise: jaxdist.data.synthetic)
  config.dataset.image_shape = '32,32,3'
  config.dataset.num_classes = 10
  config.dataset.train_size = 2048
  config.dataset.test_size = 512
  # A language model's text (name 'shakespeare', bundled, or any tfds text dataset as
  # array_record): context > 0 cuts it into windows of that many tokens (jaxdist.data.sequences)
  config.dataset.context = 0  # 0: an image dataset
  config.dataset.level = 'char'  # char | byte: the tokens
  config.dataset.text_key = ''  # the text feature ('': 'text', or the only string feature)

  config.model = ml_collections.ConfigDict()
  config.model.name = 'cnn'  # mlp | cnn | resnet20 | gpt
  config.model.hidden = ''  # the MLP's hidden widths, e.g. '2048,1024' ('': its default)
  config.model.size = 'tiny'  # the GPT's: mini | tiny | small (jaxdist.models.transformer.SIZES)

  config.workers = 8  # data-parallel workers in all
  config.devices = 0  # devices they run on; 0 = as many as divide `workers`
  config.batch_size = 128  # global: each worker takes batch_size // workers
  config.steps = 400

  config.optimizer = ml_collections.ConfigDict(
    optimizer('sgd', 0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, schedule='cosine')
  )
  config.optimizer.warmup_steps = 20

  config.sync = sync()
  config.compress = compress()
  config.network = network()
  config.cluster = cluster()
  config.update(batching())
  config.partition = partition()
  config.update(adaptive())

  # Scavenger's gradient-noise indicator γ = mean_k ‖g_k‖² / ‖ḡ‖², measured every
  # noise_every steps (0: never) beside training, off the clock, EWMA with noise_decay.
  config.noise_every = 10
  config.noise_decay = 0.9
  config.eval_every = 20
  config.eval_batch_size = 1024
  config.eval_examples = 0  # evaluate on the test split's first N examples (0: all of them)
  config.checkpoint_every = 100
  config.keep_checkpoints = 2
  config.progress = True
  config.init_from = ''  # warm start from this run's checkpoint (jaxdist.train.warm_start)
  config.init_step = 0  # which of its checkpoints (0: the latest)

  config.fault = fault()
  return config


def names(text: str) -> list[str]:
  """The items of a comma-separated config string.

  Args:
    text: e.g. '1gbps, 10gbps'.

  Returns:
    The items, stripped, empty ones dropped.
  """
  return [t.strip() for t in text.split(',') if t.strip()]


def numbers(text: str, where: str) -> tuple[float, ...]:
  """The numbers of a comma-separated config string; errors name `config.<where>`.

  Args:
    text: e.g. '0.6,0.4'.
    where: the key, for the error.

  Returns:
    The numbers, as floats.

  Raises:
    ValueError: if an item is not a number.
  """
  try:
    return tuple(float(v) for v in names(str(text)))
  except ValueError:
    raise ValueError(f'config.{where} must be comma-separated numbers, got {text!r}') from None
