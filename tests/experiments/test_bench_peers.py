"""experiments/bench_peers.py: jaxdist beside the peers' DDP, without torch (a fake peer script)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, binary_cmd, binary_env, load_experiment

TIMEOUT = 300

# Stands in for ../shared/peers/torch_ddp_digits.py: some noise on stdout, then one JSON line
# in the peers' format (DDP's figures for dense, PowerSGD and local SGD at 8 workers), with
# the arguments it was given. FAIL_HOOK names a run that fails the way the peers' script
# does: an error line and exit status 1.
FAKE_PEER = textwrap.dedent("""\
  import json, os, sys
  args = sys.argv[1:]
  hook = args[args.index('--hook') + 1] if '--hook' in args else 'none'
  if '--local_sgd_period' in args:
    hook = 'localsgd' + args[args.index('--local_sgd_period') + 1]
  ms = {'none': 40.0, 'powersgd2': 100.0, 'localsgd4': 36.0}[hook]
  payload = {'none': 605224, 'powersgd2': 34093.3, 'localsgd4': 166436.6}[hook]
  print('[W socket] gloo warning on stdout')
  line = {'hook': hook, 'world_size': 8, 'median_step_ms': ms, 'test_acc': 0.975,
          'bytes_per_rank_per_step_analytic': 4.0, 'torch': '9.9.9+fake', 'argv': args}
  if hook != 'none':
    line['bytes_per_rank_per_step_avg_over_run_analytic'] = payload
  else:
    line['bytes_per_rank_per_step_analytic'] = payload
  if hook == os.environ.get('FAIL_HOOK'):
    line = {'hook': hook, 'error': 'timeout: no finish within 300s (hang)', 'torch': '9.9.9+fake'}
  print(json.dumps(line), flush=True)
  sys.exit(1 if 'error' in line else 0)
