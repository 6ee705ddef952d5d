r"""Peak memory of Wavelet's staggered waves against one batch twice the size.

For each model, XLA's compiled memory analysis (temporary buffers: the peak
of activations and workspace, not counting parameters and inputs) of one
training step on one device, side by side:

  1 x 2B       one worker with a batch of 2B;
  2 x B        two workers (waves) with B each, computed together (vmap);
  2 x B tt     the same two waves staggered: one after the other under
               rematerialisation (`make_train_step(staggered=True)`), the
               system form of tick-tock.

Also the measured step time of each (median of `--repeats`). Memory comes
from the compiler, so it is exact for this backend; the CPU has no memory
pressure, so the times show the cost of rematerialisation, not a gain.

  python experiments/bench_waves.py
"""

from absl import app, flags

flags.DEFINE_integer('repeats', 10, 'Timed steps; the median is reported.')
FLAGS = flags.FLAGS

CASES = (('cnn', (8, 8, 1), 256), ('resnet20', (32, 32, 3), 64))


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import optax

  import jaxdist as jd
  from jaxdist import timing
  from jaxdist.train import report
  from jaxdist.train import step as step_lib

  rows = []
  for name, shape, batch in CASES:
    model = jd.models.get(name, num_classes=10)
    base = None
    for label, workers, staggered, per in (
      ('1 x 2B', 1, False, 2 * batch),
      ('2 x B, together', 2, False, batch),
      ('2 x B, tick-tock', 2, True, batch),
    ):
      layout = jd.runtime.layout(workers, devices=1)
      tx = optax.chain(jd.sync.allreduce(axis_name=layout.axis_name), optax.sgd(0.01))
      state = step_lib.make_init(model, tx, layout, shape)(jax.random.key(0))
      # together = vmap (every worker's activations at once; on the CPU 'auto' would loop)
      per_worker = 'auto' if staggered else 'vmap'
      step = step_lib.make_train_step(model, tx, layout, staggered=staggered, per_worker=per_worker)
      x = jax.device_put(jnp.zeros((workers, per, *shape)), layout.sharding)
      y = jax.device_put(jnp.zeros((workers, per), jnp.int32), layout.sharding)
      memory = step.lower(state, x, y).compile().memory_analysis().temp_size_in_bytes
      box = [state]

      def run(box=box, step=step, x=x, y=y):
        box[0], metrics = step(box[0], x, y)
        return metrics

      seconds = timing.median_seconds(run, FLAGS.repeats)
      base = base or memory
      rows.append(
        {
          'model': name,
          'layout': label,
          'examples': workers * per,
          'peak': report.human_bytes(memory),
          'ratio': f'{memory / base:.2f}',
          'ms': f'{1e3 * seconds:.1f}',
        }
      )
  print(
    report.table(
      rows,
      [
        ('model', 'model'),
        ('layout', 'step'),
        ('examples', 'examples'),
        ('peak', 'peak temp memory'),
        ('ratio', 'vs 1 x 2B'),
        ('ms', 'step ms'),
      ],
    )
  )


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
