# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Heterogeneous workers: dynamic batching
#
# <a href="https://colab.research.google.com/github/jaxdist/jaxdist/blob/main/notebooks/heterogeneous.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Four workers, one of them 4× slower than the others (a 4:1 cluster). With
# equal batches every synchronous step waits for the slow one. Dynamic
# batching (Tyagi & Sharma, ACSOS 2020) gives each worker a share of the
# global batch in proportion to its measured throughput, and averages the
# gradients with weights b_k / G, so the global batch, and the maths of
# the step, stay the same while the workers finish together.
#
# The cluster is modelled: the run trains for real on the CPU, and each
# worker's iteration time is its batch over its speed times the measured time
# per example (`jd.netmodel.Cluster`). Where jaxdist is missing (on Colab), the first
# cell installs it.

# %%
# Where jaxdist is missing (Colab), this installs it into the running kernel: from a wheel
# beside the notebook (build it in a clone with `make wheel`, then upload
# dist/jaxdist-*.whl; on Colab, the Files pane), or from JAXDIST_SOURCE (a checkout as
# file:///path, or any pip source). jaxdist's future public home,
# git+https://github.com/jaxdist/jaxdist, is not published yet. Where jaxdist imports
# already, it does nothing.
import glob
import importlib
import importlib.util
import os
import site
import subprocess
import sys

if importlib.util.find_spec('jaxdist') is None:
  wheels = sorted(glob.glob('jaxdist-*.whl'))
  source = os.environ.get('JAXDIST_SOURCE') or (
    'file://' + os.path.abspath(wheels[-1]) if wheels else None
  )
  if source is None:
    raise RuntimeError(
      'jaxdist is not installed. Build its wheel in a clone (`make wheel`), put '
      'dist/jaxdist-*.whl beside this notebook (on Colab: upload it in the Files pane) and '
      'run this cell again; or set JAXDIST_SOURCE to a pip source of jaxdist.'
    )
  pip = subprocess.run(
    [sys.executable, '-m', 'pip', 'install', '--quiet', f'jaxdist[train,control] @ {source}'],
    capture_output=True,
    text=True,
  )
  print(pip.stdout + pip.stderr, end='')
  pip.check_returncode()
  for folder in [*site.getsitepackages(), site.getusersitepackages()]:
    if os.path.isdir(folder) and folder not in sys.path:  # made by pip after the kernel started
      site.addsitedir(folder)
  importlib.invalidate_caches()

import jaxdist as jd

# %%
jd.runtime.cpu_devices(8)  # 8 CPU devices, before JAX starts

# %matplotlib inline

# %% [markdown]
# ## Equal batches, then dynamic ones
#
# `runlocal` is the few-step variant for CPUs and CI; drop it for the full
# 400 steps. The controller looks at every worker's iteration time every
# `interval` steps and moves examples from slow workers to fast ones.

# %%
common = {
  'progress': False,
  'noise_every': 0,  # Scavenger's gradient noise, not shown here: not measured
  'cluster.speeds': '1,1,1,0.25',  # the 4:1 cluster
  'dynamic_batching.b_max': 64,  # examples each worker holds (static shapes)
  'dynamic_batching.interval': 2,
}
runs = {}
for batching in ('uniform', 'dynamic'):
  config = jd.train.load_config('digits.py:runlocal,workers=4', batching=batching, **common)
  workdir = os.path.abspath(f'workdir/heterogeneous/{batching}')
  runs[batching] = jd.train.train_and_evaluate(config, workdir)

for name, s in runs.items():
  print(
    f'{name:8s} test accuracy {s["test_accuracy"]:.3f}, modelled time of '
    f'{s["steps"]} steps at 1 Gbit/s: {s["modelled_s@1gbps"]:.3f} s'
  )

# %% [markdown]
# Both runs train on the same global batches, so their accuracy is the same;
# only the time differs. The batches and the workers' iteration times:

# %%
records = jd.train.metrics.read_jsonl(
  os.path.abspath('workdir/heterogeneous/dynamic/metrics.jsonl')
)
jd.train.report.plot_batches(records, title='dynamic batching on a 4:1 cluster')

# %% [markdown]
# ## Data that streams in (ScaDLES)
#
# Edge devices train on data that arrives while they train (Tyagi & Swany,
# BigData 2022). Eight workers fed at the paper's S10 rates (normal, mean 64
# and sd 24 samples/s). With a fixed batch of B/K = 16 every step waits for
# the slowest stream, and persistent buffers grow without bound at the fast
# ones; ScaDLES trains each worker on what streamed in over the last
# 0.25 s (weights b_k / Σb, learning rate scaled by Σb / B) and keeps only
# the newest 0.25 s of data. The host-side model alone, no training: a 10 ms
# step of compute and communication.

# %%
from matplotlib.figure import Figure


def plot_streams(rates, steps=400, step_s=0.01):
  """Buffered samples and elapsed time of fixed and of stream-proportional batches."""
  fig = Figure(figsize=(10, 3.5))
  queued, elapsed = fig.subplots(1, 2)
  for policy, buffer in (('fixed', 'persistence'), ('proportional', 'truncation')):
    model = jd.control.streams(
      rates, base_batch=128, b_max=64, buffer=buffer, policy=policy, interval_s=0.25
    )
    state, queue, clock = model.init(len(rates)), [], []
    for _ in range(steps):
      state = model.update(state, step_s)
      queue.append(state.queue.sum())
      clock.append(state.elapsed_s)
    label = f'{policy} batches, {buffer} buffers'
    queued.plot(queue, label=label)
    elapsed.plot(clock, label=label)
  queued.set(xlabel='step', ylabel='samples buffered, all workers', yscale='log')
  elapsed.set(xlabel='step', ylabel='seconds, waits for data included')
  for ax in (queued, elapsed):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  return fig


plot_streams(jd.control.stream_rates('S10', 8, seed=0))
