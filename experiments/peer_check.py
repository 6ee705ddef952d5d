r"""jaxdist beside PyTorch's DDP communication hooks, on identical inputs.

  python experiments/peer_check.py --torch_python=/work/torchenv/bin/python

Each section saves its inputs to an .npz in a temporary folder, runs jaxdist
on them here (--workers CPU devices) and PyTorch's hooks on them in --workers
gloo processes on 127.0.0.1 (experiments/peer_check_torch.py, run by
--torch_python, so PyTorch never enters this environment), and prints one
comparison:

- fp16: `compressed_allreduce(cast('float16'), collective='allreduce')` and
  `fp16_compress_hook`: how many elements of the mean are inf, and its
  relative error against the float64 mean. Cases: every worker at 16,384 or
  20,000; a 4,096-element gradient whose first 1,024 elements are in a large
  regime (±10,000 to 30,000, the sign shared by the workers, every input
  finite in float16) and the rest N(0, 0.01²); and a small one, N(0, 1e-7²).
- powersgd: `jd.sync.powersgd` and `powerSGD_hook` at each --ranks, with
  warm start and error feedback, on the gradients of the digits CNN's first
  dense kernel (1,024 x 128) after 150 steps of dense SGD (`cnn_gradients`),
  --steps steps of which the first 2 are dense (the hook needs them): the
  largest relative error over the compressed steps of the mean and of the
  workers' error memories against a float64 run of the algorithm from the
  same first Q; and, from that run, the largest condition number of
  mean_n M_n Q with the warm-started Q as it is and orthogonalised.

Without --torch_python only jaxdist's half runs. A section is an entry of
SECTIONS here (inputs, jaxdist's half, the comparison) and one of
peer_check_torch.py's SECTIONS under the same name (e.g. a later local_sgd
for PyTorch's PeriodicModelAverager).
"""

import os
import subprocess
import tempfile

import numpy as np
from absl import app, flags

flags.DEFINE_string('torch_python', None, 'A Python with torch; without it, jaxdist only.')
flags.DEFINE_list('sections', ['fp16', 'powersgd'], 'Which comparisons to run.')
flags.DEFINE_integer('workers', 4, 'Workers on each side.')
flags.DEFINE_list('ranks', ['1', '2', '4', '8'], 'PowerSGD ranks.')
flags.DEFINE_integer('steps', 12, 'PowerSGD steps (the first 2 dense).')
flags.DEFINE_integer('seed', 0, 'Seed of the inputs.')
FLAGS = flags.FLAGS
TORCH_SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'peer_check_torch.py')
START = 2  # dense steps before PowerSGD: the hook's start_powerSGD_iter must be > 1


def rel(a, b):
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def fp16_inputs(workers, rng):
  big = rng.uniform(10_000, 30_000, (workers, 1024)) * rng.choice([-1, 1], 1024)
  return {
    f'{workers} x 16,384': np.full((workers, 1024), 16384.0, np.float32),
    f'{workers} x 20,000': np.full((workers, 1024), 20000.0, np.float32),
    'large regime': np.concatenate([big, rng.normal(0, 1e-2, (workers, 3072))], 1).astype('f4'),
    'small, N(0, 1e-7²)': rng.normal(0, 1e-7, (workers, 4096)).astype(np.float32),
  }


def fp16_jaxdist(inputs):
  import jax.numpy as jnp

  import jaxdist as jd
  from jaxdist import runtime, testing

  out = {}
  for name, grads in inputs.items():
    tx = jd.sync.compressed_allreduce(
      jd.compress.cast('float16'), axis_name=runtime.AXES, collective='allreduce',
      error_feedback=False,
    )  # fmt: skip
    run = testing.Run(tx, {'g': jnp.zeros(grads.shape[1:])}, workers=len(grads), devices=len(grads))
    run({'g': jnp.asarray(grads)})
    out[name] = np.asarray(run.updates['g'][0])
  return out


def fp16_report(inputs, sides):
  lines = ['case                 | side    | inf in the mean | rel. error vs float64']
  for name, grads in inputs.items():
    exact = grads.astype(np.float64).mean(0)
    for side, means in sides.items():
      mean = means[name].astype(np.float64)
      inf = f'{np.isinf(mean).sum():,} of {mean.size:,}'
      lines.append(f'{name:20} | {side:7} | {inf:15} | {rel(mean, exact):.2e}')
  return lines


def cnn_gradients(workers, steps, rng, warmup=150):
  """[steps, workers, 1024, 128]: gradients of the digits CNN's first dense kernel.

  jaxdist's digits CNN on scikit-learn's digits, 32 images a worker a step,
  trained by dense SGD (lr 0.05) for `warmup` steps first: a trained
  network's gradients have the fast-decaying spectra PowerSGD is for.
  """
  import jax
  import optax
  from sklearn.datasets import load_digits

  from jaxdist.models.simple import CNN

  digits = load_digits()
  images, labels = (digits.images[..., None] / 16).astype(np.float32), digits.target
  model = CNN(num_classes=10)
  params = model.init(jax.random.key(FLAGS.seed), images[:1])

  def loss(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()

  @jax.jit
  def step(params, x_WxB, y_WxB):
    grads = jax.vmap(jax.grad(loss), (None, 0, 0))(params, x_WxB, y_WxB)
    mean = jax.tree.map(lambda g: g.mean(0), grads)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, mean), grads['params']['Dense_0']

  out = []
  for t in range(warmup + steps):
    batch = rng.integers(0, len(labels), (workers, 32))
    params, kernel_grads = step(params, images[batch], labels[batch])
    if t >= warmup:
      out.append(np.asarray(kernel_grads['kernel']))
  return np.stack(out)


