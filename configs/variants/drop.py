"""Workers dropping out (`config.fault.drop`, of 8 workers; `make results`:
experiments/results/drop.md)."""

from jaxdist.train.config import method

VARIANTS = {
  'bsp': method('allreduce'),
  'drop1_at20': {'fault': {'drop': '7@20'}},
  'drop1_20_60': {'fault': {'drop': '7@20-60'}},
  'drop4_at20': {'fault': {'drop': '4@20,5@20,6@20,7@20'}},
}
