"""End to end: the absl binary runs, resumes after SIGKILL, and refuses bad input."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest

from jaxdist.train import checkpoint, metrics

from conftest import QUICK_FLAGS, REPO, binary_cmd, binary_env

pytestmark = pytest.mark.slow

CONFIG = 'configs/digits.py:runlocal'
TIMEOUT = 300
INFO_LINE = re.compile(r'^I\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ', re.M)  # absl's info lines


def run_binary(
  workdir, data_dir, *overrides, check=True, cwd=None, script='train.py', config=CONFIG
):
  proc = subprocess.run(
    binary_cmd(
      f'--config={os.path.join(REPO, config)}',
      f'--workdir={workdir}',
      *QUICK_FLAGS,
      *overrides,
      script=script,
    ),
    env=binary_env(data_dir),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
    cwd=cwd,
  )
  if check and proc.returncode != 0:
    raise AssertionError(f'binary failed ({proc.returncode}):\n{proc.stderr[-4000:]}')
  return proc


def params_of(workdir, step=None):
  state, meta = checkpoint.read(os.path.join(workdir, 'checkpoints'), step)
  return state['params'], meta


def assert_trees_equal(a, b, atol=0.0):
  assert sorted(a) == sorted(b)
  for key in a:
    if isinstance(a[key], dict):
      assert_trees_equal(a[key], b[key], atol)
    else:
      np.testing.assert_allclose(a[key], b[key], rtol=0, atol=atol, err_msg=key)


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory, data_dir):
  parent = tmp_path_factory.mktemp('run')
  proc = run_binary('workdir', data_dir, cwd=parent)  # relative, as `make run` passes it
  return parent / 'workdir', proc


def test_runlocal_writes_logs_checkpoints_plot_and_summary(finished_run):
  workdir, proc = finished_run
  records = metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records] == list(range(1, 21))
  assert {'loss', 'accuracy', 'learning_rate', 'payload_bytes', 'sent_bytes'} <= set(records[0])
  assert {'step_s', 'comm_s@1gbps', 'comm_s@10gbps', 'modelled_s@1gbps'} <= set(records[1])
  assert records[1]['comm_s@1gbps'] > records[1]['comm_s@10gbps'] > 0
  assert [r['step'] for r in records if 'test_accuracy' in r] == [10, 20]
  assert records[-1]['loss'] < records[0]['loss']
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['workers'] == 8 and summary['steps'] == 20
  assert summary['test_accuracy'] == records[-1]['test_accuracy'] > 0.5
  # dense all-reduce of the CNN's float32 gradient, every step
  params, meta = params_of(workdir)
  n_bytes = sum(v.size // 8 * 4 for layer in params.values() for v in layer.values())
  assert all(r['payload_bytes'] == n_bytes for r in records)
  assert meta['step'] == 20
  assert (workdir / 'curves.png').stat().st_size > 10_000
  assert list((workdir / 'tensorboard').iterdir())
  assert 'test acc' in proc.stdout and 'samples/s' in proc.stdout
  assert 'Per run:' in proc.stdout and 'Per step (means over the run):' in proc.stdout
  assert '\n  synced: the fraction of steps' in proc.stdout  # the legend under the tables
  assert not INFO_LINE.search(proc.stderr), proc.stderr[-3000:]  # warnings only, by default


COMMON = [
  '--config.checkpoint_every=5',
  '--config.eval_every=5',
  '--config.network.profiles=1gbps,adopt_c1@5',  # a network that changes every 5 steps
]


@pytest.fixture(scope='module')
def straight_run(tmp_path_factory, data_dir):
  straight = tmp_path_factory.mktemp('straight')
  run_binary(straight, data_dir, *COMMON)
  return straight


# SIGKILL: a crash, the steps since the checkpoint of step 10 are lost (resumed like this with
# the host controllers too, test_host_controllers_resume_after_sigkill: here in test-all only).
# SIGTERM (a scheduler's preemption; Ctrl-C's SIGINT in test_interrupt.py): a checkpoint at the
# step reached, no loss.
@pytest.mark.parametrize(
  'signum, saved',
  [pytest.param(signal.SIGKILL, 10, marks=pytest.mark.extended), (signal.SIGTERM, 12)],
)
def test_killed_or_preempted_and_resumed_equals_straight_run(straight_run, tmp_path, data_dir,
                                                             signum, saved):  # fmt: skip
  crashed = tmp_path / 'crashed'
  fault = ['--config.fault.kill_at_step=12', f'--config.fault.signal={signum.name}']
  proc = run_binary(crashed, data_dir, *COMMON, *fault, check=False)
  if signum == signal.SIGKILL:
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  else:
    assert proc.returncode == 128 + signum, proc.stderr[-2000:]  # the shell's 143
    assert proc.stderr.splitlines()[-1] == (
      'interrupted at step 12; checkpoint saved; rerun the same command to resume'
    ), proc.stderr[-2000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-2000:]
  logged = [r['step'] for r in metrics.read_jsonl(os.path.join(crashed, 'metrics.jsonl'))]
  assert logged == list(range(1, 13))  # under SIGKILL steps 11, 12 are logged, not checkpointed
  assert checkpoint.read(os.path.join(crashed, 'checkpoints'))[1]['step'] == saved

  again = fault if signum == signal.SIGTERM else []  # the same command, resumed past step 12
  proc = run_binary(crashed, data_dir, *COMMON, *again)
  assert f'resumed from step {saved} of 20' in proc.stdout, proc.stdout[-2000:]
  want = metrics.read_jsonl(os.path.join(straight_run, 'metrics.jsonl'))
  got = metrics.read_jsonl(os.path.join(crashed, 'metrics.jsonl'))
  assert [r['step'] for r in got] == list(range(1, 21))  # none duplicated, none missing
  assert all('step_s' in r for r in got)
  assert [metrics.without_timings(r) for r in got] == [metrics.without_timings(r) for r in want]
  phases = [r['comm_s@adopt_c1@5'] for r in want]
  assert phases[0] == phases[4] < phases[5] == phases[9] < phases[10]  # 1 ms, 2 ms, 4 ms latency
  assert_trees_equal(params_of(crashed)[0], params_of(straight_run)[0])


def tree_digest(path) -> str:
  digest = hashlib.sha256()
  for root, dirs, files in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(files):
      digest.update(os.path.relpath(os.path.join(root, name), path).encode())
      with open(os.path.join(root, name), 'rb') as f:
        digest.update(f.read())
  return digest.hexdigest()


# One line and status 2 for each kind of bad input; where the message is one that the
# library's own tests check in-process (tests/data, tests/train: test_config, test_resume), the
# binary's run of it is in `make test-all` only.
IN_PROCESS_TOO = pytest.mark.extended


@pytest.mark.parametrize(
  'overrides, message',
  [
    (['--config.model.name=vgg99'], "unknown model 'vgg99'"),
    pytest.param(
      ['--config.dataset.name=no_such_data'], "unknown dataset 'no_such_data'", marks=IN_PROCESS_TOO
    ),
    (['--config.batch_size=100'], 'batch_size 100 (global) is not divisible by workers 8'),
    (['--config.dataset.name=mnist'], "tfds dataset 'mnist' is not prepared"),
    pytest.param(
      ['--config.sync.method=gossipy'], "unknown sync.method 'gossipy'", marks=IN_PROCESS_TOO
    ),
    (
      ['--config.sync.method=selsync', '--config.sync.selsync.alpha=1.5'],
      'config.sync.selsync: alpha must be in [0, 1), got 1.5',
    ),
    (['--config.model.name=mlp'], 'cannot resume from the checkpoint at step 20'),
    (
      ['--config.sync.local_sgd.period=8', '--config.optimizer.learning_rate=0.05'],
      'its config differs in 2 key(s): optimizer.learning_rate 0.1 → 0.05, '
      'sync.local_sgd.period 4 → 8; resume with the config that wrote it, or start afresh '
      'with --fresh',
    ),
    pytest.param(
      ['--config.workers=16'],
      'it is a finished run of workers=8, devices=0: nothing is left',
      marks=IN_PROCESS_TOO,
    ),
    pytest.param(
      ['--config.steps=10'],
      'it is past config.steps=10; resume with the config',
      marks=IN_PROCESS_TOO,
    ),
    (['--cpu_devices=0'], '--cpu_devices must be >= 1, got 0'),
  ],
  ids=[
    'model',
    'dataset',
    'batch',
    'unprepared',
    'sync',
    'section-key',
    'mismatched-resume',
    'changed-config',
    'finished-on-other-workers',
    'fewer-steps',
    'cpu-devices',
  ],
)
def test_bad_input_fails_clearly_and_keeps_the_checkpoint(
  finished_run, data_dir, overrides, message
):
  workdir, _ = finished_run
  before = tree_digest(workdir)
  proc = run_binary(workdir, data_dir, *overrides, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]
  logged = [line for line in proc.stderr.splitlines() if message in line and line not in errors]
  assert not logged, f'the error is also logged (absl prefix): {logged}'
  assert 'Traceback' not in proc.stderr
  assert tree_digest(workdir) == before  # checkpoints, log, config.json, summary, plots


def test_fresh_starts_afresh_where_another_config_ran(finished_run, tmp_path, data_dir):
  workdir = tmp_path / 'again'
  shutil.copytree(finished_run[0], workdir)
  (workdir / 'notes.txt').write_text('mine')
  changed = ['--config.steps=4', '--config.optimizer.learning_rate=0.05']
  run_binary(workdir, data_dir, *changed, '--config.progress=False', '--fresh')
  logged = metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in logged] == [1, 2, 3, 4]
  _, meta = params_of(workdir)
  assert meta['step'] == 4 and meta['config']['optimizer']['learning_rate'] == 0.05
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['4']
  assert json.loads((workdir / 'config.json').read_text())['steps'] == 4
  assert json.loads((workdir / 'summary.json').read_text())['steps_this_run'] == 4
  assert (workdir / 'notes.txt').read_text() == 'mine'  # only what a run writes is removed


def test_workdir_that_is_a_file(tmp_path, data_dir):
  path = tmp_path / 'not_a_dir'
  path.write_text('precious')
  proc = run_binary(path, data_dir, check=False)
  assert proc.returncode == 2
  assert f'error: workdir {path} exists and is not a directory' in proc.stderr
  assert path.read_text() == 'precious'


def test_rerunning_a_finished_run_reports_its_accuracy(finished_run, data_dir):
  workdir, _ = finished_run
  log_before = (workdir / 'metrics.jsonl').read_text()
  summary_before = json.loads((workdir / 'summary.json').read_text())
  proc = run_binary(workdir, data_dir, '--verbosity=0')  # absl's info lines, as asked
  assert re.search(INFO_LINE.pattern + r'resumed from step 20 ', proc.stderr, re.M), proc.stderr
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['steps_this_run'] == 0
  assert summary['test_accuracy'] == summary_before['test_accuracy']
  assert (workdir / 'metrics.jsonl').read_text() == log_before


def test_compare_binary_trains_variants_into_one_table(tmp_path, data_dir):
  flags = ('--only=dense,topk1_ef', '--config.progress=False')
  proc = run_binary(tmp_path, data_dir, *flags, script='compare.py')
  rows = json.loads((tmp_path / 'compare.json').read_text())
  assert [r['variant'] for r in rows] == ['dense', 'topk1_ef']
  assert rows[1]['payload'] < rows[0]['payload'] / 20  # Top-k 1% + int32 indices vs dense
  assert rows[0]['delta_pp'] == 0
  assert all(r['worker_step_s'] > 0 for r in rows)
  assert (tmp_path / 'compare.png').stat().st_size > 10_000
  assert 'time to' in proc.stdout and '@1gbps' in proc.stdout
  assert 'Per run:' in proc.stdout and '\n  time to A @NET: modelled seconds' in proc.stdout
  # the console: a result line per variant, then the tables and their legend, once
  lines = proc.stdout.splitlines()
  result = r'dense     20 steps  test acc 0\.\d{4}  sent 1\.01 MiB/worker/step  [\d.]+ s'
  assert re.fullmatch(result, lines[0]), lines[:3]
  assert lines[1].startswith('topk1_ef  20 steps  test acc '), lines[:3]
  assert [proc.stdout.count(s) for s in ('Per run:', 'Per step', 'Columns:')] == [1, 1, 1]
  assert len([line for line in lines if line.strip()]) < 40, proc.stdout
  assert not INFO_LINE.search(proc.stderr), proc.stderr[-3000:]
  for name in ('dense', 'topk1_ef'):
    assert (tmp_path / name / 'metrics.jsonl').exists()

  # the README's example, in the same workdir: dense there is a finished run of 8 workers
  before = tree_digest(tmp_path)
  again = run_binary(
    tmp_path, data_dir, '--only=dense,qsgd8', '--config.workers=16', *flags[1:], check=False,
    script='compare.py',
  )  # fmt: skip
  assert again.returncode == 2, again.stderr[-3000:]
  (error,) = again.stderr.strip().splitlines()
  assert error.startswith(f'error: cannot resume from the checkpoint at step 20 in {tmp_path}')
  assert 'it is a finished run of workers=8, devices=0: nothing is left to train with ' in error
  assert 'start afresh with --fresh' in error
  assert tree_digest(tmp_path) == before and not (tmp_path / 'qsgd8').exists()

  bad = run_binary(
    tmp_path / 'bad', data_dir, '--only=dense,nonesuch', check=False, script='compare.py'
  )
  assert bad.returncode == 2 and "error: unknown variant 'nonesuch'" in bad.stderr
  assert not (tmp_path / 'bad').exists()


DIGITS = '--config=configs/digits.py:runlocal'


@pytest.mark.parametrize(
  'script, args, message',
  [
    ('train.py', [DIGITS, '--config.sync.local_sgd.perod=8'], "did you mean 'period'?"),
    ('train.py', [DIGITS, '--config.stpes=10'], "config has no key 'stpes'; did you mean 'steps'"),
    ('compare.py', [DIGITS, '--config.worker=4'], "did you mean 'workers'"),
    ('elastic.py', [DIGITS, '--config.sync.methd=x'], "did you mean 'method'?"),
    ('plan.py', [DIGITS, '--config.stpes=3'], "did you mean 'steps'"),
    ('train.py', ['--config=configs/digit.py'], 'did you mean configs/digits.py?'),
    ('train.py', ['--config=configs/digits.py:runlokal'], "(did you mean 'runlocal'?)"),
    ('train.py', [DIGITS, '--config.steps=ten'], "--config.steps=ten: invalid literal for int()"),
    ('train.py', [DIGITS, '--config.steps.x=1'], 'config.steps is a value, not a section'),
    ('train.py', [DIGITS, '--wrkdir=/tmp'], 'Did you mean: workdir'),
    ('compare.py', [DIGITS, '--only=dense,qsdg8'], "variant 'qsdg8' (did you mean 'qsgd8'?)"),
    ('elastic.py', [DIGITS, '--to=4,sixteen'], 'takes comma-separated integers'),
    ('compare.py', [DIGITS, '--variants=configs/variants/compresion.py'],
     'no variants file at configs/variants/compresion.py; did you mean '
     'configs/variants/compression.py?'),
    ('elastic.py', [DIGITS, '--only=dense,locl4'], "variant 'locl4' (did you mean 'local4'?)"),
  ],
  ids=[
    'section-key', 'top-key', 'compare-key', 'elastic-key', 'plan-key', 'config-file',
    'config-arg', 'value', 'not-a-section', 'flag', 'variant', 'int-list', 'variants-file',
    'elastic-variant',
  ],
)  # fmt: skip
def test_a_bad_flag_key_or_config_argument_is_one_error_line(
  tmp_path, data_dir, script, args, message
):
  workdir = tmp_path / 'run'
  proc = subprocess.run(
    binary_cmd(*args, f'--workdir={workdir}', script=script),
    env=binary_env(data_dir),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
    cwd=REPO,  # the config paths are relative, as the README writes them
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr[-3000:]
  assert message in lines[0]
  assert not workdir.exists()


@pytest.mark.parametrize(
  'args', [['--config=digits.py:runlokal'], ['--config', 'digits.py:runlokal']], ids=['=', 'space']
)
def test_a_config_that_comes_with_jaxdist_is_named_from_anywhere(tmp_path, data_dir, args):
  proc = subprocess.run(
    binary_cmd(*args, f'--workdir={tmp_path / "run"}'),
    env=binary_env(data_dir),
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
    cwd=tmp_path,  # no configs/ here: configs/digits.py is found by name, and its `:arg` read
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines() == [
    f"error: --config={REPO}/configs/digits.py:runlokal: unknown config argument 'runlokal' "
    "(did you mean 'runlocal'?); this config takes ['runlocal', 'workers']"
  ]


# The model's batch statistics take one path whatever the method (step.py); selsync's and
# gossip's own tests are on the digits CNN: with ResNet-20 they run in `make test-all`.
@pytest.mark.parametrize(
  'method, option',
  [
    ('diloco', 'diloco.period=2'),
    pytest.param('selsync', 'selsync.window=2', marks=pytest.mark.extended),
    pytest.param('gossip', 'gossip.topology=exponential', marks=pytest.mark.extended),
  ],
)
def test_cifar10_resnet20_runlocal_uses_synthetic_data(tmp_path, data_dir, method, option):
  run_binary(
    tmp_path, data_dir,
    f'--config.sync.method={method}',
    f'--config.sync.{option}',
    '--config.noise_every=0',  # the noise step is a third ResNet-20 program to compile
    '--config.network.compute_s=0.05',  # and the one-worker measurement a fourth
    config='configs/cifar10_resnet20.py:runlocal,workers=4',
  )  # fmt: skip
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['model'] == 'resnet20' and summary['dataset'] == 'synthetic'
  assert summary['steps'] == 6 and summary['workers'] == 4 and 0 < summary['sync_fraction'] <= 1


def injected(fraction):
  return [
    '--config.partition.kind=labels', '--config.partition.labels_per_worker=4',
    f'--config.partition.inject_alpha={fraction}', f'--config.partition.inject_beta={fraction}',
  ]  # fmt: skip


DYNAMIC = [
  '--config.cluster.cores=h2', '--config.cluster.straggler_p=0.2', '--config.batching=dynamic',
  '--config.dynamic_batching.b_max=64', '--config.dynamic_batching.interval=2', *injected(0.2),
]  # fmt: skip
STREAMS = [
  '--config.cluster.stream_rates=S10', '--config.batching=stream', '--config.streams.b_max=64',
  '--config.streams.interval_s=0.5', *injected(0.5),
]  # fmt: skip


# Both controllers' states reach the checkpoint by one path (`Host.to_tree`), and the streams'
# state round-trips through JSON in tests/control/test_streams.py: streams in test-all only
@pytest.mark.parametrize(
  'controller',
  [
    pytest.param(DYNAMIC, id='dynamic'),
    pytest.param(STREAMS, id='streams', marks=pytest.mark.extended),
  ],
)
def test_host_controllers_resume_after_sigkill(tmp_path, data_dir, controller):
  # the batch controller, the streams' buffers, the noise meter and the injected examples'
  # sampler live in the checkpoint
  straight, crashed = tmp_path / 'straight', tmp_path / 'crashed'
  common = [
    '--config.workers=3', '--config.batch_size=96', '--config.steps=12',
    '--config.checkpoint_every=5', '--config.eval_every=6', '--config.progress=False',
    '--config.noise_every=3', *controller,
  ]  # fmt: skip
  run_binary(straight, data_dir, *common)
  proc = run_binary(crashed, data_dir, *common, '--config.fault.kill_at_step=7', check=False)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  run_binary(crashed, data_dir, *common)
  want = metrics.read_jsonl(os.path.join(straight, 'metrics.jsonl'))
  got = metrics.read_jsonl(os.path.join(crashed, 'metrics.jsonl'))
  strip = lambda r: {
    k: v for k, v in metrics.without_timings(r).items() if k not in ('compute_s', 'wait_s', 'queue')
  }  # the modelled compute time follows the measured step, as the streams do
  assert [strip(r) for r in got] == [strip(r) for r in want]
  assert [r['step'] for r in got if 'gamma' in r] == [1, 4, 7, 10]
  summary = json.loads((straight / 'summary.json').read_text())
  assert summary['cost@1gbps'] == 0.0 and summary['modelled_s@1gbps'] > 0  # no price given
  assert (straight / 'batches.png').stat().st_size > 10_000
  assert all(r['inject_bytes'] > 0 for r in got)
  if controller is DYNAMIC:
    assert len({tuple(r['batches']) for r in want}) > 2  # the controller moved more than once
  else:
    assert summary['buffer_peak_total'] > 0


# DiLoCo on the GPT trains in the diloco_family notebook too: through the binary, in test-all
@pytest.mark.parametrize(
  'method, option',
  [('allreduce', ''), pytest.param('diloco', 'diloco.period=4', marks=pytest.mark.extended)],
)
def test_shakespeare_gpt_runlocal_trains_a_language_model(tmp_path, data_dir, method, option):
  extra = [f'--config.sync.{option}'] if option else []
  proc = run_binary(
    tmp_path, data_dir, f'--config.sync.method={method}', *extra,
    config='configs/shakespeare_gpt.py:runlocal,workers=4',
  )  # fmt: skip
  summary = json.loads((tmp_path / 'summary.json').read_text())
  # the console gives the task's metric: the validation loss in nats and bits per character
  line = f'val loss {summary["test_loss"]:.4f} nats, {summary["test_bits"]:.4f} bits/char'
  assert line in proc.stdout.splitlines()[0], proc.stdout[:500]
  assert ' val loss ' in proc.stdout and ' bits/char ' in proc.stdout  # the per-run table
  assert 'test acc' not in proc.stdout, proc.stdout
  assert summary['model'] == 'gpt' and summary['dataset'] == 'shakespeare'
  assert summary['unit'] == 'char' and summary['tokens_per_s'] > 0
  # 20 steps from uniform guessing over 84 characters (ln 84 = 4.43 nats) must learn something
  assert summary['test_loss'] < 4.2
  np.testing.assert_allclose(summary['test_bits'], summary['test_loss'] / np.log(2), rtol=1e-6)
