"""Streaming data (ScaDLES): the fixed-batch baseline with persistent buffers against
stream-proportional batches with truncated ones, at two of the paper's rate sets
(`make results`: experiments/results/streams.md)."""

from typing import Any


def streamed(rates: str, batching: str, buffer: str) -> dict[str, Any]:
  """Stream rates `rates` (`config.cluster.stream_rates`), batches by `batching`."""
  # mean batch S · 0.25 s: S10's 64/s gives 16, the per-worker batch of 128 over 8 workers
  return {
    'cluster': {'stream_rates': rates},
    'batching': batching,
    'streams': {'interval_s': 0.25, 'b_max': 64, 'buffer': buffer},
  }


VARIANTS = {
  'ddl_s1': streamed('S1', 'uniform', 'persistence'),
  'scadles_s1': streamed('S1', 'stream', 'truncation'),
  'ddl_s10': streamed('S10', 'uniform', 'persistence'),
  'scadles_s10': streamed('S10', 'stream', 'truncation'),
}
