"""`train_and_evaluate(config, workdir)`, `train(experiment)`: the training loop.

`factory.build` turns the config into an `Experiment` (objects and typed
values, no config) and checks it before the work directory is touched;
`train` runs it on `loop.run`. The run resumes from the latest checkpoint if
there is one (`workdir.restore_or_init`), measures the compute term of its
modelled clock (`calibrate`), runs the jitted sharded step on the batches
its host controllers plan (`host.Host`, `feed.put_batch`), fetches each
step's metrics one step late (the host never stalls the device) and prices
them (`steplog.StepLog`), evaluates and checkpoints every N steps with the
clock paused, and ends with a summary table and a plot.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from typing import Any

import jax

from jaxdist import comm, data
from jaxdist.train import (
  calibrate,
  checkpoint,
  elastic,
  factory,
  feed,
  interrupt,
  ledger,
  metrics,
  overlap,
  report,
  warm_start,
)
from jaxdist.train import loop as loop_lib
from jaxdist.train import step as step_lib
from jaxdist.train.columns import Column, legend
from jaxdist.train.experiment import Experiment
from jaxdist.train.host import Host
from jaxdist.train.resume import (
  BATCHES_PLOT,
  CHECKPOINTS,
  CONFIG_FILE,
  PLOT_FILE,
  SUMMARY_FILE,
  open_workdir,
  restore_or_init,
)
from jaxdist.train.steplog import Clock, PerWorkerFetch, StepLog

ConfigError = factory.ConfigError


def train_and_evaluate(
  config, workdir: str, *, fresh: bool = False, label: str = '', tables: bool = False
) -> dict[str, Any]:
  """Trains and evaluates as `config` says, in `workdir`; returns the summary.

  Resumes from the latest checkpoint in `workdir` if there is one and its
  config matches (`resume.check_resume`); with `fresh`, removes that run instead
  (`resume.clear_run`) and starts anew.

  Args:
    config: the run's config (`jaxdist/train/config.py: base()` has every key).
    workdir: the run's directory: checkpoints, metrics, summary and plots.
    fresh: remove the run in `workdir` first instead of resuming it.
    label: the run's name on the console (its progress bar and result line).
    tables: also print the summary's per-run and per-step tables and their legend.

  Returns:
    The summary (also written to `summary.json`): test metrics, throughput,
    bytes sent and the modelled time on each network.

  Raises:
    ConfigError: a bad config or work directory, or a checkpoint that may not
      resume with `config`, before anything is written.
    interrupt.Interrupted: SIGINT or SIGTERM stopped the run, after saving its
      checkpoint at the step it reached.
  """
  exp = factory.build(config, os.path.abspath(workdir))
  return train(exp, fresh=fresh, label=label, tables=tables)


def train(
  exp: Experiment, *, fresh: bool = False, label: str = '', tables: bool = False
) -> dict[str, Any]:
  """Trains and evaluates the run `exp` (`factory.build`) in `exp.workdir`; the summary.

  Args:
    exp: the run, built and checked from its config.
    fresh: remove the run in `exp.workdir` first instead of resuming it.
    label: the run's name on the console (its progress bar and result line).
    tables: also print the summary's tables and their legend.

  Returns:
    The run's summary (`train_and_evaluate`'s).
  """
  workers, lead = exp.workers, jax.process_index() == 0
  open_workdir(exp, fresh)
  logging.info('%s', exp)
  ds = exp.dataset
  init = step_lib.make_init(
    exp.model, exp.tx, workers, ds.input_shape, exp.way, input_dtype=ds.input_dtype
  )
  train_step = step_lib.make_train_step(
    exp.model, exp.tx, workers, staggered=exp.staggered, counted=exp.counted, per_worker=exp.way,
    micro_batch=exp.micro_batch, replicated=False,  # metrics per worker, reduced on the host
  )  # fmt: skip
  state_shape = jax.eval_shape(init, jax.random.key(exp.seed))
  ckpt = checkpoint.Checkpointer(os.path.join(exp.workdir, CHECKPOINTS), keep=exp.keep_checkpoints)
  with interrupt.Stop(exp.steps) as stop:
    state, start, meta, control_state = restore_or_init(exp, ckpt, init, state_shape)
    if lead and start:
      _started(label, meta, start, exp.steps)
    if lead:  # the config this run goes on with
      metrics.write_atomic(os.path.join(exp.workdir, CONFIG_FILE), json.dumps(exp.record, indent=2))

    compute_s, own_s = calibrate.worker_step_s(exp, meta, state)  # a worker, timed alone
    prices = ledger.Ledger.of(exp, comm.find_transfers(state_shape.opt_state), compute_s)
    bar = report.progress(exp.steps, start, enabled=lead and exp.progress, label=label)
    clock, wall0 = Clock(), time.time()
    host = Host(exp, compute_s, prices, clock, calibrate.candidate_step_s(exp, meta, state))
    host.restore(control_state)
    writer = metrics.MetricsWriter(exp.workdir, start, enabled=lead)
    exchange = overlap.Overlap(exp.exchange, workers, state)  # a deferred exchange's programs
    log = StepLog(writer, prices, exp.schedule, bar.show, host.observe, host.compute_at,
                  PerWorkerFetch(workers, train_step.runs, exchange.submit), own_s)  # fmt: skip

    def step(t: int, state):
      plan = host.plan(t, log)  # first the last step's record, if the plan reads it
      state = host.prepare(exchange.settle(state) if host.noise.due(t) else state, plan)
      batch, tx_args, fields = host.batch(t, state, plan)
      state, m = train_step(state, *batch, **tx_args)
      state = exchange.after(t, state)
      log.push(t + 1, m, plan)
      log.add(fields)
      bar.update(1)
      clock.step(m)
      return state

    evaluation = Evaluation(exp, log)
    saved = {'seed': exp.seed, 'config': dict(exp.record), 'compute_s': compute_s,
             'compute_s_candidates': host.candidate_s, **elastic.recorded(exp)}  # fmt: skip
    save = exchange.settled(saving(ckpt, log, host, saved))
    exploring = lambda: host.exploring  # evaluations, checkpoints and stops wait for its end
    hooks = [
      host.finish_at_last,  # an exploration still running at the last step is undone
      loop_lib.every(exp.eval_every, exchange.settled(evaluation), wait=exploring),
      loop_lib.every(exp.checkpoint_every, save, wait=exploring),
      kill_at_step(exp.kill_at_step, exp.kill_signal, log, ckpt),
    ]
    stops = lambda loop: stop.stops_at(loop.t) and not exploring()
    loop = loop_lib.run(loop_lib.Loop(state, start, exp.steps), step, hooks, clock.paused, stops)
    log.flush()
    jax.block_until_ready(loop.state)
    if loop.t < exp.steps or stop.settle():  # every process stops at this step
      if loop.t > start and ckpt.saved_step != loop.t:
        save(loop)
      _close(bar, log, ckpt, exchange)
      raise interrupt.Interrupted(loop.t, stop.signum)
  last_eval = evaluation.last or evaluation.run(exchange.settle(loop.state))  # none to train
  _close(bar, log, ckpt, exchange)

  records = metrics.read_jsonl(log.writer.path) if lead else []
  summary = {
    'dataset': exp.dataset_name, 'model': exp.model_name, 'sync': exp.method,
    'workers': workers.count, 'steps': exp.steps, 'steps_this_run': exp.steps - start,
    **_task_metrics(exp, last_eval, clock), 'wall_s': time.time() - wall0,
    **ledger.summarize(records, list(exp.networks), compute_s, exp.clock),
    **host.summary(), **warm_start.provenance(exp),
  }  # fmt: skip
  if lead:
    _report(exp, summary, records, log.writer.path, label, tables)
  return summary


def _started(label: str, meta: dict[str, Any], start: int, steps: int) -> None:
  """Says on the console where a run that does not start at step 0 starts from."""
  how = f'started from {meta["init_from"]} at' if 'init_from' in meta else 'resumed from'
  print('  '.join(filter(None, [label, f'{how} step {start} of {steps}'])))


def _close(*things) -> None:
  """Closes the run's progress bar, step log, checkpointer and exchange thread (waiting)."""
  for thing in things:
    thing.close()


