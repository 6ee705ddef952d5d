r"""jaxdist beside PyTorch DDP on the same digits work (../shared/peers/side_by_side.sh).

The work of the peers' script: the digits CNN (151,306 parameters) with 8
workers, global batch 128, SGD lr 0.05 momentum 0.9 (no Nesterov, no weight
decay), constant schedule, 300 steps; dense all-reduce, PowerSGD rank 2,
local SGD period 4 after 10 dense steps, and Top-k 1% with error feedback
over an all-gather of values and indices (jaxdist only: DDP has no Top-k
hook). jaxdist runs its 8 workers on 8 CPU devices in this process.

With --torch_python (a Python that has torch, scikit-learn and numpy), the
same invocation also runs the peers' `torch_ddp_digits.py` from --peers_dir
with the settings side_by_side.sh passes (`--world_size 8 --steps N
--match_jaxdist` and `--hook none`, `--hook powersgd2` or
`--local_sgd_period 4`), one subprocess per method with a timeout, and
prints one table with both sides. Interleaved per method: DDP's run of a
method, then jaxdist's, then the next method, so that both halves of a row
see the machine in the same state. DDP times the steps after its first 20%
(median); jaxdist the median of all steps' fetch-to-fetch times (robust to
the compile step and to evaluation/checkpoint steps). Payloads are bytes
each worker hands to the collective per step, averaged over the run: DDP's
are its script's analytic figures, and its PowerSGD starts after 10 dense
steps (`start_powerSGD_iter`) where jaxdist's compresses from the first.

--repeats=R runs each jaxdist method R times: after the first pass, the
jaxdist methods run again in turn, R - 1 times; a method's ms is the median
of its runs' medians, its ratio to dense the median of the passes' own
ratios (each pass's runs saw the machine in the same state), and every
pass's ratios are listed under the table (on this 2-core machine a ratio
moves by about 0.05 between runs).

--results writes the table as markdown with the command, machine, date and
load average; --out appends one JSON line per run in the peers' format
(DDP's as its script printed it). A failed DDP run leaves its cells empty,
is reported under the table, and makes the exit status 1.

  python experiments/bench_peers.py --workdir=/tmp/peers
  python experiments/bench_peers.py --workdir=/tmp/peers --torch_python=/work/torchenv/bin/python \
      --repeats=3 --results=experiments/results/peers_bench.md
"""

import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peer_ddp import DDP_ARGS, PEER_SCRIPT, PEERS_DIR, run_ddp
from peer_ddp import ok as _ok

FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = 8  # side_by_side.sh: DDP's --world_size and jaxdist's workers
VARIANTS_DIR = os.path.join(REPO, 'configs', 'variants')
VARIANTS = os.path.join(VARIANTS_DIR, 'peers.py')  # the methods, in the order they run
LABELS = {
  'dense': 'dense',
  'powersgd2': 'PowerSGD rank 2',
  'local4': 'local SGD, period 4',
  'topk1_ef': 'Top-k 1% all-gather, EF',
  'dgc1': 'DGC 1% all-gather, EF (sampled threshold)',
}
# side_by_side.sh's workers; the rest of its settings are the variants file's SETTINGS
SETTINGS = {'workers': WORKERS, 'progress': False}
TARGET_DENSE_VS_DDP = 0.5  # target: jaxdist's dense step at most this times DDP's
# targets: step ÷ dense at most these (the Top-k one held to both the exact and DGC's)
TARGET_RATIOS = {'powersgd2': 1.1, 'topk1_ef': 1.2, 'dgc1': 1.2}


