"""The PyTorch half of peer_check.py: DDP's hooks and model averagers on the inputs it saved.

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
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import (
  default_hooks,
  post_localSGD_hook,
  powerSGD_hook,
)
from torch.distributed.algorithms.model_averaging import averagers


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


def lsq_grad(w_DxK, x_BxD, y_BxK):
  """peer_check.py's lsq_grad: ½ mean_b ||x_b W − y_b||²'s gradient, in float64, to float32."""
  w = w_DxK.astype(np.float64)
  return (x_BxD.T @ (x_BxD @ w - y_BxK) / len(x_BxD)).astype(np.float32)


def local_sgd(rank, world, inputs):
  """torch.optim.SGD then PeriodicModelAverager, per setting of inputs['settings'].

  Each step this worker's gradient of the linear model on its own batch
  goes through post_localSGD_hook as DDP would hand it over: in a setting
  whose warm-up all-reduces gradients (start_localSGD_iter = the averager's
  warmup_steps) the hook averages it over the workers for the steps before
  that, otherwise (start_localSGD_iter=0) it returns it as it is. After the
  warm-up it returns it as it is too: post_local_gradient_allreduce=False,
  since with the default (True) and subgroup=None it all-reduces within the
  node's subgroup, here every worker, and no step would be local. Then the
  optimizer steps and the averager is called. Returns per setting i this
  worker's model after every step, models_i [T, D, K], and what each step
  did, events_i [T]: 0 local, 1 gradients all-reduced (the hook's iteration
  count moved), 2 models averaged (the averager replaced the parameter's
  data with its all-reduced buffer).
  """
  x, y, out = inputs['x'], inputs['y'], {}
  for i, (period, _, warmup, ddp) in enumerate(inputs['settings']):
    w = torch.nn.Parameter(torch.from_numpy(inputs['w0'].copy()))
    optimizer = torch.optim.SGD([w], lr=float(inputs['lr']))
    with warnings.catch_warnings():  # period 1: 'only DistributedDataParallel should be used'
      warnings.simplefilter('ignore')
      averager = averagers.PeriodicModelAverager(int(period), warmup_steps=int(warmup))
    start = int(warmup) if ddp else 0
    hook = post_localSGD_hook.PostLocalSGDState(
      None, None, start, post_local_gradient_allreduce=False
    )
    models, events = [], []
    for x_WxBxD, y_WxBxK in zip(x, y, strict=True):
      bucket = Bucket(torch.from_numpy(lsq_grad(w.detach().numpy(), x_WxBxD[rank], y_WxBxK[rank])))
      iteration = hook.iter
      w.grad = post_localSGD_hook.post_localSGD_hook(hook, bucket).wait().view(w.shape)
      optimizer.step()
      data = w.data_ptr()
      averager.average_parameters([w])
      events.append(2 if w.data_ptr() != data else int(hook.iter > iteration))
      models.append(w.detach().numpy().copy())
    out[f'models_{i}'], out[f'events_{i}'] = np.stack(models), np.asarray(events)
  return out


SECTIONS = {'fp16': fp16, 'powersgd': powersgd, 'local_sgd': local_sgd}


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