def _task_metrics(exp: Experiment, last_eval: dict[str, float], clock: Clock) -> dict[str, Any]:
  """The summary's test metrics and throughput: a text's also in bits and tokens per second."""
  samples_per_s = clock.steps * exp.batch_size / clock.seconds() if clock.steps else None
  tokens = exp.dataset.tokens_per_example
  return {
    'test_accuracy': last_eval.get('test_accuracy'), 'test_loss': last_eval.get('test_loss'),
    'samples_per_s': samples_per_s,
    **({} if tokens is None else {
      'test_bits': last_eval.get('test_bits'), 'unit': exp.dataset.unit,
      'tokens_per_s': samples_per_s and samples_per_s * tokens,
    }),
  }  # fmt: skip


class Evaluation:
  """The evaluation hook: test loss and accuracy of the worker-averaged model, into the log.

  On text the loss is also given in bits (`test_bits`: per character at
  character level); the accuracy is that of the next token.

  Args:
    exp: the run.
    log: the step log the results go into.
  """

  def __init__(self, exp: Experiment, log: StepLog):
    self.step = step_lib.make_eval_step(exp.model, exp.workers)
    self.chunks = feed.eval_chunks(exp)
    self.log, self.last = log, {}
    self.tokens = exp.dataset.tokens_per_example is not None

  def run(self, state) -> dict[str, float]:
    """Evaluates `state` on the test split.

    Args:
      state: the train state.

    Returns:
      `test_loss` and `test_accuracy` (and `test_bits` on text).
    """
    result = feed.evaluate(self.step, state, self.chunks)
    if self.tokens:
      result['test_bits'] = data.sequences.bits(result['test_loss'])
    return result

  def __call__(self, loop: loop_lib.Loop) -> None:
    self.last = self.run(loop.state)
    self.log.add(self.last)


