"""The PyTorch half of peer_check.py: DDP's communication hooks on the inputs it saved.

Run by peer_check.py with a Python that has torch (never the project's):

  TORCH_PYTHON experiments/peer_check_torch.py SECTION WORKERS IN.npz OUT_DIR

starts WORKERS processes in one gloo group on 127.0.0.1 and calls the hooks
themselves, each process with its own worker's inputs: the all-reduces are
real ones between processes. A hook is handed what DDP would hand it: the
bucket's flat buffer (PowerSGD: an object with DDP's `GradBucket` methods,
one bucket holding one matrix). Each process writes OUT_DIR/<rank>.npz.

A section is a function of (rank, world size, inputs) returning arrays; add
one to SECTIONS beside its jaxdist half in peer_check.py.
"""

import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook


def fp16(rank, world, inputs):
  """fp16_compress_hook on each case's [workers, n] gradients: the decompressed mean."""
  out = {}
  for name, grads_WxN in inputs.items():
    buffer = torch.from_numpy(grads_WxN[rank].copy())
    out[name] = default_hooks.fp16_compress_hook(None, (buffer,)).wait().numpy()
  return out


class Bucket:
  """What powerSGD_hook reads of DDP's GradBucket, for one bucket holding one matrix."""

  def __init__(self, matrix):
    self.flat = matrix.reshape(-1)
    self.shape = matrix.shape

  def buffer(self):
    return self.flat

  def gradients(self):
    return [self.flat.view(self.shape)]

  def index(self):
    return 0

  def is_last(self):
    return True


def powersgd(rank, world, inputs):
  """powerSGD_hook at each rank of inputs['ranks'], warm start and error feedback on.

  inputs['grads'] is [steps, workers, rows, cols]; the first `start` steps are
  dense (start_powerSGD_iter, at least 2 with warm start). Before the first
  compressed step the hook's Q memory is set to inputs['q0_r<rank>'] (its own
  draw otherwise), so that it starts where jaxdist starts: the hook takes it
  as a warm start and orthogonalises it. Returns per rank the mean and this
  worker's error memory after every step.
  """
  grads, start = inputs['grads'], int(inputs['start'])
  out = {}
  for r in inputs['ranks']:
    state = powerSGD_hook.PowerSGDState(
      process_group=None, matrix_approximation_rank=int(r), start_powerSGD_iter=start
    )
    means, memories = [], []
    for step, grads_WxRxC in enumerate(grads):
      if step == start:
        state.p_memory_dict[0] = torch.empty(grads.shape[2] * int(r))
        state.q_memory_dict[0] = torch.from_numpy(inputs[f'q0_r{r}'].reshape(-1).copy())
      bucket = Bucket(torch.from_numpy(grads_WxRxC[rank].copy()))
      means.append(powerSGD_hook.powerSGD_hook(state, bucket).wait().view(bucket.shape).numpy())
      memory = state.error_dict.get(0, torch.zeros(bucket.flat.numel()))
      memories.append(memory.view(bucket.shape).numpy().copy())
    out[f'mean_r{r}'], out[f'memory_r{r}'] = np.stack(means), np.stack(memories)
  return out


SECTIONS = {'fp16': fp16, 'powersgd': powersgd}


def worker(rank, world, port, section, inputs_path, out_dir):
  torch.set_num_threads(1)
  address = f'tcp://127.0.0.1:{port}'
  dist.init_process_group('gloo', init_method=address, rank=rank, world_size=world)
  with np.load(inputs_path) as f:
    inputs = dict(f)
  out = SECTIONS[section](rank, world, inputs)
  np.savez(os.path.join(out_dir, f'{rank}.npz'), **out)
  dist.barrier()
  dist.destroy_process_group()


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


if __name__ == '__main__':
  section, world, inputs_path, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
  mp.spawn(worker, args=(world, free_port(), section, inputs_path, out_dir), nprocs=world)