flags.DEFINE_string('workdir', None, 'Directory; each jaxdist method trains in a subdirectory.')
flags.DEFINE_string('out', None, "Append the peers' JSON lines here.")
flags.DEFINE_string('results', None, 'Also write the table as markdown here, with the command.')
flags.DEFINE_integer('steps', 300, 'Training steps (the peers: 300).')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool('fresh', False, 'Train every jaxdist run afresh, deleting those in --workdir.')
flags.DEFINE_string(
  'torch_python', None, 'A Python with torch: also run DDP (the peers) on the same work.'
)
flags.DEFINE_string('peers_dir', PEERS_DIR, f"The folder holding the peers' {PEER_SCRIPT}.")
flags.DEFINE_float(
  'compute_budget_s',
  2.0,
  "Seconds each jaxdist run spends timing one worker's step for the modelled clock "
  '(config.network.compute_budget_s; the table reports wall-clock steps, not that).',
)
flags.DEFINE_float('torch_timeout_s', 600, 'Kill a DDP run after this long (side_by_side.sh).')
flags.DEFINE_integer(
  'repeats',
  1,
  'Runs of each jaxdist method: after the first pass (DDP, then jaxdist, per method) every '
  "jaxdist method runs again in turn, repeats - 1 times; its ms is the median of its runs' "
  'medians, and each pass gives its own ratios to dense.',
  lower_bound=1,
)
flags.mark_flags_as_required(['workdir'])


def ddp_command(torch_python: str, peers_dir: str, method: str, steps: int) -> list[str]:
  """The peers' DDP run of `method`, with side_by_side.sh's settings."""
  script = os.path.join(peers_dir, PEER_SCRIPT)
  args = ['--world_size', str(WORKERS), '--steps', str(steps), '--match_jaxdist']
  return [torch_python, script, *args, *DDP_ARGS[method], '--tag', 'side_by_side']


def _ddp_payload(line: Mapping[str, Any]) -> float | None:
  """DDP's bytes per worker per step, averaged over the run (warm-up steps included)."""
  avg = line.get('bytes_per_rank_per_step_avg_over_run_analytic')
  return avg if avg is not None else line.get('bytes_per_rank_per_step_analytic')


def _div(a: float | None, b: float | None) -> float | None:
  return a / b if a is not None and b else None


