"""Stands in for ../shared/peers/torch_ddp_digits.py (tests copy it there as that name).

It has the same shape: `main` parses the peers' arguments and calls
`launch(args, store, result)`, which starts `args.world_size` ranks of
`worker(rank, args, store, result)` (threads here, processes there); rank 0
writes the result that `main` prints as one JSON line. Each rank leaves
`<store>.rank<r>` holding the world size it was given, then waits for every
rank of the world: the hosts meet only if they share one store.
"""

import argparse
import json
import os
import tempfile
import threading
import time


def worker(rank, args, store, result):
  with open(f'{store}.rank{rank}', 'w') as f:
    f.write(str(args.world_size))
  deadline = time.time() + 60
  while not all(os.path.exists(f'{store}.rank{r}') for r in range(args.world_size)):
    if time.time() > deadline:
      raise SystemExit(f'rank {rank}: the other ranks never came')
    time.sleep(0.05)
  if rank == 0:
    with open(result, 'w') as f:
      json.dump(
        {'hook': args.hook, 'world_size': args.world_size, 'median_step_ms': 12.5, 'test_acc': 0.5},
        f,
      )


def launch(args, store, result):
  threads = [
    threading.Thread(target=worker, args=(i, args, store, result)) for i in range(args.world_size)
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return os.environ.get('FAKE_LAUNCH_ERROR')


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--world_size', type=int)
  ap.add_argument('--hook', default='none')
  args, _ = ap.parse_known_args()  # the rest: --steps, --match_jaxdist, …
  with tempfile.TemporaryDirectory() as td:
    result = os.path.join(td, 'result.json')
    err = launch(args, os.path.join(td, 'store'), result)
    res = {'error': err or 'no result written'}
    if os.path.exists(result):
      with open(result) as f:
        res = json.load(f)
  print(json.dumps(res), flush=True)
  return 1 if 'error' in res else 0
