"""Failures and recovery: CPR partial recovery (Maeng et al., MLSys 2021) on a hybrid DLRM.

Import the modules you need (none loads at `import jaxdist`):

- `jaxdist.faults.cpr`: the failure process, Young's and the PLS-target
  checkpoint intervals, PLS, MFU/SSU row choice, a row-level checkpoint
  store with full and partial restore (host-side, numpy only);
- `jaxdist.faults.hybrid`: DLRM's hybrid layout, embedding tables
  model-parallel (all-to-all) and MLP data-parallel (all-reduce), in one
  `shard_map` step, and its one-device reference;
- `jaxdist.faults.recovery`: `Recovery`, a run's checkpoints, failures
  and charges on CPR's modelled clock (the trainer, `train_with_failures`,
  is `jaxdist.train.failures`);
- `jaxdist.faults.report`: the table and the figure of a set of runs;
- `jaxdist.faults.inject`: `config.fault`'s simulated failures for the
  data-parallel trainer (a straggling worker, a worker that drops out).

The model is `jaxdist.models.dlrm`, the data `jaxdist.data.clicks`; the
binary `experiments/cpr.py`, the notebook `notebooks/partial_recovery.py`.
"""
