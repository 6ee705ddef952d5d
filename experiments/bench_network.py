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
first `--skip` steps left out). The hosts share this machine's cores, so a
step's compute here is all workers' compute on them, not one worker's as on
a cluster; the comparison is therefore of communication: the measured
communication of a step is its mean minus the same variant's mean at
unlimited rate (the compute, and what the link adds at full speed; means: a
periodic method communicates on few steps), against
the run's modelled communication (`comm_s@` the link's nominal rate, and on
the link α and β fitted across the hosts, `calibrate_link.py`). The time to
the first variant's final test accuracy is measured, and modelled as that
many steps of the unlimited run's compute plus their modelled communication.
'unlimited' must be among the rates for the communication columns.

  sudo python experiments/bench_network.py --hosts=2 --rates=100,unlimited \
      --results=experiments/results/network.md
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import netns  # noqa: E402  (experiments/netns.py, beside this script)

flags.DEFINE_list('hosts', ['2'], 'Numbers of hosts (network namespaces, one process each).')
flags.DEFINE_list('rates', ['100', 'unlimited'], "Link rates in Mbit/s, or 'unlimited'.")
flags.DEFINE_string('config', 'configs/digits.py:runlocal', 'Config every run trains.')
flags.DEFINE_string('variants', 'configs/variants/network.py', 'Variants file of the methods.')
flags.DEFINE_list('only', None, 'Variants to run (default: the whole file).')
flags.DEFINE_integer('steps', 30, 'Training steps per run.')
flags.DEFINE_integer('skip', 3, 'First steps left out of the medians (compiling, warm-up).')
flags.DEFINE_float('latency_us', 100.0, "The modelled network's latency (netem is not here).")
flags.DEFINE_integer('timeout_s', 600, 'Seconds a run may take before it is killed.')
flags.DEFINE_string('workdir', 'workdir/network', 'Where the runs write.')
flags.DEFINE_string('results', None, 'Also write the markdown table here, and a plot beside it.')
flags.DEFINE_bool('dry_run', False, 'Build the hosts, print them, tear them down (no training).')
FLAGS = flags.FLAGS


def profile(rate: str) -> str | None:
  """The network profile of a link rate ('100' Mbit/s -> '0.1gbps@100us'); None: unlimited."""
  if rate == 'unlimited':
    return None
  return f'{float(rate) / 1000:g}gbps@{FLAGS.latency_us:g}us'


def flags_of(overrides: dict, prefix: str = 'config') -> list[str]:
  """A variant's nested overrides as `--config.a.b=value` flags."""
  out = []
  for key, value in overrides.items():
    if isinstance(value, dict):
      out += flags_of(value, f'{prefix}.{key}')
    else:
      out.append(f'--{prefix}.{key}={value}')
  return out


def run(
  hosts: netns.Hosts, name: str, overrides: dict, rate: str, devices: int, fitted: str
) -> dict:
  """Trains one variant across `hosts`, `devices` CPU devices each; process 0's records.

  The modelled clock prices the steps on the link's nominal rate and on `fitted`.
  """
  k = hosts.k
  workdir = os.path.abspath(os.path.join(FLAGS.workdir, f'k{k}_{rate}', name))
  net = profile(rate)
  nets = ','.join([*([net] if net else []), fitted])
  base = [
    sys.executable, os.path.join(ROOT, 'experiments', 'train.py'),
    f'--config={os.path.join(ROOT, FLAGS.config)}', f'--workdir={workdir}',
    f'--config.steps={FLAGS.steps}', '--config.progress=False', '--config.eval_every=10', '--fresh',
    f'--config.checkpoint_every={FLAGS.steps}',
    f'--coordinator_address={hosts.addresses[0]}:23456', f'--num_processes={k}',
    *flags_of(overrides), f'--config.network.profiles={nets}',
  ]  # fmt: skip
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  os.makedirs(workdir, exist_ok=True)
  logs = [open(os.path.join(workdir, f'process{i}.log'), 'w') for i in range(k)]  # noqa: SIM115
  start = time.perf_counter()
  try:
    procs = [
      hosts.popen(
        i,
        [*base, f'--process_id={i}', f'--cpu_devices={devices}'],
        env=env,
        stdout=logs[i],
        stderr=subprocess.STDOUT,
      )
      for i in range(k)
    ]
    deadline = start + FLAGS.timeout_s
    for p in procs:
      p.wait(timeout=max(1.0, deadline - time.perf_counter()))
  finally:
    for f in logs:
      f.close()
  wall = time.perf_counter() - start
  failed = [i for i, p in enumerate(procs) if p.returncode != 0]
  if failed:
    with open(os.path.join(workdir, f'process{failed[0]}.log')) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f'{name} at {rate}: process {failed[0]} exited non-zero:\n{tail}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  return {
    'name': name, 'rate': rate, 'net': net, 'fitted': fitted, 'records': records, 'wall_s': wall
  }  # fmt: skip


