"""bench_hetero.py's figures: each host's measured steps, the cluster model's, times and targets.

No flags and no runs here: the arithmetic on a finished run's files (each
process's `hosts/process<i>.json`, process 0's `metrics.jsonl`), so that the
tests can check it by hand.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np

MODEL_WITHIN = 0.15  # issue 47: the per-worker clock within 15 % of the measured step
DYNAMIC_AT_MOST = 0.6  # dynamic batching's time to target, as a multiple of BSP's
WINDOW_AT_MOST = 0.7  # heterogeneity-aware DiLoCo's, as a multiple of plain DiLoCo's
# the variants whose per-host clock model gets a target row (the issue names BSP, dynamic
# batching and local SGD; the others, where a group has them, are checked the same way)
MODELLED = ('bsp', 'dynamic_micro', 'local4', 'selsync', 'diloco', 'ddl', 'scadles')


def host_times(workdir: str, k: int) -> list[dict]:
  """Each process's own step times and compute term (`StepLog.close`)."""
  out = []
  for i in range(k):
    with open(os.path.join(workdir, 'hosts', f'process{i}.json')) as f:
      out.append(json.load(f))
  return out


def host_line(b1: int, b2: int, t1: float, t2: float) -> tuple[float, float]:
  """A host's step a + b / v through its median steps t1 at batch b1 and t2 at b2 > b1: (a, v).

  A step that grows faster than its batch between the two (a negative a: on the GPT tiny,
  4 windows took 14 ms and 16 took 73 on one core) gets a = 0 and the line through the
  origin and (b2, t2), so the larger batch, the one the runs train, is still priced exactly.
  """
  per_example = max((t2 - t1) / (b2 - b1), 1e-12)
  fixed = t1 - per_example * b1
  if fixed < 0:
    fixed, per_example = 0.0, t2 / b2
  return float(fixed), float(1 / per_example)


