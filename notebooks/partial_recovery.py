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
# # Partial recovery: CPR keeps training when an embedding shard fails
#
# <a href="https://colab.research.google.com/github/jaxdist/jaxdist/blob/main/notebooks/partial_recovery.ipynb"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Recommendation models keep most of their parameters in embedding tables
# spread over many machines, and those machines fail. Full recovery rolls
# every worker back to the last checkpoint and recomputes the lost steps;
# CPR (Maeng et al., MLSys 2021) reloads only the failed shard and lets the
# others go on, trading a few lost embedding updates (the portion of lost
# samples, PLS) for almost no lost time. jaxdist trains a small DLRM in the
# hybrid layout (tables model-parallel over 8 workers with all-to-alls, the
# MLP data-parallel with an all-reduce) on a synthetic click stream with a
# known teacher, through injected failures on a modelled clock. Where jaxdist
# is missing (on Colab), the first cell installs it.

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
# ## The cluster and the checkpoint intervals
#
# Modelled costs: a step takes 1 s, a full checkpoint 0.125 s, loading it
# 0.25 s (a shard loads 1/8 of it), replacing a node 0.125 s, and some
# worker fails every 50 s on average: `experiments/cpr.py`'s costs divided
# by 4, so that a run of 300 steps sees several failures and the overheads
# keep their proportions. Full
# recovery checkpoints at Young's interval √(2·O_save·T_fail); partial
# recovery at the longest interval whose expected PLS, T_save / (2·N·T_fail),
# meets the target.

# %%
workers = 8
from jaxdist.data.clicks import clicks
from jaxdist.faults import cpr, report
from jaxdist.train import failures

mesh = jd.runtime.layout(workers).mesh
costs = cpr.Costs(step_s=1.0, save_s=0.125, load_s=0.25, restart_s=0.125, mttf_s=50.0)
data = clicks(num_tables=8, rows=500)
print(f'Young interval (full): {cpr.young_interval(costs.save_s, costs.mttf_s):.1f} s')
for target in (0.05, 0.2):
  print(f'PLS {target} interval (partial): {cpr.pls_interval(target, costs.mttf_s, workers):.0f} s')

# %% [markdown]
# ## Each strategy through the same failures
#
# `none` trains without failures; `full` rolls back; `partial` reloads the
# failed shard (PLS targets 0.05 and 0.2); `partial_mfu` and `partial_ssu`
# spend the same checkpoint budget as `partial`, but write the rows used most
# since their last save (MFU) or a sample of the used rows (SSU) every eighth
# of a longer full interval.

# %%
runs = [(name, 0.05) for name in ('none', 'full', 'partial', 'partial_mfu', 'partial_ssu')]
runs.append(('partial', 0.2))
summaries = []
for name, target in runs:
  strategy = cpr.strategy(name, costs, workers, pls_target=target)
  summaries.append(
    failures.train_with_failures(
      data,
      strategy,
      costs,
      mesh=mesh,
      steps=300,
      batch_size=256,
      test_size=4096,
      eval_every=30,
      metrics_dir=os.path.abspath(f'workdir/partial_recovery/{name}_{target:g}'),
    )
  )
  s = summaries[-1]
  print(
    f'{report.label(s):20s} test accuracy {s["test_accuracy"]:.4f}, test log-loss '
    f'{s["test_loss"]:.4f}, PLS {s["pls"]:.3f}, {s["failures"]} failures, '
    f'overhead {100 * s["total_overhead"]:.2f}%'
  )

# %% [markdown]
# Log-loss against PLS (left) and where the time goes (right): full
# recovery pays for frequent checkpoints and for recomputing the steps since
# the last one; partial recovery pays little more than the restarts, and
# loses a little quality as PLS grows.

# %%
report.plot(summaries, title='CPR at notebook size')

# %% [markdown]
# The test log-loss on the modelled clock: full recovery ends with the
# failure-free model, later (each failure costs it the steps since its last
# checkpoint); partial recovery ends almost on time.

# %%
from matplotlib.figure import Figure


def plot_clock(summaries):
  """Test log-loss of each run against modelled seconds."""
  fig = Figure(figsize=(7, 3.5))
  ax = fig.subplots()
  for s in summaries:
    evals = [r for r in s['records'] if 'test_loss' in r]
    ax.plot([r['clock_s'] for r in evals], [r['test_loss'] for r in evals], '.-',
            label=report.label(s))  # fmt: skip
  ax.set(xlabel='modelled seconds', ylabel='test log-loss')
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig


plot_clock([s for s in summaries if s['strategy'] in ('none', 'full', 'partial')])