def calibrate(hosts: netns.Hosts) -> dict:
  """α and β fitted to all-reduces across the hosts (experiments/calibrate_link.py)."""
  script = os.path.join(ROOT, 'experiments', 'calibrate_link.py')
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  base = [sys.executable, script, f'--coordinator_address={hosts.addresses[0]}:23457',
          f'--num_processes={hosts.k}']  # fmt: skip
  procs = [
    hosts.popen(
      i,
      [*base, f'--process_id={i}'],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(hosts.k)
  ]
  outs = [p.communicate(timeout=FLAGS.timeout_s) for p in procs]
  for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
    if p.returncode != 0:
      raise RuntimeError(f'calibration: process {i} exited non-zero:\n{err[-3000:]}')
  fitted = json.loads(outs[0][0].strip().splitlines()[-1])
  spec = f'{fitted["bandwidth"] * 8 / 1e9:.4g}gbps@{fitted["latency"] * 1e6:.4g}us'
  return fitted | {'profile': spec}


def _median(records: list[dict], key: str) -> float:
  return statistics.median(r.get(key) or 0.0 for r in records[FLAGS.skip :])


def _mean(records: list[dict], key: str) -> float:
  return statistics.mean(r.get(key) or 0.0 for r in records[FLAGS.skip :])


def _steps_to(records: list[dict], target: float | None) -> int | None:
  """Timed steps (after --skip) up to the first evaluation at >= target accuracy."""
  if target is None:
    return None
  for i, r in enumerate(records[FLAGS.skip :]):
    if r.get('test_accuracy') is not None and r['test_accuracy'] >= target:
      return i + 1
  return None


def row(result: dict, free: dict | None, target: float | None) -> dict:
  """A run's line; `free` is the same variant's run at unlimited rate (its compute)."""
  records, net = result['records'], result['net']
  measured = _median(records, 'step_s')
  compute = _median(free['records'], 'step_s') if free else None
  # means over the steps: a periodic method communicates on few of them
  comm = None if free is None else _mean(records, 'step_s') - _mean(free['records'], 'step_s')
  nominal = _mean(records, f'comm_s@{net}') if net else None
  fitted = _mean(records, f'comm_s@{result["fitted"]}')
  final = [r['test_accuracy'] for r in records if r.get('test_accuracy') is not None][-1]
  steps = _steps_to(records, target)
  ratio = lambda a, b: '-' if a is None or not b else f'{a / b:.2f}'
  seconds = lambda v: '-' if v is None else f'{v:.4f}'
  to_target = None
  if steps is not None:
    to_target = sum(r['step_s'] or 0.0 for r in records[FLAGS.skip :][:steps])
  modelled_to = None
  if steps is not None and compute is not None:
    comm_key = f'comm_s@{net or result["fitted"]}'
    modelled_to = steps * compute + sum(r[comm_key] for r in records[FLAGS.skip :][:steps])
  return {
    'variant': result['name'],
    'rate': result['rate'] if net is None else f'{result["rate"]} Mbit/s',
    'acc': f'{final:.4f}',
    'sent': f'{statistics.mean(r["sent_bytes"] for r in records):,.0f}',
    'measured': seconds(measured),
    'comm': seconds(comm) if net else '-',
    'nominal': seconds(nominal),
    'ratio': ratio(comm, nominal) if net else '-',
    'fitted': seconds(fitted),
    'to_target': seconds(to_target),
    'to_target_model': seconds(modelled_to),
  }


COLUMNS = [
  ('variant', 'variant'),
  ('rate', 'link'),
  ('acc', 'test acc'),
  ('sent', 'sent B/worker/step'),
  ('measured', 'step s, measured'),
  ('comm', 'comm s/step, measured'),
  ('nominal', 'comm s/step, modelled'),
  ('ratio', 'measured ÷ modelled'),
  ('fitted', 'comm s/step, modelled on the fitted link'),
  ('to_target', "to first's acc, measured s"),
  ('to_target_model', "to first's acc, modelled s"),
]
LINK_COLUMNS = [
  ('hosts', 'hosts'),
  ('rate', 'link'),
  ('fitted_mbit', 'fitted Mbit/s'),
  ('fitted_latency', 'fitted latency µs'),
  ('off', 'fitted ÷ configured'),
]


def plot(rows: list[dict], path: str) -> None:
  """Measured against modelled communication per step, a point per run on a limited link."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(5.5, 5))
  ax = fig.subplots()
  points = [r for r in rows if r['comm'] != '-' and r['nominal'] != '-']
  for link in sorted({r['rate'] for r in points}):
    mine = [r for r in points if r['rate'] == link and float(r['nominal']) > 0]
    xs = [1e3 * float(r['nominal']) for r in mine]
    ys = [1e3 * max(float(r['comm']), 1e-4) for r in mine]  # at most 0.1 ms: drawn at 0.1 ms
    ax.scatter(xs, ys, label=link)
    for x, y, r in zip(xs, ys, mine, strict=True):
      ax.annotate(r['variant'], (x, y), fontsize=6, xytext=(3, 2), textcoords='offset points')
  top = max([1.0, *(1e3 * float(r['nominal']) for r in points)]) * 2
  ax.plot([0.1, top], [0.1, top], color='gray', ls='--', lw=1, label='measured = modelled')
  ax.set(xscale='log', yscale='log', xlabel='modelled communication per step (ms)',
         ylabel='measured communication per step (ms)')  # fmt: skip
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  from jaxdist.train import compare, factory, report

  if why := netns.available():
    raise app.UsageError(f'bench_network {why}')
  group = compare.load_group(FLAGS.variants)
  names = FLAGS.only or list(group.variants)
  workers = factory.load_config(FLAGS.config).workers
  rows, links = [], []
  for k in (int(h) for h in FLAGS.hosts):
    if workers % k:
      raise app.UsageError(f"--hosts {k} must divide the config's {workers} workers")
    runs = {}
    for rate in FLAGS.rates:
      mbit = None if rate == 'unlimited' else float(rate)
      with netns.Hosts(k, mbit) as hosts:
        print(f'{k} hosts {hosts.names} at {rate}: {hosts.addresses}', flush=True)
        if FLAGS.dry_run:
          continue
        fit = calibrate(hosts)
        mbit_fit = fit['bandwidth'] * 8 / 1e6
        links.append({
          'hosts': k, 'rate': rate, 'fitted_mbit': f'{mbit_fit:,.1f}',
          'fitted_latency': f'{fit["latency"] * 1e6:,.0f}',
          'off': '-' if mbit is None else f'{mbit_fit / mbit:.3f}',
        })  # fmt: skip
        print(f'  fitted: {fit["profile"]}', flush=True)
        results = []
        for name in names:
          overrides = {**group.settings, **group.variants[name]}
          results.append(run(hosts, name, overrides, rate, workers // k, fit['profile']))
          print(f'  {name}: {results[-1]["wall_s"]:.0f} s', flush=True)
        finals = [r['test_accuracy'] for r in results[0]['records'] if 'test_accuracy' in r]
        target = finals[-1] if finals else None
        runs[rate] = (results, target)
    free = {r['name']: r for r in runs.get('unlimited', ([], None))[0]}
    for results, target in runs.values():
      rows += [row(r, free.get(r['name']), target) for r in results]
  if not rows:
    return
  title = f'{FLAGS.config}, {workers} workers on {FLAGS.hosts} hosts, {FLAGS.steps} steps'
  link_title = 'the links: α and β fitted to all-reduces across the hosts (calibrate_link.py)'
  print(f'\n{link_title}\n' + report.table(links, LINK_COLUMNS))
  print(f'\n{title}\n' + report.table(rows, COLUMNS))
  if FLAGS.results:
    command = ' '.join(['python', 'experiments/bench_network.py', *sys.argv[1:]])
    parts = [report.provenance(command), f'{link_title}:', report.markdown(links, LINK_COLUMNS),
             f'{title}:', report.markdown(rows, COLUMNS)]  # fmt: skip
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    plot(rows, FLAGS.results.removesuffix('.md') + '.png')
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
