r"""α and β of the link between processes: `jd.netmodel.calibrate` over jax.distributed.

One command per process (bench_network.py starts one in each namespace), each
with `--cpu_devices` CPU devices: bench_network gives it the training run's
layout (the config's workers over the hosts), so the α and β fitted to the
ring model of all those workers, `2(N-1)α + 2(N-1)/N·Mβ`, are the ones the
run's modelled clock prices its collectives with. With one device each, every
hop of the ring crosses a link. Process 0 prints the fitted network as JSON
(latency in s, bandwidth in B/s).

  python experiments/calibrate_link.py --coordinator_address=10.0.0.1:23457 \
      --num_processes=2 --process_id=0
"""

from __future__ import annotations

import json

from absl import app, flags

flags.DEFINE_string('coordinator_address', None, 'host:port of process 0.')
flags.DEFINE_integer('num_processes', 2, 'Processes (one device each).')
flags.DEFINE_integer('process_id', 0, 'This process.')
flags.DEFINE_integer('cpu_devices', 1, 'CPU devices of this process (workers on this host).')
flags.DEFINE_list('sizes', ['1024', '65536', '262144', '1048576'], 'float32 elements per psum.')
flags.DEFINE_integer('repeats', 5, 'Timings per size (the median is fitted).')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from jaxdist import runtime

  runtime.cpu_devices(FLAGS.cpu_devices)
  runtime.initialize_distributed(
    FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id, heartbeat_timeout_s=30
  )
  import jax

  from jaxdist import netmodel

  workers = runtime.layout(FLAGS.num_processes * FLAGS.cpu_devices)
  fitted = netmodel.calibrate(workers, [int(s) for s in FLAGS.sizes], FLAGS.repeats)
  if jax.process_index() == 0:
    print(json.dumps({'latency': fitted.latency, 'bandwidth': fitted.bandwidth}), flush=True)


if __name__ == '__main__':
  app.run(main)
