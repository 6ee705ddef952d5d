r"""Training on unequal hosts: a CPU share and a link per host, measured beside the cluster model.

`netns.Hosts` makes `--hosts` network namespaces on a bridge; each host's
processes run in a CPU group of their own (`--cpu`: that many cores of CPU
time, a cgroup v1 quota) and its link is limited to its rate (`--rates`,
Mbit/s or 'unlimited', one for all or one per host). One training process a
host, one worker each (`experiments/train.py` over jax.distributed, XLA on one
thread, so a host's share is what it computes with). Everything is torn down
on exit, on error and on Ctrl-C.

Calibration, on the same hosts:

- the link's α and β, fitted to all-reduces across the hosts
  (`calibrate_link.py`), which every run's records price their collectives on;
- each host's step as a line in its batch, a_k + b / v_k: every host trains
  alone, one after the other (one process, one worker, no collectives) at two batch sizes
  (`--calibrate_batches`), and the line through their median steps gives its
  fixed seconds a step a_k (the loop on the host, dispatch: on a small share
  they are tens of ms) and its examples a second v_k (`host_line`).

Dynamic batching's allocation (Tyagi & Sharma 2020 §III-B, static by
throughput) is the one that equalises the calibrated lines: micro-batch by
micro-batch, each to the host whose step it lengthens least; the runs get it
as the weights of their static allocation (`config.cluster.speeds`).

Per variant and host: the measured mean step on that host's own clock (its
devices, `hosts/process<i>.json`; the steps after `--skip`, less those that
evaluated or follow one) beside the cluster model's, `jd.netmodel.simulate`
with the calibrated lines (`Cluster(speeds=v, fixed_s=a)`), the run's
own batches and α-β communication per step, and its synchronising steps as
barriers (the periodic waiting rule: BSP when every step synchronises); with
data streaming in (`config.streams.realtime`), first each step's wait for
data on the streams' model (`stream_timeline`). Per variant: the time to
`--target` accuracy on process 0's clock (after the `--skip` warm-up steps,
whose one-off compiles are the same for every method), and its ratio to the
first variant's; the targets of issue 47 as rows that hold or not.

  sudo python experiments/bench_hetero.py --cpu=1,0.85,0.1 --rates=unlimited \
      --results=experiments/results/hetero_hosts.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import netns  # noqa: E402  (experiments/netns.py, beside this script)
from hetero_report import (  # noqa: E402
  HOST_COLUMNS,
  MODELLED,
  TARGET_COLUMNS,
  collect,
  equalising,
  figure,
  final,
  host_line,
  host_rows,
  run_columns,
  run_rows,
  target_rows,
)

flags.DEFINE_list('cpu', ['1', '0.85', '0.1'], "Each host's CPU time in cores ('none': no limit).")
flags.DEFINE_list('rates', ['unlimited'], "Link rates in Mbit/s or 'unlimited': one, or a host's.")
flags.DEFINE_string('config', 'configs/digits.py', 'Config every run trains.')
flags.DEFINE_string('variants', 'configs/variants/hetero_hosts.py', 'Variants file.')
flags.DEFINE_list('only', None, 'Variants to run (default: the whole file).')
flags.DEFINE_integer('steps', 200, "Training steps per run (a variant's own `steps` first).")
flags.DEFINE_integer('eval_every', 20, 'Steps between evaluations.')
flags.DEFINE_integer('skip', 15, 'First steps left out of the means (compiling, warm-up).')
flags.DEFINE_string('metric', 'test_accuracy', 'Test metric of the target (test_loss: lower).')
flags.DEFINE_float('target', None, "Target of --metric (default: the first variant's final).")
flags.DEFINE_string('workdir', 'workdir/bench_hetero', 'Where the runs write.')
flags.DEFINE_string('results', None, 'Markdown file for the tables (and a .png beside it).')
flags.DEFINE_integer('timeout_s', 1800, 'The most one run may take (all its processes).')
flags.DEFINE_integer('period_us', 10_000, "The CPU groups' period (µs): a share is of each.")
flags.DEFINE_list('calibrate_batches', ['8', '128'], "Batch sizes of each host's calibration.")
flags.DEFINE_integer('calibration_steps', 40, "Steps of each host's calibration runs.")
flags.DEFINE_bool('tables_only', False, 'Redo the tables from the runs in --workdir.')
FLAGS = flags.FLAGS


def _per_host(flag: str, values: list[str], k: int, unlimited: str) -> list:
  """One value per host from a list flag: numbers > 0, or `unlimited` for none."""
  try:
    out = [None if v == unlimited else float(v) for v in values]
  except ValueError:
    raise app.UsageError(f"--{flag}: give numbers > 0 or '{unlimited}', got {values}") from None
  if any(v is not None and v <= 0 for v in out):
    raise app.UsageError(f"--{flag}: give numbers > 0 or '{unlimited}', got {values}")
  if len(out) == 1:
    return out * k
  if len(out) != k:
    raise app.UsageError(f'--{flag}: give one value or one per host ({k}), got {values}')
  return out


def hosts_of() -> tuple[int, list, list]:
  """(k, each host's CPU share or None, each link's rate or None) from the flags."""
  k = len(FLAGS.cpu)
  return k, _per_host('cpu', FLAGS.cpu, k, 'none'), _per_host('rates', FLAGS.rates, k, 'unlimited')


def _env() -> dict:
  """One XLA thread a process, and one compilation cache for all: a host on a small share
  reads the programs a faster one compiled (jax writes the cache from process 0 only, so the
  fastest host is best first in --cpu)."""
  env = netns.run_env(ROOT, single_thread=True)
  env.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.abspath(os.path.join(FLAGS.workdir, 'xla')))
  env.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  return env


def run(hosts: netns.Hosts, name: str, overrides: dict, profile: str) -> str:
  """Trains one variant across `hosts`, one worker each; its workdir."""
  workdir = os.path.abspath(os.path.join(FLAGS.workdir, name))
  steps = overrides.pop('steps', FLAGS.steps)
  base = [
    sys.executable, os.path.join(ROOT, 'experiments', 'train.py'),
    f'--config={os.path.join(ROOT, FLAGS.config)}', f'--workdir={workdir}',
    f'--config.steps={steps}', '--config.progress=False', '--fresh',
    f'--config.eval_every={FLAGS.eval_every}', f'--config.checkpoint_every={steps}',
    f'--coordinator_address={hosts.addresses[0]}:23456', f'--num_processes={hosts.k}',
    *netns.flags_of(overrides), f'--config.network.profiles={profile}',
  ]  # fmt: skip
  commands = [[*base, f'--process_id={i}', '--cpu_devices=1'] for i in range(hosts.k)]
  hosts.launch(commands, workdir, _env(), FLAGS.timeout_s)
  return workdir


def calibrate_hosts(hosts: netns.Hosts, config: list[str]) -> list[tuple[float, float]]:
  """Each host's (a_k, v_k): fixed seconds a step and examples a second, trained alone, one
  host at a time: run together, the busy hosts' groups would take CPU time from the 0.1-core
  one (a quota caps a group's share but does not reserve it; 1 + 0.85 + 0.1 cores of a
  2-core machine leave little beside the bench), which in the training runs, where the fast
  hosts wait for it, has its share."""
  from jaxdist.train import metrics

  steps, medians = FLAGS.calibration_steps, []
  for batch in (int(b) for b in FLAGS.calibrate_batches):
    folder = os.path.abspath(os.path.join(FLAGS.workdir, 'calibrate_hosts', f'b{batch}'))
    commands = [[
      sys.executable, os.path.join(ROOT, 'experiments', 'train.py'), *config,
      f'--workdir={folder}/h{i}', '--fresh', '--config.workers=1', f'--config.batch_size={batch}',
      f'--config.steps={steps}', f'--config.eval_every={steps}', '--config.noise_every=0',
      f'--config.checkpoint_every={steps}', '--config.progress=False', '--cpu_devices=1',
    ] for i in range(hosts.k)]  # fmt: skip
    for i in range(hosts.k):  # the fastest first: it writes the compilation cache the others read
      alone = [c if j == i else None for j, c in enumerate(commands)]
      hosts.launch(alone, folder, _env(), FLAGS.timeout_s)
    medians.append([
      statistics.median(
        r['step_s'] for r in metrics.read_jsonl(f'{folder}/h{i}/metrics.jsonl')[FLAGS.skip : -1]
      ) for i in range(hosts.k)
    ])  # fmt: skip
  (b1, b2), (t1, t2) = [int(b) for b in FLAGS.calibrate_batches], np.asarray(medians)
  return [host_line(b1, b2, a, b) for a, b in zip(t1, t2, strict=True)]


def window_of(overrides: dict, lines: list[tuple[float, float]]) -> list[int]:
  """Heterogeneity-aware DiLoCo's cluster from the calibrated lines (sets `overrides`): speeds
  v_k examples/s, fixed a_k s a step and a compute term of B / K s (so one example takes a
  speed-1 worker a second), each step t_k = a_k + (B / K) / v_k; the steps h_k a round."""
  from jaxdist import control

  per = overrides['batch_size'] // len(lines)
  fixed, speeds = zip(*lines, strict=True)
  overrides['cluster'] = {**overrides.get('cluster', {}), 'speeds': ','.join(map(str, speeds)),
                          'fixed_s': ','.join(map(str, fixed))}  # fmt: skip
  overrides['network'] = {**overrides.get('network', {}), 'compute_s': float(per)}
  period = overrides['sync']['diloco']['period']
  return control.Window(period).steps([a + per / v for a, v in lines]).tolist()


def _merged(*trees: dict) -> dict:
  out: dict = {}
  for tree in trees:
    for key, value in tree.items():
      out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
  return out


CALIBRATION = 'calibration.json'


def measure(group, names: list[str], k: int, cpu: list, rates: list) -> None:
  """Builds the hosts, fits the link and each host's line, then trains every variant."""
  config = [f'--config={os.path.join(ROOT, FLAGS.config)}']
  with netns.Hosts(k, rates, cpu=cpu, period_us=FLAGS.period_us) as hosts:
    print(f'{k} hosts {hosts.names}: cores {cpu}, Mbit/s {rates}', flush=True)
    fit = hosts.fit_link(1, os.path.abspath(FLAGS.workdir), _env(), FLAGS.timeout_s)
    lines = calibrate_hosts(hosts, config)
    print(f'  link: {fit["profile"]}; hosts (a s, v ex/s): {lines}', flush=True)
    allocations = {}
    for name in names:
      overrides = _merged(group.settings, group.variants[name])
      if overrides.get('batching') == 'static':  # the equalising batches, as its weights
        micro = overrides.get('dynamic_batching', {}).get('micro_batch') or 1
        allocations[name] = equalising(lines, overrides['batch_size'], micro)
        overrides['cluster']['speeds'] = ','.join(map(str, allocations[name]))
      if overrides.get('batching') == 'window':
        allocations[name] = window_of(overrides, lines)
      start = time.perf_counter()
      run(hosts, name, overrides, fit['profile'])
      print(f'  {name}: {time.perf_counter() - start:.0f} s', flush=True)
  command = ' '.join(['python', 'experiments/bench_hetero.py', *sys.argv[1:]])
  with open(os.path.join(FLAGS.workdir, CALIBRATION), 'w') as f:
    json.dump({'lines': lines, 'link': fit, 'cpu': cpu, 'rates': rates, 'names': names,
               'allocations': allocations, 'command': command}, f)  # fmt: skip


