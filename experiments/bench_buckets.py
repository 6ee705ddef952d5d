r"""Modelled time of backprop + gradient all-reduce, by bucket plan, with and without overlap.

For each model: the backward pass of one worker's batch is timed on this
machine and split over the parameter leaves in proportion to their FLOPs;
leaf sizes come from the model; each bucket's all-reduce costs a ring's
2(N−1)α + 2(N−1)/N·β·bytes on the network profile. Plans: every leaf on its
own (WFBP), one bucket, PyTorch DDP's 25 MB buckets, 64 KB buckets, and
MG-WFBP's merge. Overlap: a bucket's all-reduce starts as soon as its
gradients are ready (and the link is free); without: after backprop.

  python experiments/bench_buckets.py
  python experiments/bench_buckets.py --workers=16 --networks=10gbps,100gbps
"""

from absl import app, flags

flags.DEFINE_integer('workers', 8, 'N, the workers sharing each all-reduce.')
flags.DEFINE_list('networks', ['1gbps', '10gbps'], 'Network profiles.')
flags.DEFINE_integer('repeats', 10, 'Timed backward passes; the median is used.')
FLAGS = flags.FLAGS

CASES = (('cnn', (8, 8, 1), 16), ('resnet20', (32, 32, 3), 32))


def _backward_seconds(model, params, rest, x, y, repeats):
  """Median (grad − forward) time of one worker's batch."""
  import jax
  import optax

  from jaxdist import timing

  def loss(p):
    logits = model.apply({'params': p, **rest}, x, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  forward, grad = jax.jit(loss), jax.jit(jax.grad(loss))
  forward_s = timing.median_seconds(lambda: forward(params), repeats)
  grad_s = timing.median_seconds(lambda: grad(params), repeats)
  return max(grad_s - forward_s, 1e-6)


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  import jaxdist as jd
  from jaxdist.netmodel import buckets as bucketing
  from jaxdist.train import report

  n = FLAGS.workers
  rows = []
  for name, shape, batch in CASES:
    model = jd.models.get(name, num_classes=10)
    variables = model.init(jax.random.key(0), jnp.zeros((1, *shape)))
    params = variables['params']
    rest = {k: v for k, v in variables.items() if k != 'params'}
    x, y = jnp.zeros((batch, *shape)), jnp.zeros((batch,), jnp.int32)
    fn = lambda p, x, model=model, rest=rest: model.apply({'params': p, **rest}, x, train=False)
    order = bucketing.forward_order(fn, params, x)
    sizes = [leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params)]
    backward = _backward_seconds(model, params, rest, x, y, FLAGS.repeats)
    times = bucketing.backward_times(bucketing.layer_flops(fn, params, x), backward)
    for net_name in FLAGS.networks:
      net = jd.netmodel.profile(net_name)
      alpha, beta = 2 * (n - 1) * net.latency, 2 * (n - 1) / n * net.beta
      plans = {
        'per layer (WFBP)': bucketing.per_layer_buckets(order),
        'one bucket': [list(reversed(order))],
        'DDP 25 MB': bucketing.threshold_buckets(sizes, 25 << 20, order),
        '64 KB': bucketing.threshold_buckets(sizes, 64 << 10, order),
        'MG-WFBP': bucketing.mgwfbp_buckets(sizes, times, alpha, beta, order),
      }
      for label, plan in plans.items():
        with_overlap = bucketing.timeline(plan, sizes, times, alpha, beta, order)
        without = bucketing.timeline(plan, sizes, times, alpha, beta, order, overlap=False)
        rows.append(
          {
            'model': name,
            'net': net_name,
            'plan': label,
            'buckets': len(plan),
            'backward': f'{1e3 * backward:.2f}',
            'overlap': f'{1e3 * with_overlap:.2f}',
            'serial': f'{1e3 * without:.2f}',
          }
        )
  print(f'{n} workers; times in ms from the start of backprop to the end of the last all-reduce')
  print(
    report.table(
      rows,
      [
        ('model', 'model'),
        ('net', 'network'),
        ('plan', 'plan'),
        ('buckets', 'buckets'),
        ('backward', 'backward'),
        ('overlap', 'with overlap'),
        ('serial', 'without'),
      ],
    )
  )


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