def equalising(lines: list[tuple[float, float]], total: int, multiple: int) -> list[int]:
  """Batches summing to `total` in whole `multiple`s that equalise a_k + b_k / v_k: each unit
  to the host whose step it lengthens least (every host gets one first)."""
  batches = [multiple] * len(lines)
  time = lambda k, b: lines[k][0] + b / lines[k][1]
  for _ in range(total // multiple - len(lines)):
    k = min(range(len(lines)), key=lambda k: time(k, batches[k] + multiple))
    batches[k] += multiple
  return batches


def evaluated(record: dict) -> bool:
  """Whether the step evaluated (its record holds a test metric)."""
  return any(k.startswith('test_') and v is not None for k, v in record.items())


def timed_steps(records: list[dict], skip: int) -> list[int]:
  """The steps the means use: after the first `skip`, less the evaluating ones and the next."""
  done = {r['step'] for r in records if evaluated(r)}
  return [
    r['step'] for r in records[skip:] if r['step'] not in done and r['step'] - 1 not in done
  ]  # fmt: skip


def measured_steps(times: list[dict], steps: list[int]) -> list[float]:
  """Each host's mean step over `steps`, seconds."""
  out = []
  for t in times:
    by_step = {s: v for s, v, _ in t['steps']}
    out.append(statistics.mean(by_step[s] for s in steps))
  return out


def timeline(records: list[dict], lines, comm: str, per_worker: int, every_step: bool = False):
  """The run on the cluster model: `jd.netmodel.simulate` of its batches, comm and barriers (its
  synchronising steps, or `every_step`: a method that communicates every step, as SelSync's
  flags, waits for all every step)."""
  from jaxdist import netmodel

  fixed, speeds = zip(*lines, strict=True)
  return netmodel.simulate(
    netmodel.Cluster(speeds, fixed_s=fixed), batches_of(records, len(lines), per_worker), 1.0,
    comm_s=[r.get(comm) or 0.0 for r in records],
    synced=[every_step or bool(r.get('synced')) for r in records], wait='periodic',
  )  # fmt: skip


def stream_timeline(records: list[dict], lines, comm: str, config: dict):
  """A run whose data stream in (`config.cluster.stream_rates`) on the cluster model: before
  each step the streams' wait for data (`jd.control.streams`, the barrier W), then every host
  computes its batch, a_k + b_k / v_k, and the step ends with the slowest and its
  communication; the streams then advance by that step. (finish_s, compute_s, wait_s) [T, K],
  a host's wait being W and its wait for the slowest. The streams are the run's own, built
  from its `config.json` as the trainer built them."""
  from types import SimpleNamespace

  import ml_collections

  from jaxdist.train.factory import cluster as cluster_lib

  k, cfg = len(lines), ml_collections.ConfigDict(config)
  model = cluster_lib.build_batching(cfg, cluster_lib.build_cluster(cfg.cluster, k))
  fixed, speeds = (np.asarray(v) for v in zip(*lines, strict=True))
  state, clock, out = model.init(k), 0.0, SimpleNamespace(finish_s=[], compute_s=[], wait_s=[])
  for r in records:
    compute = fixed + state.batches / speeds
    step_s, barrier = compute.max() + (r.get(comm) or 0.0), float(state.wait_s.max())
    clock += barrier + step_s
    out.finish_s.append(np.full(k, clock))
    out.compute_s.append(compute)
    out.wait_s.append(barrier + compute.max() - compute)
    state = model.update(state, step_s)
  return SimpleNamespace(**{name: np.asarray(v) for name, v in vars(out).items()})


def batches_of(records: list[dict], k: int, per_worker: int) -> np.ndarray:
  """[steps, K] each worker's batch (uniform runs record none: B / K)."""
  return np.asarray([r.get('batches') or [per_worker] * k for r in records], float)


def _comm_key(record: dict, profile: str) -> str:
  keys = [k for k in record if k.startswith('comm_s@')]
  return next((k for k in keys if profile in k), keys[-1] if keys else '')


def time_to(
  records: list[dict], target: float, skip: int, metric: str = 'test_accuracy'
) -> tuple[float | None, int | None]:
  """(process 0's training seconds, step) to the first evaluation of `metric` at `target` or
  better (an accuracy at least it, a loss at most it).

  Training seconds: the steps' own times summed from the end of the first
  `skip` (their one-off compiles: the step's, the metrics' gather's, an
  evaluation's, the same for every method; on a 0.1-core host seconds each),
  each step that evaluated, or follows one, counted as the median step (its
  time holds the evaluation)."""
  from jaxdist.train import ledger

  median = statistics.median(r['step_s'] for r in records[skip:] if r.get('step_s'))
  total, after = 0.0, False
  for r in records:
    now = evaluated(r)
    if r['step'] > skip:
      total += median if now or after or not r.get('step_s') else r['step_s']
    if ledger.reached(r.get(metric), target, metric):
      return total, r['step']
    after = now
  return None, None


def final(records: list[dict], metric: str = 'test_accuracy') -> float | None:
  """The last evaluation's `metric` (None if none evaluated)."""
  values = [r[metric] for r in records if r.get(metric) is not None]
  return values[-1] if values else None


HOST_COLUMNS = [
  ('variant', 'variant'), ('host', 'host'), ('cpu', 'cores'), ('rate', 'link Mbit/s'),
  ('batch', 'batch'), ('compute_ms', 'modelled compute ms'), ('wait_ms', 'modelled wait ms'),
  ('modelled_ms', 'modelled step ms'), ('measured_ms', 'measured step ms'),
  ('ratio', 'measured ÷ modelled'),
]  # fmt: skip


def run_columns(metric: str = 'test_accuracy') -> list[tuple[str, str]]:
  """The per-variant table's columns, its final `metric` second."""
  return [
    ('variant', 'variant'), ('final', 'test acc' if metric == 'test_accuracy' else metric),
    ('step', 'target at step'), ('seconds', 'time to target s'), ('versus', 'vs first'),
    ('modelled', 'modelled time s'),
  ]  # fmt: skip


TARGET_COLUMNS = [('target', 'target'), ('figure', 'figure'), ('holds', 'holds')]


def host_rows(name: str, result: dict, cpu: list, rates: list) -> list[dict]:
  """One variant's line per host: its batch, the model's step and the measured one."""
  rows = []
  for i, measured in enumerate(result['measured']):
    modelled = result['modelled'][i]
    rows.append({
      'variant': name, 'host': i, 'cpu': cpu[i] or 'all', 'rate': rates[i] or 'unlimited',
      'batch': result['batch'][i], 'compute_ms': 1e3 * result['compute'][i],
      'wait_ms': 1e3 * result['wait'][i], 'modelled_ms': 1e3 * modelled,
      'measured_ms': 1e3 * measured, 'ratio': measured / modelled,
    })  # fmt: skip
  return rows


def collect(workdir: str, k: int, lines, profile: str, skip: int) -> dict:
  """A finished run's figures: per host measured and modelled, and its records."""
  from jaxdist.train import metrics

  records = metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  times = host_times(workdir, k)
  rows = [s - 1 for s in timed_steps(records, skip)]
  from jaxdist.train import methods

  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  per_worker, method = config['batch_size'] // k, config['sync']['method']
  every_step = methods.get(method).wait(config['sync'].get(method, {}), k)['wait'] == 'bsp'
  comm = _comm_key(records[-1], profile)
  if config['cluster'].get('stream_rates'):
    line = stream_timeline(records, lines, comm, config)
  else:
    line = timeline(records, lines, comm, per_worker, every_step)
  finish = np.vstack([np.zeros(k), line.finish_s])
  return {
    'records': records, 'measured': measured_steps(times, [r + 1 for r in rows]),
    'modelled': np.diff(finish, axis=0)[rows].mean(0), 'compute': line.compute_s[rows].mean(0),
    'wait': line.wait_s[rows].mean(0), 'finish': line.finish_s.max(1),
    'batch': batches_of(records, k, per_worker)[rows].mean(0),
  }  # fmt: skip


def run_rows(results: dict, target: float, skip: int, metric: str = 'test_accuracy') -> list[dict]:
  """Per variant: final `metric`, time to target after `skip` steps, measured (and against the
  first variant's) and modelled."""
  rows, first = [], None
  for name, result in results.items():
    seconds, step = time_to(result['records'], target, skip, metric)
    first = seconds if first is None else first
    finish = np.r_[0.0, result['finish']]  # the model's clock after each step
    rows.append({
      'variant': name, 'final': final(result['records'], metric), 'step': step,
      'seconds': seconds, 'versus': seconds / first if seconds and first else None,
      'modelled': None if step is None else float(finish[step] - finish[min(skip, step)]),
    })  # fmt: skip
  return rows


def target_rows(results: dict, runs: list[dict], model_variants: tuple[str, ...]) -> list[dict]:
  """Issue 47's targets on this run: the clock model per host, dynamic batching's speed-up."""
  rows = []
  for name in model_variants:
    if name in results:
      r = results[name]
      worst = max(abs(m / p - 1) for m, p in zip(r['measured'], r['modelled'], strict=True))
      rows.append({
        'target': f'{name}: model within {MODEL_WITHIN:.0%} of the measured step on every host',
        'figure': f'worst {worst:.1%}', 'holds': 'holds' if worst <= MODEL_WITHIN else 'not',
      })  # fmt: skip
  by = {row['variant']: row for row in runs}
  base, dyn = by.get('bsp'), by.get('dynamic_micro')
  if base and dyn and base['seconds'] and dyn['seconds']:
    ratio = dyn['seconds'] / base['seconds']
    gap = 100 * abs(dyn['final'] - base['final'])
    rows.append({
      'target': f'dynamic batching (micro-batches): time to target ≤ {DYNAMIC_AT_MOST}x BSP',
      'figure': f'{ratio:.2f}x', 'holds': 'holds' if ratio <= DYNAMIC_AT_MOST else 'not',
    })  # fmt: skip
    rows.append({
      'target': 'dynamic batching: final accuracy within 0.5 pp of BSP',
      'figure': f'{gap:.2f} pp', 'holds': 'holds' if gap <= 0.5 else 'not',
    })  # fmt: skip
  plain, window = by.get('diloco'), by.get('window')
  if plain and window:
    ratio = window['seconds'] / plain['seconds'] if window['seconds'] and plain['seconds'] else None
    rows.append({
      'target': f'heterogeneity-aware DiLoCo: time to target ≤ {WINDOW_AT_MOST}x plain DiLoCo',
      'figure': 'not reached' if ratio is None else f'{ratio:.2f}x',
      'holds': 'holds' if ratio is not None and ratio <= WINDOW_AT_MOST else 'not',
    })  # fmt: skip
  return rows


def figure(hosts: list[dict], runs: list[dict]):
  """Per host and variant, measured against modelled step; per variant, time to target."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=(11, 4), layout='constrained')
  left, right = fig.subplots(1, 2, width_ratios=(2, 1))
  variants = list(dict.fromkeys(h['variant'] for h in hosts))
  per = max(h['host'] for h in hosts) + 1
  width = 0.8 / per
  for j in range(per):
    mine = [h for h in hosts if h['host'] == j]
    x = np.array([variants.index(h['variant']) for h in mine]) + (j - (per - 1) / 2) * width
    label = f'host {j} ({mine[0]["cpu"]} core)'
    left.bar(x, [h['measured_ms'] for h in mine], width, label=f'{label}, measured')
    left.plot(x, [h['modelled_ms'] for h in mine], 'k_', markersize=14, markeredgewidth=2)
  left.plot([], [], 'k_', markersize=14, markeredgewidth=2, label='modelled')
  left.set_xticks(range(len(variants)), variants)
  left.set_ylabel('mean step (ms)')
  left.set_title('each host: measured step against the cluster model')
  left.legend(fontsize=8)
  timed = [r for r in runs if r['seconds']]
  right.bar([r['variant'] for r in timed], [r['seconds'] for r in timed], color='C1')
  right.set_ylabel('seconds to target (measured)')
  right.set_title('time to target')
  right.tick_params(axis='x', labelrotation=30, labelsize=8)
  return fig