""")


@pytest.fixture(scope='module')
def bench():
  return load_experiment('bench_peers')


@pytest.fixture
def peers_dir(tmp_path):
  path = tmp_path / 'peers'
  path.mkdir()
  (path / 'torch_ddp_digits.py').write_text(FAKE_PEER)
  return path


def summary(ms, acc, payload):
  return {'median_step_s': ms / 1000, 'test_accuracy': acc, 'payload_bytes_per_step': payload,
          'workers': 8}  # fmt: skip


def test_ddp_command_passes_side_by_side_sh_s_settings(bench):
  assert bench.ddp_command('py', '/p', 'powersgd2', 300) == [
    'py', '/p/torch_ddp_digits.py', '--world_size', '8', '--steps', '300', '--match_jaxdist',
    '--hook', 'powersgd2', '--tag', 'side_by_side',
  ]  # fmt: skip
  assert bench.ddp_command('py', '/p', 'local4', 3)[-4:] == [
    '--local_sgd_period', '4', '--tag', 'side_by_side'
  ]  # fmt: skip
  assert bench.ddp_command('py', '/p', 'dense', 3)[-4:-2] == ['--hook', 'none']
  from jaxdist.train import compare

  methods = compare.load_group(bench.VARIANTS).variants
  assert set(bench.DDP_ARGS) < set(methods) and 'topk1_ef' not in bench.DDP_ARGS


def test_peer_output_is_the_last_json_object_line():
  peer_ddp = load_experiment('peer_ddp')
  out = 'noise\n{"hook": "none", "median_step_ms": 1.5}\n{not json\n[1, 2]\n  \n'
  assert peer_ddp.parse_peer_output(out) == {'hook': 'none', 'median_step_ms': 1.5}
  assert peer_ddp.parse_peer_output('no json here\n') is None


def test_a_failed_ddp_run_is_an_error_line_not_an_exception(bench, peers_dir, monkeypatch):
  script = str(peers_dir / 'torch_ddp_digits.py')
  crash = [sys.executable, '-c', 'import sys; print("boom", file=sys.stderr); sys.exit(3)']
  assert bench.run_ddp(crash, 30) == {'error': 'exit status 3 and no JSON line; stderr: boom'}
  hang = [sys.executable, '-c', 'import time; time.sleep(30)']
  assert bench.run_ddp(hang, 0.5)['error'].startswith('timeout')
  monkeypatch.setenv('FAIL_HOOK', 'powersgd2')
  failed = bench.run_ddp([sys.executable, script, '--hook', 'powersgd2'], 30)
  assert failed['error'].startswith('timeout: no finish')
  ok = bench.run_ddp([sys.executable, script, '--hook', 'none'], 30)
  assert ok['median_step_ms'] == 40.0 and 'error' not in ok


def test_rows_put_ddp_beside_jaxdist_and_ratios_to_each_side_s_dense(bench):
  summaries = {
    'dense': summary(20.0, 0.99, 605224.0),
    'powersgd2': summary(22.0, 0.985, 14400.0),
    'local4': summary(15.0, 0.98, 166436.6),
    'topk1_ef': summary(30.0, 0.97, 12104.0),
  }
  ddp = {
    'dense': {'median_step_ms': 40.0, 'test_acc': 0.975,
              'bytes_per_rank_per_step_analytic': 605224},
    'powersgd2': {'median_step_ms': 100.0, 'test_acc': 0.99,
                  'bytes_per_rank_per_step_analytic': 14400,
                  'bytes_per_rank_per_step_avg_over_run_analytic': 34093.3},
    'local4': {'hook': 'localsgd4', 'error': 'worker died'},
  }  # fmt: skip
  rows = {r['variant']: r for r in bench.side_by_side_rows(summaries, ddp)}
  assert list(rows) == list(summaries)
  dense, psgd, local, topk = rows.values()
  assert dense['jd_vs_ddp'] == pytest.approx(0.5) and dense['ddp_ratio'] == 1.0
  assert psgd['jd_ratio'] == pytest.approx(1.1) and psgd['ddp_ratio'] == pytest.approx(2.5)
  assert psgd['jd_vs_ddp'] == pytest.approx(0.22) and psgd['ddp_payload'] == 34093.3
  assert dense['ddp_payload'] == 605224 and psgd['ddp_acc'] == 0.99
  assert local['ddp_ms'] is None and local['ddp_error'] == 'worker died'
  assert local['jd_ratio'] == pytest.approx(0.75) and local['jd_vs_ddp'] is None
  assert topk['ddp_ms'] is None and topk['ddp_error'] is None and topk['jd_ratio'] == 1.5
  cells = bench.fmt(rows.values())
  assert cells[0]['jd_acc'] == '99.00%' and cells[0]['jd_payload'] == '605,224'
  assert cells[1]['jd_vs_ddp'] == '0.22' and cells[2]['ddp_ms'] is None
  checks = bench.targets(list(rows.values()))
  assert checks == [
    "jaxdist's dense step ÷ DDP's ≤ 0.5: 0.500 (met)",
    'PowerSGD rank 2 ÷ dense ≤ 1.1: 1.100 (met)',
    'Top-k 1% all-gather, EF ÷ dense ≤ 1.2: 1.500 (not met)',
    'DGC 1% all-gather, EF (sampled threshold) ÷ dense ≤ 1.2: no figure in this run',
    "accuracy ≥ DDP's for every method DDP ran: not met: PowerSGD rank 2 (98.50% < 99.00%)",
  ]
  alone = bench.side_by_side_rows(summaries)  # no DDP: jaxdist's half, as before
  assert [h for _, h in bench.columns(False)] == [
    'method', 'median step ms (8 workers)', '÷ dense', 'test acc', 'payload B/worker/step'
  ]  # fmt: skip
  assert all(r['ddp_ms'] is None and r['ddp_error'] is None for r in alone)
  assert bench.targets(alone)[0] == "jaxdist's dense step ÷ DDP's ≤ 0.5: no figure in this run"


def test_repeats_combine_to_the_median_and_list_each_pass_s_ratios(bench):
  runs = {
    'dense': [summary(10.0, 0.98, 600), summary(12.0, 0.98, 600), summary(11.0, 0.98, 600)],
    'topk1_ef': [summary(13.0, 0.99, 12), summary(18.0, 0.99, 12), summary(11.0, 0.97, 12)],
  }
  combined = {name: bench.combine(rs) for name, rs in runs.items()}
  assert combined['dense']['median_step_s'] == pytest.approx(0.011)
  assert combined['topk1_ef']['median_step_s'] == pytest.approx(0.013)
  assert combined['topk1_ef']['runs_median_step_s'] == pytest.approx([0.013, 0.018, 0.011])
  assert combined['topk1_ef']['test_accuracy'] == 0.99  # the first run's
  assert bench.pass_notes(runs) == [
    'pass 1, step ÷ dense: topk1_ef 1.30',
    'pass 2, step ÷ dense: topk1_ef 1.50',
    'pass 3, step ÷ dense: topk1_ef 1.00',
    'topk1_ef: accuracy differs between runs: [0.99, 0.99, 0.97]',
  ]
  assert bench.pass_notes({name: rs[:1] for name, rs in runs.items()}) == []  # one pass
  row = bench.side_by_side_rows(combined)[1]
  assert row['jd_ms'] == pytest.approx(13.0)
  assert row['jd_ratio'] == pytest.approx(1.3)  # median of 1.3, 1.5, 1.0 (not 13 / 11)
  one = {name: bench.combine(rs[:1]) for name, rs in runs.items()}
  assert bench.side_by_side_rows(one)[1]['jd_ratio'] == pytest.approx(1.3)  # 13 / 10


def test_missing_peers_dir_stops_before_training(tmp_path, data_dir):
  proc = subprocess.run(
    binary_cmd(
      f'--workdir={tmp_path / "w"}',
      f'--torch_python={sys.executable}',
      f'--peers_dir={tmp_path / "nowhere"}',
      script='bench_peers.py',
    ),
    env=binary_env(data_dir),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  assert proc.returncode == 2
  assert 'nowhere has no torch_ddp_digits.py' in proc.stderr
  assert not (tmp_path / 'w').exists()


@pytest.mark.slow
def test_one_invocation_runs_ddp_and_jaxdist_side_by_side(tmp_path, data_dir, peers_dir):
  """The peers' work in today's keys (kept runnable when config keys change), with DDP beside.

  A fake peer script stands in for torch; its powersgd2 run fails, as a gloo hang would.
  """
  out, results = tmp_path / 'lines.jsonl', tmp_path / 'peers.md'
  env = {**binary_env(data_dir), 'FAIL_HOOK': 'powersgd2'}
  proc = subprocess.run(
    binary_cmd(
      f'--workdir={tmp_path / "w"}',
      '--steps=3',
      '--repeats=2',
      '--compute_budget_s=0.05',
      f'--out={out}',
      f'--results={results}',
      f'--torch_python={sys.executable}',
      f'--peers_dir={peers_dir}',
      script='bench_peers.py',
    ),
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  assert proc.returncode == 1, proc.stderr[-3000:]  # a DDP run failed: reported, not hidden
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r.get('system', 'ddp'), r['hook']) for r in lines] == [
    ('ddp', 'none'), ('jaxdist', 'dense'), ('ddp', 'powersgd2'), ('jaxdist', 'powersgd2'),
    ('ddp', 'localsgd4'), ('jaxdist', 'local4'), ('jaxdist', 'topk1_ef'), ('jaxdist', 'dgc1'),
    ('jaxdist', 'dense'), ('jaxdist', 'powersgd2'), ('jaxdist', 'local4'),
    ('jaxdist', 'topk1_ef'), ('jaxdist', 'dgc1'),
  ]  # fmt: skip  # interleaved: each method's DDP run, then jaxdist's; then the second pass
  assert lines[0]['argv'] == [
    '--world_size', '8', '--steps', '3', '--match_jaxdist',
    '--hook', 'none', '--tag', 'side_by_side',
  ]  # fmt: skip
  jd = {r['hook']: r for r in lines if r.get('system') == 'jaxdist'}
  assert jd['powersgd2']['payload_bytes'] < jd['dense']['payload_bytes'] / 20
  assert jd['local4']['payload_bytes'] == jd['dense']['payload_bytes']  # 3 steps: all warm-up
  assert jd['topk1_ef']['payload_bytes'] < jd['dense']['payload_bytes'] / 20
  assert jd['dgc1']['payload_bytes'] == jd['topk1_ef']['payload_bytes']  # the same k
  assert all(r['world_size'] == 8 for r in jd.values())
  md = results.read_text()
  assert md.startswith('Command: `python experiments/bench_peers.py --workdir=')
  assert 'PyTorch 9.9.9+fake DDP' in md and 'load average' in md
  assert '| method | jaxdist median step ms | DDP median step ms | jaxdist ÷ DDP |' in md
  table = {row.split(' | ')[0].lstrip('| '): row for row in md.splitlines() if row[:2] == '| '}
  assert ' | 40.0 | ' in table['dense'] and '| 97.50% |' in table['dense']
  local = table['local SGD, period 4']
  assert ' | 36.0 | ' in local and local.endswith('| 166,437 |')
  assert table['PowerSGD rank 2'].count(' - ') == 5  # DDP's cells of the failed run
  assert table['Top-k 1% all-gather, EF'].count(' - ') == 5  # no DDP Top-k hook
  assert 'DDP run powersgd2 failed: timeout: no finish' in md
  assert "jaxdist ms: the median of 2 runs' median steps" in md
  assert '- pass 1, step ÷ dense: powersgd2 ' in md and '- pass 2, step ÷ dense: ' in md
  assert all((tmp_path / 'w' / f'{name}.2' / 'summary.json').exists() for name in jd)
  assert 'jaxdist ÷ DDP' in proc.stdout and 'PowerSGD rank 2 ÷ dense ≤ 1.1' in proc.stdout


def test_the_network_benchmark_trains_the_peers_work(bench):
  # bench_network runs the peers' DDP beside these variants over real links: same work
  from jaxdist.train import compare

  network = compare.load_group(os.path.join(REPO, 'configs', 'variants', 'network.py'))
  peers = compare.load_group(bench.VARIANTS)
  assert network.settings == peers.settings == {  # side_by_side.sh's
    'optimizer.learning_rate': 0.05, 'optimizer.nesterov': False,
    'optimizer.schedule': 'constant', 'optimizer.weight_decay': 0.0,
    'optimizer.warmup_steps': 0, 'sync.local_sgd.warmup_steps': 11,
    'noise_every': 0,  # a diagnostic DDP does not run
  }  # fmt: skip
  assert bench.SETTINGS == {'workers': 8, 'progress': False}
  for name in bench.DDP_ARGS:
    assert network.variants[name] == peers.variants[name], name