def main(argv):
  del argv
  k, cpu, rates = hosts_of()  # before jax starts: a bad flag fails at once
  from jaxdist.train import compare, report

  group = compare.load_group(FLAGS.variants)
  names = FLAGS.only or list(group.variants)
  if group.settings.get('workers') != k:
    raise app.UsageError(f"--cpu names {k} hosts: the variants' settings must give {k} workers")
  if not FLAGS.tables_only:
    if why := netns.available():
      raise app.UsageError(f'bench_hetero {why}')
    os.makedirs(FLAGS.workdir, exist_ok=True)
    measure(group, names, k, cpu, rates)
  with open(os.path.join(FLAGS.workdir, CALIBRATION)) as f:
    calib = json.load(f)
  lines, profile = calib['lines'], calib['link']['profile']
  results = {
    n: collect(os.path.abspath(os.path.join(FLAGS.workdir, n)), k, lines, profile, FLAGS.skip)
    for n in calib['names']
  }
  metric = FLAGS.metric
  target = FLAGS.target or final(next(iter(results.values()))['records'], metric)
  hosts = [row for n, r in results.items() for row in host_rows(n, r, calib['cpu'], calib['rates'])]
  runs = run_rows(results, target, FLAGS.skip, metric)
  targets = target_rows(results, runs, MODELLED)
  windows = {n: h for n, h in calib['allocations'].items() if n in calib['names']}
  title = (
    f'{FLAGS.config} with {FLAGS.variants}, {k} hosts (one worker each), cores '
    f'{calib["cpu"]}, links {calib["rates"]}; each host alone a + b / v with (a ms, v '
    f'examples/s) {[(round(1e3 * a, 1), round(v)) for a, v in lines]}; link fitted {profile}; '
    f'{FLAGS.steps} steps unless a variant sets its own; target {metric} {target:.4g}; '
    f'batches (static) or inner steps a round (window) set from the hosts: {windows}'
  )
  for heading, rows, columns in (
    ('per host', hosts, HOST_COLUMNS),
    ('per variant', runs, run_columns(metric)),
    ('targets', targets, TARGET_COLUMNS),
  ):
    print(f'\n{heading}: {title}\n' + report.table(rows, columns))
  if FLAGS.results:
    made = report.provenance(calib['command'])
    if FLAGS.tables_only:
      made += ' Tables redone from its runs with `--tables_only`.'
    parts = [
      made,
      f'{title}.',
      'Per host:',
      report.markdown(hosts, HOST_COLUMNS),
      'Per variant:',
      report.markdown(runs, run_columns(metric)),
      'Targets:',
      report.markdown(targets, TARGET_COLUMNS),
    ]
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    report.save(figure(hosts, runs), FLAGS.results.removesuffix('.md') + '.png')
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
