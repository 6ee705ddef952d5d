r"""Training over real, rate-limited links: measured step times beside the modelled clock.

For each number of hosts K (`--hosts`) and each link rate (`--rates`, Mbit/s
or 'unlimited'), `netns.Hosts` makes K network namespaces on a bridge with
every link limited by a token bucket; one training process runs in each
(`experiments/train.py --coordinator_address=... --num_processes=K`, the
config's workers spread over them: workers/K CPU devices each), so every
collective between hosts crosses a real, slow link (gloo over TCP). Each
variant of `--variants` (`--only` picks some) trains `--steps` steps; the
run's own modelled clock prices the same steps on the link's rate
(`config.network.profiles` set to it, with `--latency_us`). Everything is
torn down on exit, on error and on Ctrl-C.

Per run: the measured median seconds of a step (process 0's wall clock, the
first `--skip` steps and those that evaluate left out). The hosts share this machine's cores, so a
step's compute here is all workers' compute on them, not one worker's as on
a cluster; the comparison is therefore of communication: the measured
communication of a step is its mean minus the same variant's mean at
unlimited rate (the compute, and what the link adds at full speed; means: a
periodic method communicates on few steps), against
the run's modelled communication (`comm_s@` the link's nominal rate, and on
the link α and β fitted across the hosts with the runs' layout,
`calibrate_link.py`). Where the two differ by more than 15 %, a note under
the table says why, from the run's own figures: the difference is within
the steps' noise, or it is spread over the step's collectives beside what
one collective's α costs. The time to `--target` accuracy (default: the
first variant's final one on that link) is measured, divided by the fastest
dense variant's on that link (per-leaf or bucketed all-reduce: the baseline a
user would pick), and modelled as that many steps of the unlimited run's
compute plus their modelled communication. 'unlimited' must be among the rates for
the communication columns.

With `--torch_python` (a Python with torch and scikit-learn), the peers'
PyTorch DDP (`../shared/peers/torch_ddp_digits.py`, `--peers_dir`) trains
the same work over the same links after jaxdist's runs, its ranks spread
over the hosts as jaxdist's workers are (`ddp_hosts.py`): dense, PowerSGD
rank 2 and local SGD, each beside jaxdist's variant of that name.

  sudo python experiments/bench_network.py --hosts=2 --rates=100,unlimited \
      --results=experiments/results/network.md
  sudo python experiments/bench_network.py --hosts=2,4,8 --rates=100,unlimited \
      --only=dense,powersgd2,local4 --torch_python=/work/torchenv/bin/python
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import netns  # noqa: E402  (experiments/netns.py, beside this script)
import peer_ddp  # noqa: E402
from network_report import (  # noqa: E402
  BREAKDOWN_COLUMNS,
  COLUMNS,
  DDP_COLUMNS,
  EXCHANGE_COLUMNS,
  LINK_COLUMNS,
  breakdown,
  breakdown_figure,
  exchange_row,
  link_row,
  notes,
  plot,
)

flags.DEFINE_list('hosts', ['2'], 'Numbers of hosts (network namespaces, one process each).')
flags.DEFINE_list('rates', ['100', 'unlimited'], "Link rates in Mbit/s, or 'unlimited'.")
flags.DEFINE_string('config', 'configs/digits.py:runlocal', 'Config every run trains.')
flags.DEFINE_string('variants', 'configs/variants/network.py', 'Variants file of the methods.')
flags.DEFINE_list('only', None, 'Variants to run (default: the whole file).')
flags.DEFINE_integer('steps', 30, 'Training steps per run.')
flags.DEFINE_integer(
  'workers_per_host',
  0,
  "Workers (CPU devices) each host runs: N·K workers on K hosts (0: the config's workers, "
  'spread over the hosts). An exchange beside the steps needs 1 (jaxdist.train.overlap).',
)
flags.DEFINE_integer(
  'exchange_steps',
  300,
  'Also run each variant this many steps with one example per worker and evaluation only at '
  "the end (0: not; with --rates of 'unlimited' and a limited rate): its step is the exchange, "
  'with the compute all but removed.',
)
flags.DEFINE_bool(
  'single_thread_hosts',
  False,
  "Each host's XLA computes on one thread (--xla_cpu_multi_thread_eigen=false "
  "intra_op_parallelism_threads=1): hosts that share this machine's cores then do not each "
  'spread their compute over all of them.',
)
flags.DEFINE_integer('skip', 3, 'First steps left out of the medians (compiling, warm-up).')
flags.DEFINE_float('latency_us', 100.0, "The modelled network's latency (netem is not here).")
flags.DEFINE_integer('timeout_s', 600, 'Seconds a run may take before it is killed.')
flags.DEFINE_string('workdir', 'workdir/network', 'Where the runs write.')
flags.DEFINE_string('results', None, 'Also write the markdown table here, and a plot beside it.')
flags.DEFINE_bool('dry_run', False, 'Build the hosts, print them, tear them down (no training).')
flags.DEFINE_bool(
  'tables_only', False, 'Train nothing: the tables of the runs already in --workdir (no root).'
)
flags.DEFINE_float(
  'target', None, "The --metric value timed to (default: the first variant's final)."
)
flags.DEFINE_string(
  'metric', 'test_accuracy', "The evaluation's figure: an accuracy, or a loss (lower is better)."
)
flags.DEFINE_string(
  'torch_python', None, "A Python with torch: also run the peers' DDP over the links."
)
flags.DEFINE_string('peers_dir', peer_ddp.PEERS_DIR, f'The folder holding {peer_ddp.PEER_SCRIPT}.')
FLAGS = flags.FLAGS


def profile(rate: str) -> str | None:
  """The network profile of a link rate ('100' Mbit/s -> '0.1gbps@100us'); None: unlimited."""
  if rate == 'unlimited':
    return None
  return f'{float(rate) / 1000:g}gbps@{FLAGS.latency_us:g}us'


def _env() -> dict:
  """This environment, with jaxdist's checkout first on PYTHONPATH (and one XLA thread a
  process with --single_thread_hosts)."""
  return netns.run_env(ROOT, FLAGS.single_thread_hosts)


def _folder(k: int, rate: str) -> str:
  """Where the runs of `k` hosts at `rate` write."""
  return os.path.abspath(os.path.join(FLAGS.workdir, f'k{k}_{rate}'))


EXCHANGE = '.exchange'  # the folder suffix of a variant's run with the compute all but removed


def run(
  hosts: netns.Hosts,
  name: str,
  overrides: dict,
  rate: str,
  devices: int,
  fitted: str,
  exchange: bool = False,
) -> float:
  """Trains one variant across `hosts`, `devices` CPU devices each; its wall-clock seconds.

  The modelled clock prices the steps on the link's nominal rate and on `fitted`.
  With `exchange`, the run is the variant's exchange alone, in the folder
  `name + EXCHANGE`: one example per worker and one evaluation, at the end
  (the same model, transform and loop send the same bytes; the passes over
  one example are what is left of the compute).
  """
  k = hosts.k
  workdir = os.path.join(_folder(k, rate), name + (EXCHANGE if exchange else ''))
  net = profile(rate)
  nets = ','.join([*([net] if net else []), fitted])
  steps = FLAGS.exchange_steps if exchange else FLAGS.steps
  base = [
    sys.executable, os.path.join(ROOT, 'experiments', 'train.py'),
    f'--config={os.path.join(ROOT, FLAGS.config)}', f'--workdir={workdir}',
    f'--config.steps={steps}', '--config.progress=False', '--fresh',
    f'--config.eval_every={steps if exchange else 10}',
    f'--config.checkpoint_every={steps}',
    f'--coordinator_address={hosts.addresses[0]}:23456', f'--num_processes={k}',
    *netns.flags_of(overrides), f'--config.network.profiles={nets}',
    *([f'--config.batch_size={devices * k}'] if exchange else []),
    *([f'--config.workers={devices * k}'] if FLAGS.workers_per_host else []),
  ]  # fmt: skip
  start = time.perf_counter()
  commands = [[*base, f'--process_id={i}', f'--cpu_devices={devices}'] for i in range(k)]
  hosts.launch(commands, workdir, _env(), FLAGS.timeout_s)
  return time.perf_counter() - start


def run_ddp(hosts: netns.Hosts, method: str, rate: str, workers: int, tries: int = 2) -> dict:
  """The peers' DDP run of `method`, its `workers` ranks spread over `hosts` (ddp_hosts.py).

  Its JSON line (host 0's), with an 'error' key if a host failed `tries` times
  (gloo sometimes aborts a rank while the process group is torn down, after
  the run's figures are in).
  """
  line = {}
  for _ in range(tries):
    line = _ddp_once(hosts, method, rate, workers)
    if peer_ddp.ok(line):
      break
  return line


def _ddp_once(hosts: netns.Hosts, method: str, rate: str, workers: int) -> dict:
  workdir = os.path.join(_folder(hosts.k, rate), f'ddp_{method}')
  shutil.rmtree(workdir, ignore_errors=True)
  script = os.path.join(ROOT, 'experiments', 'ddp_hosts.py')
  peer = ['--world_size', str(workers), '--steps', str(FLAGS.steps), '--match_jaxdist',
          *peer_ddp.DDP_ARGS[method], '--timeout_s', str(FLAGS.timeout_s)]  # fmt: skip
  commands = [
    [FLAGS.torch_python, script, f'--host={i}', f'--hosts={hosts.k}',
     f'--store={os.path.join(workdir, "store")}', '--', *peer]
    for i in range(hosts.k)
  ]  # fmt: skip
  try:
    hosts.launch(
      commands, workdir, dict(os.environ, JAXDIST_PEERS_DIR=FLAGS.peers_dir), FLAGS.timeout_s
    )
  except (RuntimeError, subprocess.TimeoutExpired) as e:
    return {'error': str(e)[-500:]}
  with open(os.path.join(workdir, 'process0.log')) as f:
    return peer_ddp.result(0, f.read(), '')


def _paired() -> bool:
  """Whether --rates has 'unlimited' and a limited rate: the exchange-alone table's pair."""
  return 'unlimited' in FLAGS.rates and len(FLAGS.rates) > 1


def _timed(records: list[dict]) -> list[dict]:
  """The steps the figures use: after --skip, less those that evaluated (their time holds it)."""
  return [r for r in records[FLAGS.skip :] if r.get(FLAGS.metric) is None]


def _median(records: list[dict], key: str) -> float:
  return statistics.median(r.get(key) or 0.0 for r in _timed(records))


def _mean(records: list[dict], key: str) -> float:
  return statistics.mean(r.get(key) or 0.0 for r in _timed(records))


def _reached(value: float | None, target: float) -> bool:
  from jaxdist.train import ledger

  return ledger.reached(value, target, FLAGS.metric)


def _final(records: list[dict]) -> float | None:
  values = [r[FLAGS.metric] for r in records if r.get(FLAGS.metric) is not None]
  return values[-1] if values else None


def _steps_to(records: list[dict], target: float | None) -> int | None:
  """Timed steps (after --skip) up to the first evaluation that reaches the target."""
  if target is None:
    return None
  for i, r in enumerate(records[FLAGS.skip :]):
    if _reached(r.get(FLAGS.metric), target):
      return i + 1
  return None


def _stderr(records: list[dict]) -> float:
  """The standard error of the mean step."""
  times = [r.get('step_s') or 0.0 for r in _timed(records)]
  return statistics.stdev(times) / len(times) ** 0.5 if len(times) > 1 else float('inf')


def row(result: dict, free: dict | None, target: float | None) -> dict:
  """A run's line; `free` is the same variant's run at unlimited rate (its compute).

  Beside the cells (strings), the figures the notes and ratios use, under keys
  starting with '_'.
  """
  records, net = result['records'], result['net']
  measured = _median(records, 'step_s')
  compute = _median(free['records'], 'step_s') if free else None
  # means over the steps: a periodic method communicates on few of them
  comm = None if free is None else _mean(records, 'step_s') - _mean(free['records'], 'step_s')
  noise = None if free is None else (_stderr(records) ** 2 + _stderr(free['records']) ** 2) ** 0.5
  nominal = _mean(records, f'comm_s@{net}') if net else None
  fitted = _mean(records, f'comm_s@{result["fitted"]}')
  final = _final(records)
  steps = _steps_to(records, target)
  ratio = lambda a, b: '-' if a is None or not b else f'{a / b:.2f}'
  seconds = lambda v: '-' if v is None else f'{v:.4f}'
  to_target = None
  if steps is not None:  # training time: an evaluating step counts as the median step
    to_target = sum(
      measured if r.get(FLAGS.metric) is not None else r['step_s'] or 0.0
      for r in records[FLAGS.skip :][:steps]
    )
  modelled_to = None
  if steps is not None and compute is not None:
    comm_key = f'comm_s@{net or result["fitted"]}'
    modelled_to = steps * compute + sum(r[comm_key] for r in records[FLAGS.skip :][:steps])
  return {
    'hosts': result['hosts'],
    'variant': result['name'],
    'rate': result['rate'] if net is None else f'{result["rate"]} Mbit/s',
    'acc': '-' if final is None else f'{final:.4f}',
    'sent': f'{statistics.mean(r["sent_bytes"] for r in records):,.0f}',
    'collectives': f'{_mean(records, "collectives"):.1f}',
    'measured': seconds(measured),
    'comm': seconds(comm) if net else '-',
    'nominal': seconds(nominal),
    'ratio': ratio(comm, nominal) if net else '-',
    'fitted': seconds(fitted),
    'fitted_ratio': ratio(comm, fitted) if net else '-',
    'to_target': seconds(to_target),
    'to_target_model': seconds(modelled_to),
    '_comm': comm if net else None, '_noise': noise, '_nominal': nominal, '_fitted': fitted,
    '_collectives': _mean(records, 'collectives'), '_to_target': to_target,
    '_overlap': _mean(records, f'overlap_s@{net}') if net else None,
    '_mean': _mean(records, 'step_s'), '_host': _host_s(records), 'method_name': result['name'],
  }  # fmt: skip


def _host_s(records: list[dict]) -> float:
  """The loop's mean work on the host per step: each step less its wait for the devices."""
  timed = [r for r in _timed(records) if r.get('step_s') and r.get('host_wait_s') is not None]
  return statistics.mean(r['step_s'] - r['host_wait_s'] for r in timed) if timed else 0.0


DENSE = ('allreduce', 'bucketed_allreduce')  # the methods a dense baseline may be


def versus_dense(rows: list[dict], dense: set[str]) -> None:
  """Each row's measured time to the target over the fastest dense variant's, on one link.

  The baseline is the best of the variants in `dense` (per-leaf or bucketed
  all-reduce) that reached the target on this link; the first row's where
  none is dense (a table of other methods alone).
  """
  times = [r['_to_target'] for r in rows if r['variant'] in dense and r['_to_target']]
  base = min(times) if times else (rows[0]['_to_target'] if rows else None)
  for r in rows:
    mine = r['_to_target']
    r['to_vs_dense'] = f'{mine / base:.2f}' if mine is not None and base else '-'


def dense_variants(group) -> set[str]:
  """The names of `group`'s variants whose method is a dense all-reduce (`DENSE`)."""
  method = lambda o: (o.get('sync') or {}).get('method', o.get('sync.method'))
  default = method(group.settings) or 'allreduce'
  return {n for n, o in group.variants.items() if (method(o) or default) in DENSE}


# The most jaxdist's median step may be, as a multiple of DDP's on the same link (issue 44)
DDP_TARGETS = {'dense': 1.0, 'local4': 1.2, 'powersgd2': 0.8}


def ddp_row(line: dict, mine: dict | None, k: int, rate: str, method: str) -> dict:
  """DDP's run of a method beside jaxdist's run of the variant of that name on the same link."""
  ddp_ms = line['median_step_ms'] if peer_ddp.ok(line) else None
  jd_ms = 1e3 * _median(mine['records'], 'step_s') if mine else None
  ddp_mean = line.get('mean_step_ms') if ddp_ms else None
  jd_mean = 1e3 * _mean(mine['records'], 'step_s') if mine else None
  final = _final(mine['records']) if mine else None
  sent = line.get('bytes_per_rank_per_step_avg_over_run_analytic')
  return {
    'hosts': k, 'rate': rate if rate == 'unlimited' else f'{rate} Mbit/s', 'method': method,
    'ddp_ms': f'{ddp_ms:.1f}' if ddp_ms else f'failed: {line.get("error", "?")[:80]}',
    'jd_ms': f'{jd_ms:.1f}' if jd_ms else '-',
    'ratio': f'{jd_ms / ddp_ms:.2f}' if jd_ms and ddp_ms else '-',
    'ddp_mean': f'{ddp_mean:.1f}' if ddp_mean else '-',
    'jd_mean': f'{jd_mean:.1f}' if jd_mean else '-',
    'mean_ratio': f'{jd_mean / ddp_mean:.2f}' if jd_mean and ddp_mean else '-',
    'target': _target_cell(method, jd_ms / ddp_ms if jd_ms and ddp_ms else None),
    'ddp_acc': f'{line["test_acc"]:.4f}' if ddp_ms else '-',
    'jd_acc': f'{final:.4f}' if final is not None else '-',
    'ddp_sent': f'{sent:,.0f}' if sent is not None else '-',
  }  # fmt: skip


def measure(hosts: netns.Hosts, rate: str, group, names: list[str], workers: int) -> None:
  """Fits the link, trains every variant across `hosts` and, given torch, DDP's methods.

  Everything goes to the workdir (`_folder`): the fit in link.json, each
  variant's run in its folder, DDP's JSON lines in ddp_<method>.json.
  """
  k, folder = hosts.k, _folder(hosts.k, rate)
  fit = hosts.fit_link(workers // k, folder, _env(), FLAGS.timeout_s)
  print(f'  fitted: {fit["profile"]}', flush=True)
  with open(os.path.join(folder, 'link.json'), 'w') as f:
    json.dump(fit, f)
  for name in names:
    wall = run(hosts, name, {**group.settings, **group.variants[name]}, rate, workers // k,
               fit['profile'])  # fmt: skip
    print(f'  {name}: {wall:.0f} s', flush=True)
    if FLAGS.exchange_steps and _paired():
      wall = run(hosts, name, {**group.settings, **group.variants[name]}, rate, workers // k,
                 fit['profile'], exchange=True)  # fmt: skip
      print(f'  {name}, the exchange alone: {wall:.0f} s', flush=True)
  for method in peer_ddp.DDP_ARGS if FLAGS.torch_python else ():
    line = run_ddp(hosts, method, rate, workers)
    print(f'  DDP {method}: {line.get("median_step_ms", line.get("error"))}', flush=True)
    with open(os.path.join(folder, f'ddp_{method}.json'), 'w') as f:
      json.dump(line, f)


def collect(k: int, rate: str, names: list[str]) -> tuple[dict, list[dict], dict]:
  """What `measure` wrote for `k` hosts at `rate`: the fit, the runs' records, DDP's lines."""
  folder = _folder(k, rate)
  missing = [p for p in ['link.json', *(f'{n}/metrics.jsonl' for n in names)]
             if not os.path.exists(os.path.join(folder, p))]  # fmt: skip
  if missing:
    raise app.UsageError(
      f'--workdir={FLAGS.workdir} has no run of {k} hosts at {rate} ({folder}: no '
      f'{", ".join(missing)}): train it first (without --tables_only), or give the '
      '--hosts, --rates and --only it was trained with'
    )
  with open(os.path.join(folder, 'link.json')) as f:
    fit = json.load(f)
  results = []
  for name in names:
    with open(os.path.join(folder, name, 'metrics.jsonl')) as f:
      records = [json.loads(line) for line in f]
    results.append({'name': name, 'hosts': k, 'rate': rate, 'net': profile(rate),
                    'fitted': fit['profile'], 'records': records})  # fmt: skip
    alone = os.path.join(folder, name + EXCHANGE, 'metrics.jsonl')
    if os.path.exists(alone):  # the exchange alone (--exchange_steps)
      with open(alone) as f:
        results[-1]['exchange'] = [json.loads(line) for line in f]
  ddp = {}
  for method in peer_ddp.DDP_ARGS:
    path = os.path.join(folder, f'ddp_{method}.json')
    if os.path.exists(path):
      with open(path) as f:
        ddp[method] = json.load(f)
  return fit, results, ddp


def tabulate(names: list[str], workers: int, dense: set[str]) -> tuple[list, ...]:
  """The links', runs' and DDP's rows of every hosts and rate, from the workdir; the fitted α;
  where each step goes (`_breakdowns`)."""
  rows, links, ddp_rows, latency, split, alone = [], [], [], {}, [], []
  for k in (int(h) for h in FLAGS.hosts):
    runs, ddps = {}, {}
    for rate in FLAGS.rates:
      fit, results, ddp = collect(k, rate, names)
      links.append(link_row(k, rate, fit))
      latency[(k, rate if rate == 'unlimited' else f'{rate} Mbit/s')] = fit['latency']
      runs[rate] = (results, FLAGS.target or _final(results[0]['records']))
      mine = {r['name']: r for r in results}
      ddp_rows += [ddp_row(line, mine.get(m), k, rate, m) for m, line in ddp.items()]
      ddps[rate] = ddp
    free = {r['name']: r for r in runs.get('unlimited', ([], None))[0]}
    for results, target in runs.values():
      mine = [row(r, free.get(r['name']), target) for r in results]
      versus_dense(mine, dense)
      rows += mine
      paired = [r for r in results if r['net'] and 'exchange' in free.get(r['name'], {})]
      alone += [_exchange_row(r, free[r['name']]) for r in paired if 'exchange' in r]
    split += _breakdowns(rows, ddps, k)
  return rows, links, ddp_rows, latency, split, alone


def _exchange_row(limited: dict, free: dict) -> dict:
  """`network_report.exchange_row` of a variant's exchange-alone runs on a limited link and
  at unlimited rate (their timed steps), with its training runs' steps (the hidden fraction)."""
  return exchange_row(
    limited['hosts'], limited['name'], f'{limited["rate"]} Mbit/s',
    (_timed(limited['exchange']), f'comm_s@{limited["fitted"]}'),
    (_timed(free['exchange']), f'comm_s@{free["fitted"]}'),
    (_timed(limited['records']), _timed(free['records'])),
  )  # fmt: skip


def _target_cell(method: str, ratio: float | None) -> str:
  """`≤ target: holds` (or `not`) for the median ratio of a method with a target, else '-'."""
  target = DDP_TARGETS.get(method)
  if target is None or ratio is None:
    return '-'
  return f'≤ {target:.1f}: {"holds" if ratio <= target else "not"}'


def _breakdowns(rows: list[dict], ddps: dict, k: int) -> list[dict]:
  """Where a step goes (`network_report.breakdown`) for each of k hosts' runs on a limited
  link, DDP's method of the same name after it."""
  mine = [r for r in rows if r['hosts'] == k]
  free = {r['variant']: r for r in mine if r['rate'] == 'unlimited'}
  out = []
  for rate in (r for r in FLAGS.rates if r != 'unlimited'):
    link = f'{rate} Mbit/s'
    for r in (r for r in mine if r['rate'] == link and r['variant'] in free):
      out.append(breakdown(r, free[r['variant']]))
      lines = ddps.get(rate, {}).get(r['variant']), ddps.get('unlimited', {}).get(r['variant'])
      if all(peer_ddp.ok(line) for line in lines):
        out.append(breakdown(r, r, {'limited': lines[0], 'free': lines[1], 'hosts': k,
                                    'rate': link, 'method_name': r['variant']}))  # fmt: skip
  return out


def measured_by() -> str:
  """The command that trained the runs in --workdir (written there after they ran)."""
  with open(os.path.join(FLAGS.workdir, 'command.txt')) as f:
    return f.read().strip()


def main(argv):
  del argv
  from jaxdist.train import compare, factory, report

  if not FLAGS.tables_only and (why := netns.available()):
    raise app.UsageError(f'bench_network {why}')
  group = compare.load_group(FLAGS.variants)
  names = FLAGS.only or list(group.variants)
  workers = factory.load_config(FLAGS.config).workers
  if FLAGS.workers_per_host < 0:
    raise app.UsageError(f'--workers_per_host must be >= 0, got {FLAGS.workers_per_host}')
  for k in (int(h) for h in FLAGS.hosts):
    if workers % k and not FLAGS.workers_per_host:
      raise app.UsageError(f"--hosts {k} must divide the config's {workers} workers")
    for rate in [] if FLAGS.tables_only else FLAGS.rates:
      with netns.Hosts(k, None if rate == 'unlimited' else float(rate)) as hosts:
        print(f'{k} hosts {hosts.names} at {rate}: {hosts.addresses}', flush=True)
        if not FLAGS.dry_run:
          measure(hosts, rate, group, names, FLAGS.workers_per_host * k or workers)
  if FLAGS.dry_run:
    return
  if not FLAGS.tables_only:
    with open(os.path.join(FLAGS.workdir, 'command.txt'), 'w') as f:
      f.write(' '.join(['python', 'experiments/bench_network.py', *sys.argv[1:]]) + '\n')
  rows, links, ddp_rows, latency, split, alone = tabulate(names, workers, dense_variants(group))
  target = FLAGS.target or "the first variant's final on that link"
  spread = (f'{FLAGS.workers_per_host} worker(s) a host' if FLAGS.workers_per_host
            else f'{workers} workers')  # fmt: skip
  title = (f'{FLAGS.config} with {FLAGS.variants} settings, {spread} on {FLAGS.hosts} '
           f'hosts, {FLAGS.steps} steps; target {FLAGS.metric} {target}')  # fmt: skip
  link_title = (
    'the links: α and β of the ring of all workers, fitted to all-reduces across the '
    'hosts (calibrate_link.py)'
  )
  print(f'\n{link_title}\n' + report.table(links, LINK_COLUMNS))
  print(f'\n{title}\n' + report.table(rows, COLUMNS))
  per_host = FLAGS.workers_per_host
  why = notes(rows, latency, (lambda k: per_host * k) if per_host else workers, FLAGS.latency_us)
  print('\n'.join(['', *why]))
  alone_title = (
    'the exchange alone (one example per worker, the same transform and loop): what the '
    'limited link adds to its step, measured, and modelled on the α and β fitted to each link '
    '(limited less unlimited, in both)'
  )
  if alone:
    print(f'\n{alone_title}\n' + report.table(alone, EXCHANGE_COLUMNS))
  ddp_title = f"the peers' PyTorch DDP ({peer_ddp.PEER_SCRIPT}, gloo) over the same links"
  if ddp_rows:
    print(f'\n{ddp_title}\n' + report.table(ddp_rows, DDP_COLUMNS))
  split_title = (
    f'where a step goes (ms, means over the timed steps, {os.cpu_count()} cores shared by all the '
    "hosts' processes): the loop's own work on the host, the rest of the step at unlimited "
    '(compute, collectives, waits), and what the limited link adds; DDP: its whole step at '
    'unlimited rate, and what the link adds'
  )
  if split:
    print(f'\n{split_title}\n' + report.table(split, BREAKDOWN_COLUMNS))
  if FLAGS.results:
    made = report.provenance(measured_by())
    if FLAGS.tables_only:
      made += ' Tables redone from its runs by the same command with `--tables_only`.'
    parts = [made, f'{link_title}:', report.markdown(links, LINK_COLUMNS),
             f'{title}:', report.markdown(rows, COLUMNS)]  # fmt: skip
    if why:
      parts.append('Where measured and modelled differ by more than 15 %:\n\n'
                   + '\n'.join(f'- {w}' for w in why))  # fmt: skip
    if alone:
      parts += [f'{alone_title}:', report.markdown(alone, EXCHANGE_COLUMNS)]
    if ddp_rows:
      parts += [f'{ddp_title}:', report.markdown(ddp_rows, DDP_COLUMNS)]
    if split:
      parts += [f'{split_title}:', report.markdown(split, BREAKDOWN_COLUMNS)]
      report.save(breakdown_figure(split), FLAGS.results.removesuffix('.md') + '_steps.png')
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    plot(rows, FLAGS.results.removesuffix('.md') + '.png')
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
