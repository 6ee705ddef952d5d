"""Metrics to a JSONL file and TensorBoard event files, safe across restarts.

A run killed after its last checkpoint has logged steps that the resumed run
will compute again. On resume the JSONL log is cut back to the checkpoint's
step (rewritten atomically) and TensorBoard is told to purge later events, so
the log of a resumed run equals that of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

import tensorboardX
from tensorboardX.proto import summary_pb2

METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_DIR = 'tensorboard'
# Events tensorboardX holds before `write` waits for its writer thread (its default: 10).
TENSORBOARD_QUEUE = 1000
# Fields that hold wall-clock measurements (or derive from them): they differ from run to run.
TIMING_PREFIXES = ('step_s', 'host_wait_s', 'modelled_s@')


def without_timings(record: Mapping[str, Any]) -> dict[str, Any]:
  """`record` less its wall-clock fields: what two identical runs must agree on.

  Args:
    record: a metrics record.

  Returns:
    A copy without the keys starting with `TIMING_PREFIXES`.
  """
  return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """Records of a JSONL file; a torn last line (a crash mid-write) is dropped.

  Args:
    path: the file (it may not exist).

  Returns:
    The records, in order ([] without the file).
  """
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return records


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` via a temporary file and a rename.

  Args:
    path: the file to (re)place.
    text: its new contents.
  """
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.tmp-')
  try:
    with os.fdopen(fd, 'w') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


class MetricsWriter:
  """Appends per-step records to `workdir/metrics.jsonl` and to TensorBoard.

  Args:
    workdir: the run's directory.
    resume_step: the step training resumes from (0 for a fresh run); records
      after it are removed.
    enabled: False on all processes but the first, which write nothing.
  """

  def __init__(self, workdir: str, resume_step: int, enabled: bool = True):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = enabled
    self._file = None
    self._tb = None
    if not enabled:
      return
    kept = [r for r in read_jsonl(self.path) if r['step'] <= resume_step]
    write_atomic(self.path, ''.join(json.dumps(r) + '\n' for r in kept))
    self._file = open(self.path, 'a')  # noqa: SIM115 - lives as long as the writer
    self._tb = tensorboardX.SummaryWriter(
      os.path.join(workdir, TENSORBOARD_DIR),
      purge_step=resume_step + 1 if resume_step else None,
      max_queue=TENSORBOARD_QUEUE,
      # tensorboardX names its file by the second it opened it, and overwrites a file of that
      # name: a run resumed within the second would erase the events before it. The resume step
      # (zero-padded: TensorBoard reads a directory's files in name order) and the pid tell the
      # files apart.
      filename_suffix=f'.from{resume_step:09d}.{os.getpid()}',
    )

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    """Appends one record to the JSONL file and one event to TensorBoard.

    Args:
      step: the record's step.
      scalars: its values by key (numbers go to TensorBoard; the JSONL keeps
        every JSON-ready value).
    """
    if not self.enabled:
      return
    record = {'step': int(step), **{k: _plain(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record) + '\n')
    values = [
      summary_pb2.Summary.Value(tag=tensorboard_tag(key), simple_value=float(value))
      for key, value in record.items()
      if key != 'step' and isinstance(value, (int, float))
    ]
    # one event per step holding every scalar (add_scalar would send one event per scalar)
    self._tb.file_writer.add_summary(summary_pb2.Summary(value=values), step)

  def flush(self) -> None:
    """Makes every record written so far durable (before a checkpoint commits)."""
    if not self.enabled:
      return
    self._file.flush()
    os.fsync(self._file.fileno())
    self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    self.flush()
    self._file.close()
    self._tb.close()


def tensorboard_tag(key: str) -> str:
  """A legal TensorBoard tag for a record key: 'comm_s@1gbps' -> 'comm_s/1gbps'.

  Args:
    key: the record's key.

  Returns:
    The tag: '@' as '/', other characters TensorBoard refuses as '_'.
  """
  return re.sub(r'[^A-Za-z0-9_./-]', '_', key.replace('@', '/'))


def _plain(value: Any) -> Any:
  if hasattr(value, 'item'):
    return value.item()
  return value
