r"""PyTorch DDP (the peers' torch_ddp_digits.py) with its ranks spread over hosts.

One command per host: bench_network.py starts one in each network namespace.
Host h of `--hosts` K starts ranks h·W/K … (h+1)·W/K − 1 of the peers'
`--world_size` W, all meeting in one FileStore (`--store`; the namespaces
share the file system) and sending over gloo bound to `--ifname`, the
namespace's link. Ranks on one host reach each other at that address without
crossing the link, as jaxdist's devices in one process do.

The peers' script is run as it is, from `--peers_dir`: its `main` parses its
own arguments (those after `--`), trains and prints its JSON line on host 0.
Two of its functions are swapped for this: `launch` starts only this host's
W/K ranks, and `worker` gives each its global rank and the shared store. On
the other hosts its `main` finds no result to print (host 0's rank 0 writes
it) and says so; this command then exits 0 unless one of its own ranks
failed.

  ip netns exec H0 python experiments/ddp_hosts.py --host=0 --hosts=2 \
      --store=/tmp/run/store -- --world_size 8 --steps 300 --match_jaxdist --hook powersgd2
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS_DIR = os.path.join(ROOT, '..', 'shared', 'peers')
# read again by every spawned rank, which imports this file afresh
sys.path.insert(0, os.environ.get('JAXDIST_PEERS_DIR', PEERS_DIR))

import torch_ddp_digits as peer  # noqa: E402  (the peers' script)

PEER_WORKER = peer.worker  # the peers' own, before main swaps in ranked_worker
_ENV = 'JAXDIST_DDP_'  # what the spawned ranks read: world size, rank offset, store


def ranked_worker(local: int, args, store: str, result: str) -> None:
  """The peers' worker as rank offset + local of the whole world, in the shared store."""
  del store  # the launcher's own temporary one
  args = copy.copy(args)
  args.world_size = int(os.environ[_ENV + 'WORLD'])
  rank = int(os.environ[_ENV + 'OFFSET']) + local
  PEER_WORKER(rank, args, os.environ[_ENV + 'STORE'], result)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """This launcher's arguments, and the peers' script's (those after `--`)."""
  cut = argv.index('--') if '--' in argv else len(argv)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--host', type=int, default=0, help='This host, 0 … hosts - 1.')
  parser.add_argument('--hosts', type=int, default=1, help='Hosts the world is spread over.')
  parser.add_argument('--store', required=True, help='FileStore path every host reaches.')
  parser.add_argument('--ifname', default='eth0', help='The interface gloo binds (the link).')
  flags = parser.parse_args(argv[:cut])
  if not 0 <= flags.host < flags.hosts:
    parser.error(f'--host must be in 0 … {flags.hosts - 1}, got {flags.host}')
  if os.path.exists(flags.store):
    parser.error(f'--store {flags.store} exists: give every run a fresh path')
  return flags, argv[cut + 1 :]


def main(argv: list[str]) -> int:
  opts, rest = parse(argv)
  whole_launch, errors = peer.launch, []

  def host_launch(args, store: str, result: str):
    if args.world_size % opts.hosts:
      raise SystemExit(f'--world_size {args.world_size} must split evenly over {opts.hosts} hosts')
    per_host = args.world_size // opts.hosts
    os.environ.update({
      _ENV + 'WORLD': str(args.world_size), _ENV + 'OFFSET': str(opts.host * per_host),
      _ENV + 'STORE': os.path.abspath(opts.store),
    })  # fmt: skip
    mine = copy.copy(args)
    mine.world_size = per_host  # how many the peers' launch starts here
    errors.append(whole_launch(mine, store, result))
    return errors[-1]

  os.environ['GLOO_SOCKET_IFNAME'] = opts.ifname
  peer.launch, peer.worker = host_launch, ranked_worker
  sys.argv = [peer.__file__, *rest]
  status = peer.main()
  if opts.host == 0:
    return status
  return 1 if not errors or errors[-1] else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