def saving(ckpt: checkpoint.Checkpointer, log: StepLog, host: Host, meta: dict[str, Any]):
  """The checkpoint hook: the log up to the step, then the train state, `meta`, the controllers'.

  Args:
    ckpt: the checkpointer.
    log: the step log, flushed first.
    host: the host, whose controllers' states are saved.
    meta: the metadata saved with every checkpoint.

  Returns:
    The hook.
  """

  def save(loop: loop_lib.Loop) -> None:
    log.flush()
    log.writer.flush()  # the log reaches the checkpoint's step before the checkpoint commits
    ckpt.save(loop.t, loop.state, {'step': loop.t, **meta}, host.to_tree())

  return save


def kill_at_step(step: int, signum: int, log: StepLog, ckpt: checkpoint.Checkpointer):
  """Fault-injection hook: send `signum` to this process once step `step` is logged (0 = never).

  SIGKILL is a crash between checkpoints: the steps after the last checkpoint
  are logged, then lost, and a rerun resumes from the checkpoint. SIGTERM
  (a scheduler's preemption) and SIGINT (Ctrl-C) reach the run's handlers
  (`interrupt.Stop`), which stop it with a checkpoint at the step it reached.

  Args:
    step: the step after which to send it (0: never).
    signum: the signal (`config.fault.signal`).
    log: the step log, flushed first under SIGKILL.
    ckpt: the checkpointer, waited for first under SIGKILL.

  Returns:
    The hook (`loop.Hook`).
  """

  def hook(loop: loop_lib.Loop) -> None:
    if loop.t != step:
      return
    if signum == signal.SIGKILL:
      log.flush(alone=True)  # the other processes go on: nothing that needs them
      log.writer.flush()
      ckpt.wait()  # only so that which checkpoint survives is deterministic
    logging.warning('fault.kill_at_step=%d: sending %s to this process', loop.t,
                    signal.Signals(signum).name)  # fmt: skip
    os.kill(os.getpid(), signum)

  return hook


def _report(exp: Experiment, summary: dict[str, Any], records, metrics_path: str, label: str,
            tables: bool) -> None:  # fmt: skip
  """summary.json, the curves' PNG, and on the console the result line (and the tables)."""
  metrics.write_atomic(os.path.join(exp.workdir, SUMMARY_FILE), json.dumps(summary, indent=2))
  title = curves_title(os.path.basename(exp.workdir), summary)
  plot = os.path.join(exp.workdir, PLOT_FILE)
  report.save(report.plot_curves(records, title), plot)
  if any('batches' in r for r in records):
    report.save(report.plot_batches(records, title), os.path.join(exp.workdir, BATCHES_PLOT))
  print(report.result_line(label, summary), flush=True)
  if tables:
    print(f'\n{summary_tables(summary, list(exp.networks))}')
    print(f'\nmetrics: {metrics_path}\nplot:    {plot}')


def curves_title(name: str, summary: dict[str, Any]) -> str:
  """The title of a run's plots: its name (its work directory's), method, model, data, workers.

  Args:
    name: the run's name.
    summary: its summary.

  Returns:
    The title.
  """
  return (
    f'{name}: {summary["sync"]}, {summary["model"]} on {summary["dataset"]}, '
    f'{summary["workers"]} workers'
  )


RUN_COLUMNS = (
  Column('sync', 'sync'),
  Column('workers', 'workers'),
  Column('steps', 'steps'),
  Column('test_accuracy', 'test acc'),
  Column('samples_per_s', 'samples/s'),
  Column('sent_bytes_per_worker', 'sent B/worker'),
)
# a language model's: its validation loss, in nats and in bits per token (character or byte)
LOSS_COLUMNS = (Column('test_loss', 'val loss'), Column('test_bits', 'bits/char'))
STEP_COLUMNS = (
  Column('synced', 'synced'),
  Column('payload_bytes_per_step', 'payload B/worker/step'),
  Column('sent_bytes_per_step', 'sent B/worker/step'),
  Column('median_step_s', 'step s, all workers'),
  Column('worker_step_s', 'worker step s'),
)


def summary_tables(summary: dict[str, Any], networks: list[str]) -> str:
  """A run's summary for the console: a per-run table, a per-step table, and their legend.

  Args:
    summary: the run's summary (`train_and_evaluate`'s).
    networks: the network profiles whose modelled time the per-run table shows.

  Returns:
    The tables and the legend of their columns, as text. A language model's
    per-run table shows its validation loss in nats and bits instead of
    the accuracy of its next token.
  """
  first = RUN_COLUMNS[:3] + (
    LOSS_COLUMNS if summary.get('test_bits') is not None else RUN_COLUMNS[3:4]
  )
  per_run = (
    first
    + RUN_COLUMNS[4:]
    + tuple(
      Column(f'modelled_s@{n}', f'{summary["steps"]} steps @{n} (s)', 'N steps @NET (s)')
      for n in networks
    )
  )
  fraction = summary.get('sync_fraction')
  row = {**summary, 'synced': None if fraction is None else f'{fraction:.1%}'}
  return '\n\n'.join([
    'Per run:',
    report.table([row], per_run),
    'Per step (means over the run):',
    report.table([row], STEP_COLUMNS),
    'Columns:\n' + legend(per_run + STEP_COLUMNS),
  ])  # fmt: skip
