r"""The ratio a controller sent per step, from a run's metrics, as a PNG.

  python experiments/plot_ratios.py --metrics=workdir/results/adopt/metrics.jsonl \
      --network=adopt_c1@25 --out=experiments/results/adopt_ratios.png
"""

from absl import app, flags

flags.DEFINE_string('metrics', None, "A run's metrics.jsonl.", required=True)
flags.DEFINE_string('network', None, 'The profile whose modelled comm to draw.', required=True)
flags.DEFINE_string('out', None, 'Where to write the PNG.', required=True)
flags.DEFINE_string('title', '', 'Title of the plot.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from jaxdist.train import metrics, report

  records = metrics.read_jsonl(FLAGS.metrics)
  if not records or 'ratio' not in records[0]:
    raise SystemExit(f'error: {FLAGS.metrics} has no ratio per step (run a config.adaptive run)')
  report.save(report.plot_ratios(records, FLAGS.network, FLAGS.title), FLAGS.out)
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
