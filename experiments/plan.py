r"""Plans a job's cluster (K workers, global batch B) as Scavenger does, then checks the plan.

Tyagi & Sharma, CCGrid 2023 (`jaxdist.control.scavenger`), on the modelled
clock of this library (one worker's measured step + α-β communication):

1. Profile: short runs (--profile_steps) at the four corners of the grid
   --workers × --batches (--search=partial) or at every point (full). From
   each: the modelled step on --network (the records' `modelled_s@<net>`),
   split into compute (the summary's `worker_step_s`, one worker's measured
   step) and sync (the rest); and γ/K (the records' `gamma_normalized`, the
   trainer's EWMA of Eq. 2) at step --profile_steps.
2. Run to the target: (K_min, B_min) and (K_max, B_max) (or --target_runs)
   trained for --max_steps; each gives its γ/K (at step --profile_steps, as
   the profiles) and its epochs to the target = the first evaluation at
   --target test accuracy × B / D. The epoch model e = e* + θ·γ/K is fitted
   on each run's own γ/K (--epoch_noise=measured, the paper) or on the γ/K
   the search predicts at its (K, B) (predicted: the same predictor as the
   table's epochs; the two differ when γ/K depends on K at a fixed B).
3. Fit the affine models, search, print the table (plan.md, plan.json) and
   plot cost against time with the Pareto front and the choice (plan.png).
4. Train the chosen configuration to the target (a run of step 2 is reused)
   and compare predicted and actual modelled time and cost.

  python experiments/plan.py --workdir=/tmp/plan
  python experiments/plan.py --workdir=/tmp/plan --search=full --objective=cost \
      --workers=4,8,16 --batches=128,256,512 --target=0.95 --price=0.13402 --max_cost=0.001

Time is modelled seconds; cost is time / 3600 × K × --price (per worker-hour).
The γ/K of a profile and of a long run are comparable because both are read
at step --profile_steps: the runs are the same until then while the learning
rate is warming up (--profile_steps <= config.optimizer.warmup_steps, as
with configs/digits.py), and close to it after. Finished runs in --workdir are
reused, so a second call with another --objective or caps trains nothing new
(--fresh: trains them again).
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from jaxdist.train import cli

DIGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'configs', 'digits.py')
config_flags.DEFINE_config_file('config', DIGITS, 'Config file of the job to plan.')
flags.DEFINE_string('workdir', None, 'Directory; each run trains in a subdirectory.')
flags.DEFINE_list('workers', ['4', '8', '16'], 'The K of the grid.')
flags.DEFINE_list('batches', ['128', '256', '512'], 'The global batches B of the grid.')
flags.DEFINE_enum('search', 'partial', ['partial', 'full'], 'Profile the corners or every point.')
flags.DEFINE_integer('profile_steps', 20, 'Steps of a profiling run; γ/K is read at this step.')
flags.DEFINE_float('target', 0.95, 'Test accuracy to train to.')
flags.DEFINE_integer('max_steps', 120, 'Steps of a run to the target (the learning-rate schedule).')
flags.DEFINE_integer('eval_every', 2, 'Evaluations every this many steps (the target resolution).')
flags.DEFINE_list('target_runs', None, 'K:B runs to the target (default: the grid corners).')
flags.DEFINE_enum(
  'epoch_noise',
  'measured',
  ['measured', 'predicted'],
  'The γ/K of a run to the target that the epoch model is fitted on: its own (the paper), or '
  "the search's prediction at its (K, B) (the same predictor as the table's epochs).",
)
flags.DEFINE_float(
  'price', None, 'Price per worker-hour (default: config.cluster.price or 0.13402).'
)
flags.DEFINE_string('network', None, 'Network profile of the clock (default: the first).')
flags.DEFINE_enum('objective', 'knee', ['time', 'cost', 'knee'], 'What to minimise.')
flags.DEFINE_float('max_cost', None, 'Cap on the predicted cost.')
flags.DEFINE_float('max_time_s', None, 'Cap on the predicted time, seconds.')
flags.DEFINE_integer('max_batch', None, 'Cap on B (memory).')
flags.DEFINE_integer('min_workers', None, 'Least K.')
flags.DEFINE_integer('max_workers', None, 'Most K.')
flags.DEFINE_integer('cpu_devices', 8, 'CPU devices to create when running on the CPU.')
flags.DEFINE_bool('fresh', False, 'Train every run afresh, deleting those in --workdir.')
flags.mark_flags_as_required(['workdir'])
cli.integers('workers')
cli.integers('batches')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup(FLAGS.cpu_devices)
  command = ' '.join(['python', *sys.argv])
  from jaxdist.train import trials  # after the CPU devices are set

  caps = {
    'max_cost': FLAGS.max_cost,
    'max_time_s': FLAGS.max_time_s,
    'max_batch': FLAGS.max_batch,
    'min_workers': FLAGS.min_workers,
    'max_workers': FLAGS.max_workers,
  }
  cli.run(
    trials.scavenger_plan, FLAGS.config, FLAGS.workdir, command, workers=FLAGS.workers,
    batches=FLAGS.batches, target_runs=FLAGS.target_runs, search=FLAGS.search,
    profile_steps=FLAGS.profile_steps, target=FLAGS.target, max_steps=FLAGS.max_steps,
    eval_every=FLAGS.eval_every, epoch_noise=FLAGS.epoch_noise, price=FLAGS.price,
    network=FLAGS.network, objective=FLAGS.objective, caps=caps, fresh=FLAGS.fresh,
  )  # fmt: skip


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
