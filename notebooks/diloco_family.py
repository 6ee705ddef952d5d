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
# # The DiLoCo family on a language model
#
# <a href="https://colab.research.google.com/github/jaxdist/jaxdist/blob/main/notebooks/diloco_family.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# A character-level GPT on the complete works of Shakespeare (bundled with
# jaxdist: nothing to download), trained by 8 workers with AdamW, its
# gradients all-reduced every step (BSP), against the methods that send
# less: DiLoCo (an outer step every H inner steps), Streaming DiLoCo (the
# model in fragments synchronised in turn, the average applied a step later,
# sent in fp8), SparseLoCo (DiLoCo's pseudo-gradient as a 2-bit, 3 % Top-k per
# tile with error feedback), DeMo (the DCT of the momentum, Top-k
# coefficients exchanged, a sign step), the block-scaled int8 all-reduce and
# 1-bit Adam. Each is an optax transform (`jd.sync.<name>`); here the trainer
# builds them from their config sections. The headline: validation loss
# against the bytes each worker sent, and against the modelled time of a
# 1 Gbit/s network. Where jaxdist is missing (on Colab), the first cell installs it.

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
# ## Training
#
# `runlocal` is the CPU-and-CI size: the `mini` GPT (2 blocks of 64) on
# windows of 32 characters, a few dozen steps, validated on the first 16K
# characters of the validation plays. `make results-lm` trains the same
# methods on the `tiny` GPT (4 blocks) for 2,500 steps of 64 windows of 64
# characters (configs/variants/lm.py); `:small` is nanoGPT's
# 10.7M-parameter model, for a GPU.

# %%
STEPS = 24
H = 8  # DiLoCo's period: 3 outer steps in the run
common = {
  'progress': False,
  'steps': STEPS,
  'eval_every': H,
  'checkpoint_every': STEPS,
  'noise_every': 0,
}  # Scavenger's gradient noise, not shown here: not measured
METHODS = {
  'AdamW, all-reduce (BSP)': {'sync.method': 'allreduce'},
  f'DiLoCo H={H}': {'sync.method': 'diloco', 'sync.diloco.period': H},
  f'Streaming DiLoCo H={H}, 4 fragments, fp8': {
    'sync.method': 'streaming_diloco',
    'sync.streaming_diloco.period': H,
    'sync.streaming_diloco.fragments': 4,
    'sync.streaming_diloco.delay': 1,
    'sync.streaming_diloco.averager': 'quantized_allreduce',
    'sync.quantized_allreduce.format': 'fp8',
  },
  f'SparseLoCo H={H}, 3 %, 2-bit': {'sync.method': 'sparseloco', 'sync.sparseloco.period': H},
  'DeMo': {'sync.method': 'demo', 'optimizer.lr_scale': 0.3},  # lm.py's ratio to AdamW's rate
  'int8 block all-reduce': {'sync.method': 'quantized_allreduce'},
  f'1-bit Adam (variance frozen at step {H})': {
    'sync.method': 'onebit_adam',
    'sync.onebit_adam.warmup_steps': H,
    'sync.onebit_adam.weight_decay': 0.1,
  },
}
runs = {}


def train(name):
  """Trains METHODS[name] at runlocal size; its summary and metrics. The first run measures
  one worker's step (the modelled clock's compute term); the others reuse it, so their
  modelled times differ by what they send (and each run saves a measurement)."""
  measured = {'network.compute_s': next(iter(runs.values()))[0]['worker_step_s']} if runs else {}
  config = jd.train.load_config(
    'shakespeare_gpt.py:runlocal', **common, **METHODS[name], **measured
  )
  workdir = os.path.abspath(f'workdir/diloco_family/{len(runs)}')
  summary = jd.train.train_and_evaluate(config, workdir, fresh=True)
  runs[name] = (summary, jd.train.metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl')))
  print(
    f'{name:42s} validation loss {summary["test_loss"]:.3f} ({summary["test_bits"]:.3f} bits/char), '
    f'test accuracy {summary["test_accuracy"]:.3f}, '
    f'{summary["sent_bytes_per_worker"] / 1e6:8.2f} MB sent per worker'
  )


# %%
for name in list(METHODS)[:3]:
  train(name)

# %%
for name in list(METHODS)[3:5]:
  train(name)

# %%
for name in list(METHODS)[5:]:
  train(name)

# %% [markdown]
# ## Loss against bytes and against time
#
# Each point is an evaluation: the validation loss of the workers' mean model,
# against what each worker had sent so far, and against the modelled clock
# (this machine's measured compute, BSP's step for every method, plus the α-β
# time of those bytes on a 1 Gbit/s network).

# %%
import numpy as np
from matplotlib.figure import Figure


def curves(records, key):
  """(cumulative `key` over steps, validation loss) at each evaluation."""
  total = np.cumsum([r.get(key) or 0.0 for r in records])
  points = [(total[i], r['test_loss']) for i, r in enumerate(records) if 'test_loss' in r]
  return np.array(points).T


def plot(runs):
  """Validation loss against MB sent per worker and against modelled seconds at 1 Gbit/s."""
  fig = Figure(figsize=(11, 4))
  by_bytes, by_time = fig.subplots(1, 2)
  for name, (_, records) in runs.items():
    sent, loss = curves(records, 'sent_bytes')
    by_bytes.plot(np.maximum(sent, 1) / 1e6, loss, 'o-', label=name)
    seconds, loss = curves(records, 'modelled_s@1gbps')
    by_time.plot(seconds, loss, 'o-', label=name)
  by_bytes.set(xscale='log', xlabel='MB sent per worker', ylabel='validation loss (nats/char)')
  by_time.set(xlabel='modelled seconds at 1 Gbit/s', ylabel='validation loss (nats/char)')
  for ax in (by_bytes, by_time):
    ax.grid(alpha=0.3)
  by_bytes.legend(fontsize=7)
  fig.tight_layout()
  return fig


plot(runs)
