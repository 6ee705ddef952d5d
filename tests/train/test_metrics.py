"""`jd.train.metrics.MetricsWriter`: the JSONL log and the TensorBoard events, read back."""

import os
import struct

import numpy as np
from tensorboardX.proto import event_pb2

from jaxdist.train import metrics


def _events(path: str) -> list[event_pb2.Event]:
  """The Event records of a TFRecord file: [u64 length][u32 crc][data][u32 crc] each."""
  with open(path, 'rb') as f:
    data = f.read()
  events, at = [], 0
  while at < len(data):
    (length,) = struct.unpack('<Q', data[at : at + 8])
    events.append(event_pb2.Event.FromString(data[at + 12 : at + 12 + length]))
    at += 12 + length + 4
  assert at == len(data), 'a torn record at the end'
  return events


def _files(workdir) -> list[str]:
  folder = os.path.join(workdir, 'tensorboard')
  return [os.path.join(folder, f) for f in sorted(os.listdir(folder))]


def _scalars(events) -> dict[int, dict[str, float]]:
  """step -> {tag: value} over the events that carry a summary."""
  out: dict[int, dict[str, float]] = {}
  for e in events:
    for v in e.summary.value:
      step = out.setdefault(e.step, {})
      assert v.tag not in step, f'{v.tag} twice at step {e.step}'
      step[v.tag] = v.simple_value
  return out


def test_every_numeric_field_reaches_tensorboard_in_one_event_per_step(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), 0)
  writer.write(1, {'loss': 2.25, 'comm_s@1gbps': 0.5, 'wire': 8, 'note': 'text', 'gap': None})
  writer.write(2, {'loss': 1.5, 'comm_s@1gbps': 0.125, 'wire': 8, 'accuracy': np.float32(0.75)})
  writer.close()

  (path,) = _files(tmp_path)
  events = _events(path)
  with_summary = [e for e in events if e.HasField('summary')]
  assert [e.step for e in with_summary] == [1, 2]  # one event per step, not one per scalar
  # values that float32 holds exactly, written by hand; strings and None stay out
  assert _scalars(with_summary) == {
    1: {'loss': 2.25, 'comm_s/1gbps': 0.5, 'wire': 8.0},
    2: {'loss': 1.5, 'comm_s/1gbps': 0.125, 'wire': 8.0, 'accuracy': 0.75},
  }
  logged = metrics.read_jsonl(str(tmp_path / metrics.METRICS_FILE))
  assert logged == [
    {'step': 1, 'loss': 2.25, 'comm_s@1gbps': 0.5, 'wire': 8, 'note': 'text', 'gap': None},
    {'step': 2, 'loss': 1.5, 'comm_s@1gbps': 0.125, 'wire': 8, 'accuracy': 0.75},
  ]


def test_a_resume_in_the_same_second_keeps_the_first_file_and_purges_from_its_step(tmp_path):
  first = metrics.MetricsWriter(str(tmp_path), 0)
  for step in range(1, 6):
    first.write(step, {'loss': float(step)})
  first.close()
  # resumed from the checkpoint at step 3, at once (tensorboardX names files by the second)
  resumed = metrics.MetricsWriter(str(tmp_path), 3)
  resumed.write(4, {'loss': 40.0})
  resumed.close()

  before, after = (_events(p) for p in _files(tmp_path))
  assert _scalars(before) == {s: {'loss': float(s)} for s in range(1, 6)}
  # TensorBoard drops the earlier file's events from step 4 on: one START (1) at step 4
  logs = [(e.step, e.session_log.status) for e in after if e.HasField('session_log')]
  assert logs == [(4, 1)]
  assert _scalars(after) == {4: {'loss': 40.0}}
  logged = metrics.read_jsonl(str(tmp_path / metrics.METRICS_FILE))
  assert logged == [{'step': s, 'loss': float(s)} for s in (1, 2, 3)] + [{'step': 4, 'loss': 40.0}]