def powersgd_inputs(workers, rng):
  grads = cnn_gradients(workers, FLAGS.steps, rng)
  ranks = [int(r) for r in FLAGS.ranks]
  q0 = {f'q0_r{r}': rng.normal(size=(grads.shape[3], r)).astype(np.float32) for r in ranks}
  return {'grads': grads, 'ranks': np.asarray(ranks), 'start': np.asarray(START), **q0}


def powersgd_jaxdist(inputs):
  import jax.numpy as jnp

  import jaxdist as jd
  from jaxdist import runtime, testing

  grads = inputs['grads']
  workers, out = grads.shape[1], {}
  for r in inputs['ranks']:
    tx = jd.sync.powersgd(int(r), axis_name=runtime.AXES, start_step=START)
    run = testing.Run(tx, {'w': jnp.zeros(grads.shape[2:])}, workers=workers, devices=workers)
    q0 = jnp.broadcast_to(inputs[f'q0_r{r}'], (workers, *inputs[f'q0_r{r}'].shape))
    run.state = run.state._replace(qs=(q0,))
    means, memories = [], []
    for g in grads:
      run({'w': jnp.asarray(g)})
      means.append(np.asarray(run.updates['w'][0]))
      memories.append(np.asarray(run.state.residual[0]))
    out[f'mean_r{r}'], out[f'memory_r{r}'] = np.stack(means), np.stack(memories)  # [T, (W,) R, C]
  return out


def float64_powersgd(grads_TxWxRxC, q0):
  """The algorithm in float64 from Q = q0 and zero memory: per step (mean, memories, κ, κ_orth)."""
  basis = lambda a: np.linalg.qr(a)[0]
  memory, q, out = np.zeros_like(grads_TxWxRxC[0]), q0, []
  for g in grads_TxWxRxC:
    m = g + memory
    p, p_orth = np.mean(m @ q, axis=0), np.mean(m @ basis(q), axis=0)
    p_hat = basis(p_orth)
    q = np.mean(np.swapaxes(m, 1, 2) @ p_hat, axis=0)
    memory = m - p_hat @ q.T
    out.append((p_hat @ q.T, memory, np.linalg.cond(p), np.linalg.cond(p_orth)))
  return out


def powersgd_report(inputs, sides):
  grads = inputs['grads'][START:].astype(np.float64)
  lines = [
    'rank | side    | mean: rel. err. vs float64 | memory: rel. err. | κ(M Q): Q as is, orth.'
  ]
  for r in inputs['ranks']:
    ref = float64_powersgd(grads, inputs[f'q0_r{r}'].astype(np.float64))
    kappa = f'{max(k for *_, k, _ in ref):,.0f}, {max(k for *_, k in ref):,.0f}'
    for side, out in sides.items():
      means, memories = out[f'mean_r{r}'][START:], out[f'memory_r{r}'][START:]
      err_mean = max(rel(a, mean) for a, (mean, *_) in zip(means, ref, strict=True))
      err_memory = max(rel(a, memory) for a, (_, memory, *_) in zip(memories, ref, strict=True))
      lines.append(f'{r:4} | {side:7} | {err_mean:26.2e} | {err_memory:17.2e} | {kappa}')
  return lines


SECTIONS = {
  'fp16': (fp16_inputs, fp16_jaxdist, fp16_report),
  'powersgd': (powersgd_inputs, powersgd_jaxdist, powersgd_report),
}


def torch_side(section, inputs_path, workers, folder):
  """PyTorch's half of `section`: worker 0's arrays, with the workers' `memory_*` stacked."""
  cmd = [FLAGS.torch_python, TORCH_SIDE, section, str(workers), inputs_path, folder]
  subprocess.run(cmd, check=True, timeout=900, env={**os.environ, 'PYTHONPATH': ''})
  ranks = [dict(np.load(os.path.join(folder, f'{w}.npz'))) for w in range(workers)]
  out = ranks[0]
  for key in out:
    if key.startswith('memory_'):
      out[key] = np.stack([r[key] for r in ranks], axis=1)  # [T, W, R, C]
  return out


def main(argv):
  del argv
  from jaxdist import runtime

  runtime.cpu_devices(FLAGS.workers)
  rng = np.random.default_rng(FLAGS.seed)
  for section in FLAGS.sections:
    if section not in SECTIONS:
      raise SystemExit(f'error: --sections: {section!r} is not one of {sorted(SECTIONS)}')
    make_inputs, run_jaxdist, report = SECTIONS[section]
    inputs = make_inputs(FLAGS.workers, rng)
    sides = {'jaxdist': run_jaxdist(inputs)}
    if FLAGS.torch_python:
      with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'inputs.npz')
        np.savez(path, **inputs)
        sides['PyTorch'] = torch_side(section, path, FLAGS.workers, folder)
    print(f'\n== {section} ({FLAGS.workers} workers)')
    print('\n'.join(report(inputs, sides)), flush=True)


if __name__ == '__main__':
  app.run(main)
