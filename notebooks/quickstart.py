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
# # jaxdist quickstart
#
# <a href="https://colab.research.google.com/github/jaxdist/jaxdist/blob/main/notebooks/quickstart.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Data-parallel training with 8 workers on the CPU: a CNN on the bundled
# 8x8 digits, gradients averaged with `jd.sync.allreduce`. The same config
# runs on GPUs/TPUs and across hosts; see the README.
#
# Where jaxdist is missing (on Colab), the first cell installs it with its
# training extras from a wheel you build in a clone (`make wheel`) and upload
# beside the notebook; elsewhere, install it as the README says before
# starting Jupyter.

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
import jax.numpy as jnp
import optax

# %% [markdown]
# ## The library: an optax chain that communicates
#
# `compressed_allreduce` averages gradients over every worker named by
# `axis_name`, here through Top-k 25% with error feedback; `jd.testing.Run`
# applies a transform to 8 workers' parameters step by step (on the available
# devices, or simulated with `vmap` on one), and records which collectives ran.

# %%
tx = optax.chain(
  jd.sync.compressed_allreduce(jd.compress.topk(ratio=0.25), axis_name=jd.runtime.AXES),
  optax.sgd(0.1),
)
run = jd.testing.Run(tx, {'w': jnp.zeros(8)}, workers=8)
grads = {'w': jnp.arange(64.0).reshape(8, 8) / 64}  # a different gradient on each worker
params = run(grads)
print('every worker holds the same model:', bool(jnp.all(params['w'] == params['w'][0])))
print('collectives this step:', [(t.kind, t.nbytes) for t in jd.comm.find_transfers(run.state)])

# %% [markdown]
# ## The experiment: a config, one call
#
# `runlocal` is the few-step variant for CPUs and CI; drop it for the full run.

# %%
config = jd.train.load_config('digits.py:runlocal', **{'progress': False})
workdir = os.path.abspath('workdir/quickstart')
summary = jd.train.train_and_evaluate(config, workdir)

# %% [markdown]
# Every option has a default in `jaxdist/train/config.py`; each method's section
# holds the arguments of its `jd.sync` factory, so switching to local SGD every
# 8 steps is `config.sync.method = 'local_sgd'` and
# `config.sync.local_sgd.period = 8` (on the command line:
# `--config.sync.local_sgd.period=8`). The run's curves:

# %%
records = jd.train.metrics.read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
print(f'test accuracy {summary["test_accuracy"]:.3f} after {summary["steps"]} steps')
jd.train.report.plot_curves(records, title='CNN on digits, 8 workers, all-reduce')