def side_by_side_rows(
  summaries: Mapping[str, Mapping[str, Any]], ddp: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
  """One row per jaxdist method (its summary.json) with DDP's JSON line beside it, if any.

  Numbers stay numbers (ms, ratios, accuracy as a fraction, bytes); `fmt`
  turns them into the table's cells. A DDP line with an 'error' counts as
  no run.
  """
  ddp = ddp or {}
  ms = lambda s: 1000 * s['median_step_s'] if s.get('median_step_s') is not None else None
  jd_dense = ms(summaries['dense']) if 'dense' in summaries else None
  ddp_dense = ddp['dense']['median_step_ms'] if _ok(ddp.get('dense')) else None
  rows = []
  for name, s in summaries.items():
    line = ddp.get(name)
    jd_ms = ms(s)
    ddp_ms = line['median_step_ms'] if _ok(line) else None
    rows.append({
      'variant': name, 'method': LABELS.get(name, name),
      'jd_ms': jd_ms, 'ddp_ms': ddp_ms, 'jd_vs_ddp': _div(jd_ms, ddp_ms),
      'jd_ratio': _pass_ratio(s, summaries.get('dense')) or _div(jd_ms, jd_dense),
      'ddp_ratio': _div(ddp_ms, ddp_dense),
      'jd_acc': s.get('test_accuracy'), 'ddp_acc': line.get('test_acc') if _ok(line) else None,
      'jd_payload': s.get('payload_bytes_per_step'),
      'ddp_payload': _ddp_payload(line) if _ok(line) else None,
      'ddp_error': line.get('error') if line is not None and not _ok(line) else None,
    })  # fmt: skip
  return rows


def _pass_ratio(s: Mapping[str, Any], dense: Mapping[str, Any] | None) -> float | None:
  """With repeats, the median over passes of each pass's step ÷ that pass's dense step.

  Each pass's pair of runs saw the machine in the same state, so this is steadier than
  the ratio of the medians; None without repeats (or with a pass missing a figure).
  """
  mine = s.get('runs_median_step_s') or []
  base = (dense or {}).get('runs_median_step_s') or []
  ratios = _per_pass(mine, base)
  if len(mine) < 2 or len(mine) != len(base) or any(r is None for r in ratios):
    return None
  return statistics.median(ratios)


def _per_pass(mine: Sequence[float | None], dense: Sequence[float | None]) -> list[float | None]:
  """Each pass's step ÷ that pass's dense step; None where either is missing."""
  return [_div(a, b) for a, b in zip(mine, dense, strict=False)]


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """One method's runs (summary.json each) as one summary: the median of their median steps.

  Accuracy and payload come from the first run; every run trains the same steps from the
  same seed, and `pass_notes` reports any run whose accuracy differs.
  """
  steps = [r['median_step_s'] for r in runs if r.get('median_step_s') is not None]
  out = dict(runs[0])
  out['median_step_s'] = statistics.median(steps) if steps else None
  out['runs_median_step_s'] = [r.get('median_step_s') for r in runs]
  return out


def pass_notes(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
  """With repeats, one line per pass: each method's step ÷ that pass's dense step."""
  passes = max((len(r) for r in runs.values()), default=0)
  if passes < 2 or 'dense' not in runs:
    return []
  steps = {name: [r.get('median_step_s') for r in rs] for name, rs in runs.items()}
  ratios = {name: _per_pass(s, steps['dense']) for name, s in steps.items() if name != 'dense'}
  out = []
  for i in range(passes):
    cells = []
    for name, rs in ratios.items():
      if i < len(steps[name]):
        ratio = rs[i] if i < len(rs) else None
        cells.append(f'{name} {"-" if ratio is None else f"{ratio:.2f}"}')
    out.append(f'pass {i + 1}, step ÷ dense: ' + ', '.join(cells))
  for name, rs in runs.items():
    accs = [r.get('test_accuracy') for r in rs]
    if any(a != accs[0] for a in accs):
      out.append(f'{name}: accuracy differs between runs: {accs}')
  return out


def fmt(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The rows' numbers as the table's cells (None stays None: '-')."""
  form = {
    'jd_ms': '{:.1f}', 'ddp_ms': '{:.1f}', 'jd_vs_ddp': '{:.2f}', 'jd_ratio': '{:.2f}',
    'ddp_ratio': '{:.2f}', 'jd_acc': '{:.2%}', 'ddp_acc': '{:.2%}', 'jd_payload': '{:,.0f}',
    'ddp_payload': '{:,.0f}',
  }  # fmt: skip
  return [
    {k: (form[k].format(v) if k in form and v is not None else v) for k, v in r.items()}
    for r in rows
  ]


def columns(with_ddp: bool) -> list[tuple[str, str]]:
  """(key, heading) of the table: both sides, or jaxdist's alone."""
  if not with_ddp:
    return [
      ('method', 'method'),
      ('jd_ms', f'median step ms ({WORKERS} workers)'),
      ('jd_ratio', '÷ dense'),
      ('jd_acc', 'test acc'),
      ('jd_payload', 'payload B/worker/step'),
    ]
  return [
    ('method', 'method'),
    ('jd_ms', 'jaxdist median step ms'),
    ('ddp_ms', 'DDP median step ms'),
    ('jd_vs_ddp', 'jaxdist ÷ DDP'),
    ('jd_ratio', 'jaxdist ÷ its dense'),
    ('ddp_ratio', 'DDP ÷ its dense'),
    ('jd_acc', 'jaxdist acc'),
    ('ddp_acc', 'DDP acc'),
    ('jd_payload', 'jaxdist payload B/worker/step'),
    ('ddp_payload', 'DDP payload B/worker/step'),
  ]


def targets(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """The targets against this run: one line each, 'met' or 'not met' (or no figure)."""
  by = {r['variant']: r for r in rows}
  out = []

  def check(what: str, value: float | None, limit: float) -> None:
    if value is None:
      out.append(f'{what}: no figure in this run')
    else:
      out.append(f'{what}: {value:.3f} ({"met" if value <= limit else "not met"})')

  dense_vs_ddp = by.get('dense', {}).get('jd_vs_ddp')
  check(f"jaxdist's dense step ÷ DDP's ≤ {TARGET_DENSE_VS_DDP}", dense_vs_ddp, TARGET_DENSE_VS_DDP)
  for name, limit in TARGET_RATIOS.items():
    check(f'{LABELS[name]} ÷ dense ≤ {limit}', by.get(name, {}).get('jd_ratio'), limit)
  pairs = [(r['method'], r['jd_acc'], r['ddp_acc']) for r in rows if r.get('ddp_acc') is not None]
  if pairs:
    behind = [f'{m} ({a:.2%} < {b:.2%})' for m, a, b in pairs if not a >= b]  # NaN: behind
    verdict = 'not met: ' + ', '.join(behind) if behind else 'met'
    out.append(f"accuracy ≥ DDP's for every method DDP ran: {verdict}")
  return out


def peer_line(name: str, summary: Mapping[str, Any]) -> dict[str, Any]:
  """jaxdist's run `name` as one JSON line in the peers' format."""
  return {
    'system': 'jaxdist', 'hook': name, 'world_size': summary['workers'],
    'median_step_ms': round(1000 * summary['median_step_s'], 3),
    'test_acc': round(summary['test_accuracy'], 4),
    'payload_bytes': summary['payload_bytes_per_step'], 'tag': 'side_by_side',
  }  # fmt: skip


def _append(path: str | None, line: Mapping[str, Any]) -> None:
  if path:
    with open(path, 'a') as f:
      f.write(json.dumps(line) + '\n')


def _load() -> str:
  return ', '.join(f'{x:.2f}' for x in os.getloadavg())


def _check_peers(torch_python: str) -> None:
  """Ends the binary (exit status 2) unless the peers' script and `torch_python` are there."""
  script = os.path.join(FLAGS.peers_dir, PEER_SCRIPT)
  if not os.path.isfile(script):
    print(f'error: --peers_dir={FLAGS.peers_dir} has no {PEER_SCRIPT}', file=sys.stderr)
    sys.exit(2)
  if not os.access(torch_python, os.X_OK):
    print(f'error: --torch_python={torch_python} is not an executable file', file=sys.stderr)
    sys.exit(2)


def run_all(
  configs: Mapping[str, Any], torch_python: str | None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
  """Trains every method (DDP's run first, where it has one), then the repeats.

  Returns each method's jaxdist summaries (one per pass) and DDP's JSON lines.
  """
  from jaxdist.train import cli, trainer

  runs, ddp = {}, {}

  def train(config, workdir: str) -> dict[str, Any]:
    if not FLAGS.fresh and os.path.exists(os.path.join(workdir, trainer.SUMMARY_FILE)):
      print(f'warning: {workdir} holds a finished run: its times are from then, not now')
    cli.run(trainer.train_and_evaluate, config, workdir, fresh=FLAGS.fresh)
    with open(os.path.join(workdir, trainer.SUMMARY_FILE)) as f:
      return json.load(f)

  for name, config in configs.items():
    if torch_python and name in DDP_ARGS:
      command = ddp_command(torch_python, FLAGS.peers_dir, name, FLAGS.steps)
      print(f'\n=== DDP {name}: {" ".join(command[1:])}', flush=True)
      ddp[name] = run_ddp(command, FLAGS.torch_timeout_s)
      _append(FLAGS.out, ddp[name])
      if _ok(ddp[name]):
        print(f'median step {ddp[name]["median_step_ms"]:.1f} ms, acc {ddp[name]["test_acc"]}')
      else:
        print(f'DDP run failed: {ddp[name]["error"]}')
    workdir = os.path.join(FLAGS.workdir, name)
    print(f'\n=== jaxdist {name}', flush=True)
    runs[name] = [train(config, workdir)]
    _append(FLAGS.out, peer_line(name, runs[name][0]))
  for i in range(1, FLAGS.repeats):
    for name, config in configs.items():
      print(f'\n=== jaxdist {name}, pass {i + 1} of {FLAGS.repeats}', flush=True)
      runs[name].append(train(config, os.path.join(FLAGS.workdir, f'{name}.{i + 1}')))
      _append(FLAGS.out, peer_line(name, runs[name][-1]))
  return runs, ddp


def print_all(
  runs: Mapping[str, Sequence[Mapping[str, Any]]],
  ddp: Mapping[str, Mapping[str, Any]],
  torch_python: str | None,
  loads: tuple[str, str],
) -> list[tuple[str, str]]:
  """Prints the table, the targets and the notes (and writes --results); returns DDP's failures.

  `loads`: the load average before and after the runs.
  """
  from jaxdist.train import report

  summaries = {name: combine(rs) for name, rs in runs.items()}
  rows = side_by_side_rows(summaries, ddp)
  cols = columns(bool(torch_python))
  if torch_python:
    versions = sorted({line['torch'] for line in ddp.values() if 'torch' in line})
    title = (
      f'PyTorch {", ".join(versions) or "?"} DDP (gloo, {WORKERS} processes) beside jaxdist '
      f'({WORKERS} workers on {FLAGS.cpu_devices} CPU devices, one process), the work of '
      f'../shared/peers/side_by_side.sh, {FLAGS.steps} steps; per method DDP ran, then jaxdist'
    )
  else:
    title = f'jaxdist, the work of ../shared/peers/side_by_side.sh, {FLAGS.steps} steps'
  notes = [f'load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]}']
  if FLAGS.repeats > 1:
    notes.append(
      f"jaxdist ms: the median of {FLAGS.repeats} runs' median steps, and ÷ its dense the "
      "median of the passes' ratios; the first pass ran each method after its DDP run, the "
      'others ran the jaxdist methods in turn'
    )
  notes += pass_notes(runs)
  if torch_python:
    notes += [
      "DDP has no Top-k comm hook: that row is jaxdist's alone",
      'payload: bytes each worker hands to the collective per step, averaged over the run; '
      "DDP's PowerSGD sends dense for its first 10 steps, jaxdist's compresses from the first",
    ]
  failed = [(n, r['ddp_error']) for n, r in zip(summaries, rows, strict=True) if r['ddp_error']]
  notes += [f'DDP run {n} failed: {e}' for n, e in failed]
  checks = targets(rows)
  print(f'\n{title}:\n')
  print(report.table(fmt(rows), cols))
  print()
  for line in checks + notes:
    print(line)
  if FLAGS.results:
    command = ' '.join(['python', 'experiments/bench_peers.py', *sys.argv[1:]])
    parts = [report.provenance(command), title + ':', report.markdown(fmt(rows), cols)]
    parts.append('\n'.join(f'- {line}' for line in checks + notes))
    with open(FLAGS.results, 'w') as f:
      f.write('\n\n'.join(parts) + '\n')
    print(f'results: {FLAGS.results}')
  return failed


def main(argv):
  del argv
  torch_python = FLAGS.torch_python
  if torch_python:  # before anything trains
    _check_peers(torch_python)
  from jaxdist.train import cli

  cli.setup(FLAGS.cpu_devices)
  from jaxdist.train import compare, factory

  base = factory.load_config(
    os.path.join(REPO, 'configs', 'digits.py'),
    steps=FLAGS.steps,
    **SETTINGS,
    **{'network.compute_budget_s': FLAGS.compute_budget_s},
  )
  base, variants = cli.run(compare.choose, base, VARIANTS, folder=VARIANTS_DIR)
  configs = {name: cli.run(compare.variant_config, base, variants, name) for name in variants}
  load_before = _load()
  runs, ddp = run_all(configs, torch_python)
  if print_all(runs, ddp, torch_python, (load_before, _load())):
    sys.exit(1)


if __name__ == '__main__':
  app.run(main)
