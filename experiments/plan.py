r"""Plans a job's cluster (K workers, global batch B) as Scavenger does, then checks the plan.

Tyagi & Sharma, CCGrid 2023 (`jaxdist.control.scavenger`), on the modelled
clock of this library (one worker's measured step + α-β communication):

1. Profile: short runs (--profile_steps) at the four corners of the grid
   --workers × --batches (--search=partial) or at every point (full). From
   each: the modelled step on --network (the records' `modelled_s@<net>`),
   split into compute (the summary's `worker_step_s`, one worker's measured
   step) and sync (the rest); and γ/K (the records' `gamma_normalized`, the
   trainer's EWMA of Eq. 2) at step --profile_steps.
2. Run to the target: (K_min, B_min) and (K_max, B_max) (or --target_runs)
   trained for --max_steps; each gives its γ/K (at step --profile_steps, as
   the profiles) and its epochs to the target = the first evaluation at
   --target test accuracy × B / D. The epoch model e = e* + θ·γ/K is fitted
   on each run's own γ/K (--epoch_noise=measured, the paper) or on the γ/K
   the search predicts at its (K, B) (predicted: the same predictor as the
   table's epochs; the two differ when γ/K depends on K at a fixed B).
3. Fit the affine models, search, print the table (plan.md, plan.json) and
   plot cost against time with the Pareto front and the choice (plan.png).
4. Train the chosen configuration to the target (a run of step 2 is reused)
   and compare predicted and actual modelled time and cost.

  python experiments/plan.py --workdir=/tmp/plan
  python experiments/plan.py --workdir=/tmp/plan --search=full --objective=cost \
      --workers=4,8,16 --batches=128,256,512 --target=0.95 --price=0.13402 --max_cost=0.001

Time is modelled seconds; cost is time / 3600 × K × --price (per worker-hour).
The γ/K of a profile and of a long run are comparable because both are read
at step --profile_steps: the runs are the same until then while the learning
rate is warming up (--profile_steps <= config.optimizer.warmup_steps, as
with configs/digits.py), and close to it after. Finished runs in --workdir are
reused, so a second call with another --objective or caps trains nothing new
(--fresh: trains them again).
"""

