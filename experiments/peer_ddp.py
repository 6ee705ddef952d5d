"""The peers' PyTorch DDP runs (../shared/peers/torch_ddp_digits.py): their arguments and output.

Shared by bench_peers.py (DDP on this machine's loopback) and bench_network.py
(DDP's ranks spread over network namespaces, through ddp_hosts.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_DIR = os.path.join(REPO, '..', 'shared', 'peers')
PEER_SCRIPT = 'torch_ddp_digits.py'
# DDP's run of each method: side_by_side.sh's arguments (no DDP comm hook does Top-k)
DDP_ARGS = {
  'dense': ('--hook', 'none'),
  'powersgd2': ('--hook', 'powersgd2'),
  'local4': ('--local_sgd_period', '4'),
}


def parse_peer_output(stdout: str) -> dict[str, Any] | None:
  """The last line of a DDP run's stdout that is a JSON object, or None."""
  for line in reversed(stdout.splitlines()):
    line = line.strip()
    if line.startswith('{'):
      try:
        parsed = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(parsed, dict):
        return parsed
  return None


def result(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
  """A finished DDP run's JSON line, with an 'error' key if the run failed."""
  line = parse_peer_output(stdout)
  if line is None:
    tail = ' | '.join(stderr.strip().splitlines()[-3:])
    return {'error': f'exit status {returncode} and no JSON line; stderr: {tail}'}
  if returncode and 'error' not in line:
    line['error'] = f'exit status {returncode}'
  return line


def run_ddp(command: Sequence[str], timeout_s: float) -> dict[str, Any]:
  """Runs one DDP command: its JSON line, with an 'error' key if the run failed."""
  try:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:  # the peers' workers die with their launcher (PDEATHSIG)
    return {'error': f'timeout: killed after {timeout_s:g} s'}
  return result(proc.returncode, proc.stdout, proc.stderr)


def ok(line: Mapping[str, Any] | None) -> bool:
  """Whether a DDP JSON line is a finished run with a median step."""
  return line is not None and 'error' not in line and line.get('median_step_ms') is not None
