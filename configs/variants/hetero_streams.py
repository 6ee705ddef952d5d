"""ScaDLES's streams at a real input rate on unequal hosts (`make bench-hetero`'s streams run).

  sudo python experiments/bench_hetero.py --variants=configs/variants/hetero_streams.py

Three hosts (the bench's CPU shares), each fed by a stream of 1280, 640 and 160 examples a
second, the fastest stream on the fastest host. `config.streams.realtime`: each worker's
examples arrive at its rate in wall-clock and it waits for its batch before the step
(`jd.control.Arrivals`); the buffers keep 0.1 s of stream (truncation, ScaDLES's bounded
buffer, for both variants). 'ddl' is the paper's conventional baseline: B / K = 128 examples
on every worker, so each step waits for the 160/s stream. 'scadles' trains what streamed in:
stream-proportional batches of 0.1 s (128, 64 and 16), weighted b_k / Σb, the learning rate
scaled by Σb / B (ScaDLES, Tyagi & Swany 2022, Eqs. 2-4); each worker holds b_max = 128
examples and computes only the micro-batches of 16 that hold its own (8, 4 and 1 of them).
"""

SETTINGS = {
  'workers': 3,
  'batch_size': 384,
  'noise_every': 0,
  'cluster': {'stream_rates': '1280,640,160'},
  'streams': {'interval_s': 0.1, 'buffer': 'truncation', 'realtime': True, 'b_max': 128},
}

VARIANTS = {
  'ddl': {},
  'scadles': {'batching': 'stream', 'dynamic_batching': {'micro_batch': 16}},
}