import contextlib
import io
import json
import os
import sys
import warnings

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from jaxdist.train import cli

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'configs', 'digits.py')
config_flags.DEFINE_config_file('config', DIGITS, 'Config file of the job to plan.')
flags.DEFINE_string('workdir', None, 'Directory; each run trains in a subdirectory.')
flags.DEFINE_list('workers', ['4', '8', '16'], 'The K of the grid.')
flags.DEFINE_list('batches', ['128', '256', '512'], 'The global batches B of the grid.')
flags.DEFINE_enum('search', 'partial', ['partial', 'full'], 'Profile the corners or every point.')
flags.DEFINE_integer('profile_steps', 20, 'Steps of a profiling run; γ/K is read at this step.')
flags.DEFINE_float('target', 0.95, 'Test accuracy to train to.')
flags.DEFINE_integer('max_steps', 120, 'Steps of a run to the target (the learning-rate schedule).')
flags.DEFINE_integer('eval_every', 2, 'Evaluations every this many steps (the target resolution).')
flags.DEFINE_list('target_runs', None, 'K:B runs to the target (default: the grid corners).')
flags.DEFINE_enum(
  'epoch_noise',
  'measured',
  ['measured', 'predicted'],
  'The γ/K of a run to the target that the epoch model is fitted on: its own (the paper), or '
  "the search's prediction at its (K, B) (the same predictor as the table's epochs).",
)
flags.DEFINE_float(
  'price', None, 'Price per worker-hour (default: config.cluster.price or 0.13402).'
)
flags.DEFINE_string('network', None, 'Network profile of the clock (default: the first).')
flags.DEFINE_enum('objective', 'knee', ['time', 'cost', 'knee'], 'What to minimise.')
flags.DEFINE_float('max_cost', None, 'Cap on the predicted cost.')
flags.DEFINE_float('max_time_s', None, 'Cap on the predicted time, seconds.')
flags.DEFINE_integer('max_batch', None, 'Cap on B (memory).')
flags.DEFINE_integer('min_workers', None, 'Least K.')
flags.DEFINE_integer('max_workers', None, 'Most K.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool('fresh', False, 'Train every run afresh, deleting those in --workdir.')
flags.mark_flags_as_required(['workdir'])
cli.integers('workers')
cli.integers('batches')
FLAGS = flags.FLAGS

PAPER_PRICE = 0.13402  # GCP e2-standard-4, $/hour, the paper's §V
COLUMNS = (
  ('K', 'K'),
  ('B', 'B'),
  ('step_s', 'step s'),
  ('gamma_normalized', 'γ/K'),
  ('epochs', 'epochs'),
  ('steps', 'steps'),
  ('time_s', 'time s'),
  ('cost', 'cost'),
  ('mark', ''),
)


def main(argv):
  del argv
  cli.setup(FLAGS.cpu_devices)
  command = ' '.join(['python', *sys.argv])
  cli.run(plan, FLAGS.config, FLAGS.workdir, command)


def plan(config, workdir: str, command: str) -> dict:
  """Steps 1–4 of the module docstring; returns what plan.json holds."""
  from jaxdist.control import scavenger
  from jaxdist.train import factory, ledger, metrics, report

  workers = sorted({int(k) for k in FLAGS.workers})
  batches = sorted({int(b) for b in FLAGS.batches})
  bad = [(k, b) for k in workers for b in batches if b % k]
  if bad:
    raise factory.ConfigError(f'every batch must be a multiple of every K; not so: {bad}')
  targets = [(workers[0], batches[0]), (workers[-1], batches[-1])]
  if FLAGS.target_runs:
    try:
      targets = [tuple(int(v) for v in s.split(':', 1)) for s in FLAGS.target_runs]
    except ValueError as e:
      raise factory.ConfigError(f'--target_runs takes K:B pairs, got {FLAGS.target_runs}') from e
  if any(len(t) != 2 or t[1] % t[0] for t in targets) or len(set(targets)) < 2:
    raise factory.ConfigError(
      f'--target_runs needs two K:B pairs at least, B a multiple of K; got {targets}'
    )
  exp = factory.build(config, workdir)
  if exp.clock(1.0) is not None:
    raise factory.ConfigError('plan.py models equal workers; clear config.cluster')
  net = FLAGS.network or next(iter(exp.networks))
  if net not in exp.networks:
    raise factory.ConfigError(f'--network {net!r} is not in config.network.profiles')
  price = FLAGS.price if FLAGS.price is not None else (config.cluster.price or PAPER_PRICE)
  size = len(exp.dataset.train)
  at = FLAGS.profile_steps
  sched = config.optimizer
  if sched.schedule != 'constant' and at > sched.warmup_steps:
    logging.warning(
      'profile_steps %d > warmup_steps %d: the profiles and the long runs differ before step %d',
      at, sched.warmup_steps, at,
    )  # fmt: skip

  trained = set()  # the runs this call trained (--fresh removes each one once)

  def run(kind: str, k: int, b: int, steps: int) -> tuple[dict, list[dict]]:
    c = config.copy_and_resolve_references()
    c.workers, c.batch_size, c.steps = k, b, steps
    c.eval_every, c.checkpoint_every, c.progress = min(FLAGS.eval_every, steps), steps, False
    where = os.path.join(workdir, kind, f'K{k}_B{b}')
    fresh = FLAGS.fresh and where not in trained
    trained.add(where)
    with contextlib.redirect_stdout(io.StringIO()):  # each run's own table: see its workdir
      summary = trainer().train_and_evaluate(c, where, fresh=fresh)
    records = metrics.read_jsonl(os.path.join(where, metrics.METRICS_FILE))
    print(f'{kind:7s} K={k:<3d} B={b:<5d} {steps} steps, test acc {summary["test_accuracy"]:.4f}')
    return summary, records

  def measure(kind: str, k: int, b: int, steps: int) -> dict:
    summary, records = run(kind, k, b, steps)
    where = f'the {kind} run K={k}, B={b}'
    compute_s = summary['worker_step_s']  # re-measured when a finished run is reused
    clock = [t for _, t in ledger.modelled_clock(records, net, compute_s)]
    step_s = float(np.median(np.diff([0.0, *clock])))  # the clock's per-step increments
    noise = [r for r in records if 'gamma_normalized' in r and r['step'] <= at]
    if not noise:
      raise factory.ConfigError(
        f"the records of {where} have no 'gamma_normalized' by step {at}: this trainer "
        'does not log the gradient noise (Scavenger’s γ)'
      )
    out = {
      'K': k, 'B': b, 'step_s': step_s, 'compute_s': compute_s, 'sync_s': step_s - compute_s,
      'gamma_normalized': noise[-1]['gamma_normalized'],
    }  # fmt: skip
    if kind == 'target':
      hit = next((r['step'] for r in records if r.get('test_accuracy', -1) >= FLAGS.target), None)
      if hit is None:
        best = max(r['test_accuracy'] for r in records if 'test_accuracy' in r)
        raise factory.ConfigError(
          f'{where} did not reach test accuracy {FLAGS.target} in {steps} steps (best {best:.4f});'
          ' raise --max_steps or lower --target'
        )
      time_s = ledger.time_to_accuracy(records, FLAGS.target, net, compute_s)[1]
      out.update(steps=hit, epochs=hit * b / size, time_s=time_s, cost=time_s / 3600 * k * price)
    return out

  # 1. profiles
  if FLAGS.search == 'full':
    points = [(k, b) for k in workers for b in batches]
  else:
    points = sorted({(k, b) for k in (workers[0], workers[-1]) for b in (batches[0], batches[-1])})
  profiles = [measure('profile', k, b, at) for k, b in points]
  # 2. runs to the target
  reached = {(k, b): measure('target', k, b, FLAGS.max_steps) for k, b in targets}

  # 3. fit, search, choose
  def epoch_noise(run: dict) -> float:
    """The γ/K that the epoch model sees for a run to the target (--epoch_noise)."""
    if FLAGS.epoch_noise == 'measured':
      return run['gamma_normalized']
    if FLAGS.search == 'partial':
      g0, g1 = scavenger.fit_noise(rows)
      return g0 + g1 / run['B'] ** 0.5
    point = [p['gamma_normalized'] for p in profiles if (p['K'], p['B']) == (run['K'], run['B'])]
    if not point:
      raise ValueError(f'run K={run["K"]}, B={run["B"]} is not a profiled point of the grid')
    return point[0]

  rows = [
    scavenger.Profile(
      p['K'], p['B'], p['step_s'], p['compute_s'], p['sync_s'], p['gamma_normalized']
    )
    for p in profiles
  ]
  caps = {
    'max_cost': FLAGS.max_cost,
    'max_time_s': FLAGS.max_time_s,
    'max_batch': FLAGS.max_batch,
    'min_workers': FLAGS.min_workers,
    'max_workers': FLAGS.max_workers,
  }
  search = dict(dataset_size=size, price_per_hour=price)
  with warnings.catch_warnings(record=True) as notes:
    warnings.simplefilter('always')
    try:
      runs = [(epoch_noise(r), r['epochs']) for r in reached.values()]
      if FLAGS.search == 'full':
        model, table = None, scavenger.full_search(rows, runs, **search)
      else:
        model = scavenger.fit(rows, runs)
        table = scavenger.partial_search(rows, runs, workers=workers, batches=batches, **search)
      chosen = scavenger.choose(table, FLAGS.objective, **caps)
    except ValueError as e:  # unidentifiable fits, epochs out of range, caps no one meets
      raise factory.ConfigError(str(e)) from e
  front = scavenger.pareto_front(table)
  table_rows = [
    {
      **_row(p),
      'mark': ('chosen' if p == chosen else '') + (' pareto' if p in front else ''),
    }
    for p in table
  ]
  text = report.table(table_rows, COLUMNS)
  header = (
    f'{FLAGS.search} search, D = {size}, price {price}/worker-hour, network {net}, target test '
    f'accuracy {FLAGS.target}, epoch model on {FLAGS.epoch_noise} γ/K; objective {FLAGS.objective}'
  )
  print(f'\n{header}\n')
  if model is not None:
    print(
      f'fit: compute {model.c0:.3g} + {model.c1:.3g}·B/K s, sync {model.s0:.3g} + '
      f'{model.s1:.3g}·K s, other {model.other_s:.2g} s; γ/K = {model.g0:.3g} + '
      f'{model.g1:.3g}/√B; epochs = {model.e_star:.3g} {model.theta:+.3g}·γ/K\n'
    )
  print(text)
  for n in notes:
    print(f'note: {n.message}')
  # 4. the chosen configuration, trained to the target
  key = (chosen.num_workers, chosen.batch_size)
  actual = reached.get(key) or measure('target', *key, FLAGS.max_steps)
  compare = [
    {'what': name, 'predicted': getattr(chosen, name), 'actual': actual[name]}
    for name in ('step_s', 'gamma_normalized', 'epochs', 'steps', 'time_s', 'cost')
  ]
  for c in compare:
    c['error'] = f'{(c["predicted"] - c["actual"]) / c["actual"]:+.1%}'
  note = ' (a run to the target of step 2: its epochs were in the fit)' if key in reached else ''
  print(f'\nchosen K={key[0]}, B={key[1]}{note}: predicted vs actual\n')
  columns = (('what', ''), ('predicted', 'predicted'), ('actual', 'actual'), ('error', 'error'))
  print(report.table(compare, columns))

  plot_path = os.path.join(workdir, 'plan.png')
  report.save(_plot(table, front, chosen, actual, net), plot_path)
  parts = [report.provenance(command), header, report.markdown(table_rows, COLUMNS)]
  parts += [f'Note: {n.message}' for n in notes]
  parts += [f'Chosen K={key[0]}, B={key[1]}{note}:', report.markdown(compare, columns)]
  markdown = '\n\n'.join(parts) + '\n'
  metrics.write_atomic(os.path.join(workdir, 'plan.md'), markdown)
  out = {
    'search': FLAGS.search, 'objective': FLAGS.objective, 'caps': caps, 'network': net,
    'price_per_hour': price, 'dataset_size': size, 'target': FLAGS.target,
    'profiles': profiles, 'target_runs': list(reached.values()),
    'model': model._asdict() if model else None,
    'table': [p._asdict() for p in table], 'chosen': chosen._asdict(), 'actual': actual,
    'compare': compare,
  }  # fmt: skip
  metrics.write_atomic(os.path.join(workdir, 'plan.json'), json.dumps(out, indent=2))
  print(f'\ntable: {os.path.join(workdir, "plan.md")}\nplot:  {plot_path}')
  return out


def trainer():
  """`jaxdist.train` (imported late: after the CPU devices are set)."""
  from jaxdist import train

  return train


def _row(p) -> dict:
  return {
    'K': p.num_workers, 'B': p.batch_size, 'step_s': p.step_s,
    'gamma_normalized': p.gamma_normalized, 'epochs': p.epochs, 'steps': p.steps,
    'time_s': p.time_s, 'cost': p.cost,
  }  # fmt: skip


def _plot(table, front, chosen, actual, net):
  """Predicted cost against time: every configuration, the Pareto front, the choice, the run."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(6.4, 4.4))
  ax = fig.subplots()
  ax.plot([p.time_s for p in table], [p.cost for p in table], 'o', color='0.6', label='predicted')
  for p in table:
    ax.annotate(f'{p.num_workers}×{p.batch_size}', (p.time_s, p.cost), fontsize=7,
                xytext=(3, 3), textcoords='offset points')  # fmt: skip
  ax.plot([p.time_s for p in front], [p.cost for p in front], '-', color='C0', label='Pareto front')
  ax.plot(chosen.time_s, chosen.cost, '*', ms=14, color='C3', label='chosen (predicted)')
  ax.plot(actual['time_s'], actual['cost'], 'x', ms=10, mew=2, color='k', label='chosen (run)')
  ax.set(xlabel=f'modelled time to target (s) @ {net}', ylabel='cost (price × worker-hours)')
  ax.grid(alpha=0.3)
  ax.legend(loc='best', fontsize='small')
  fig.tight_layout()
  return fig


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
