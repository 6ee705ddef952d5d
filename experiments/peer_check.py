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
  finite in float16) and the rest N(0, 0.01²); a small one, N(0, 1e-7²); and
  a wide regime, the large regime's first 1,024 beside N(0, 1e-6²), which
  float16 holds only with a scale of its own. For the two regimes, also each
  segment's RMS error relative to the RMS of its float64 mean: the large
  segment and the tiny one beside it.
- powersgd: `jd.sync.powersgd` and `powerSGD_hook` at each --ranks, with
  warm start and error feedback, on the gradients of the digits CNN's first
  dense kernel (1,024 x 128) after 150 steps of dense SGD (`cnn_gradients`),
  --steps steps of which the first 2 are dense (the hook needs them): the
  largest relative error over the compressed steps of the mean and of the
  workers' error memories against a float64 run of the algorithm from the
  same first Q; and, from that run, the largest condition number of
  mean_n M_n Q with the warm-started Q as it is and orthogonalised.
- local_sgd: `optax.chain(optax.sgd(lr), jd.sync.local_sgd(period,
  warmup_steps=...))` through `jd.testing.Run` and torch.optim.SGD with
  `PeriodicModelAverager` (and, in a post-local SGD setting, DDP's
  `post_localSGD_hook` for the gradients of its warm-up) on a linear
  least-squares model, --steps steps from one initial model, each worker with
  its own data every step (`LOCAL_SGD_SETTINGS`; the last gives jaxdist
  warmup_steps=w where w + 1 lines up, to show schedules that differ): the
  steps at which each side synchronised, the largest relative difference of
  a worker's model between the sides after each step, and whether each
  side's workers hold bitwise the same model. Both sides compute the gradients with one numpy
  expression (`lsq_grad`), so the models differ only by rounding: XLA rounds
  −lr·g and then adds it, torch.optim.SGD's `add_(g, alpha=−lr)` is one
  fused multiply-add, and the two all-reduces sum in their own orders. In a
  warm-up jaxdist averages the models after each worker's own step and DDP
  steps every worker on the mean gradient; the two agree because a warm-up
  step starts from one model on every worker (the initial one, or the one
  the previous warm-up step left), w − lr·mean_n g_n = mean_n (w − lr·g_n).

Without --torch_python only jaxdist's half runs. A section is an entry of
SECTIONS here (inputs, jaxdist's half, the comparison) and one of
peer_check_torch.py's SECTIONS under the same name.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

flags.DEFINE_string('torch_python', None, 'A Python with torch; without it, jaxdist only.')
flags.DEFINE_list('sections', ['fp16', 'powersgd', 'local_sgd'], 'Which comparisons to run.')
flags.DEFINE_integer('workers', 4, 'Workers on each side.')
flags.DEFINE_list('ranks', ['1', '2', '4', '8'], 'PowerSGD ranks.')
flags.DEFINE_integer('steps', 12, 'Steps of powersgd (the first 2 dense) and of local_sgd.')
flags.DEFINE_integer('seed', 0, 'Seed of the inputs.')
flags.DEFINE_string('results', None, 'Also write the comparisons to this markdown file.')
FLAGS = flags.FLAGS
TORCH_SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'peer_check_torch.py')
START = 2  # dense steps before PowerSGD: the hook's start_powerSGD_iter must be > 1


def rel(a, b):
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


LARGE = 1024  # the regimes' first elements, ±10,000 to 30,000; then 3,072 tiny ones
REGIMES = ('large regime', 'wide regime')


def fp16_inputs(workers, rng):
  big = rng.uniform(10_000, 30_000, (workers, LARGE)) * rng.choice([-1, 1], LARGE)
  tiny = rng.normal(0, 1e-2, (workers, 4096 - LARGE))
  return {
    f'{workers} x 16,384': np.full((workers, 1024), 16384.0, np.float32),
    f'{workers} x 20,000': np.full((workers, 1024), 20000.0, np.float32),
    'large regime': np.concatenate([big, tiny], 1).astype(np.float32),
    'small, N(0, 1e-7²)': rng.normal(0, 1e-7, (workers, 4096)).astype(np.float32),
    'wide regime': np.concatenate([big, tiny * 1e-4], 1).astype(np.float32),
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
  size = inputs[REGIMES[0]].shape[1] - LARGE
  lines += [
    '',
    'by segment: RMS error / RMS of the float64 mean (inf: elements)',
    f'case         | side    | large (first {LARGE:,}) | inf | tiny (last {size:,}) | inf',
  ]
  for name in REGIMES:
    exact = inputs[name].astype(np.float64).mean(0)
    for side, means in sides.items():
      mean = means[name].astype(np.float64)
      cells = []
      for part in (slice(None, LARGE), slice(LARGE, None)):
        cells += [f'{rel(mean[part], exact[part]):.2e}', f'{np.isinf(mean[part]).sum():,}']
      large, large_inf, tiny, tiny_inf = cells
      lines.append(
        f'{name:12} | {side:7} | {large:>19} | {large_inf:>3} | {tiny:>18} | {tiny_inf:>3}'
      )
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


# (period, jaxdist's warmup_steps, PyTorch's warmup_steps, whether PyTorch's
# warm-up all-reduces the gradients as DDP with post_localSGD_hook does).
# jaxdist's step t synchronises when t < warmup_steps or (t − warmup_steps + 1)
# % period == 0; PyTorch's averager when t >= w and (t − w) % period == 0.
LOCAL_SGD_SETTINGS = (
  (4, 0, 3, False),  # local steps; averages after 3, 7, 11
  (4, 1, 0, False),  # averages after 0, 4, 8
  (4, 3, 2, True),  # post-local SGD: all-reduced gradients at 0, 1; averages after 2, 6, 10
  (1, 0, 0, False),  # averages after every step
  (4, 2, 2, True),  # schedules that differ: jaxdist's warm-up one step short
)
EVENTS = ('local', 'grads', 'models')  # PyTorch's per-step record: 0, 1, 2


def lsq_grad(w_DxK, x_BxD, y_BxK):
  """Gradient of ½ mean_b ||x_b W − y_b||² at a float32 W, in float64, rounded to float32.

  peer_check_torch.py computes it with the same numpy expression, so that
  the two sides get bitwise the same gradients from bitwise the same models.
  """
  w = w_DxK.astype(np.float64)
  return (x_BxD.T @ (x_BxD @ w - y_BxK) / len(x_BxD)).astype(np.float32)


def local_sgd_inputs(workers, rng, steps=None, dim=32, outputs=8, batch=16):
  """A linear model, W [dim, outputs], and per step (--steps) and worker a batch of its own.

  Worker n's targets come from a teacher of its own, so that its local steps
  pull its model away from the others'.
  """
  steps = steps or FLAGS.steps
  teachers = rng.normal(size=(workers, dim, outputs))
  x = rng.normal(size=(steps, workers, batch, dim))
  noise = rng.normal(0, 0.1, (steps, workers, batch, outputs))
  return {
    'x': x,
    'y': np.einsum('twbd,wdk->twbk', x, teachers) + noise,
    'w0': rng.normal(0, 0.1, (dim, outputs)).astype(np.float32),
    'lr': np.asarray(0.05),
    'settings': np.asarray(LOCAL_SGD_SETTINGS),
  }


def local_sgd_jaxdist(inputs):
  """Per setting every worker's model after each step, and whether the step synchronised."""
  import jax.numpy as jnp
  import optax

  import jaxdist as jd
  from jaxdist import runtime, testing

  x, y = inputs['x'], inputs['y']
  workers, out = x.shape[1], {}
  for i, (period, warmup, *_) in enumerate(inputs['settings']):
    sync = jd.sync.local_sgd(int(period), warmup_steps=int(warmup), axis_name=runtime.AXES)
    tx = optax.chain(optax.sgd(float(inputs['lr'])), sync)
    run = testing.Run(tx, {'w': jnp.asarray(inputs['w0'])}, workers=workers, devices=workers)
    models, synced = [], []
    for x_WxBxD, y_WxBxK in zip(x, y, strict=True):
      params = np.asarray(run.params['w'])
      grads = [lsq_grad(*a) for a in zip(params, x_WxBxD, y_WxBxK, strict=True)]
      run({'w': jnp.asarray(np.stack(grads))})  # sgd, local_sgd, then sync.apply_updates
      models.append(np.asarray(run.params['w']))
      synced.append(bool(run.state[-1].just_synced[0]))
    out[f'models_{i}'], out[f'events_{i}'] = np.stack(models), 2 * np.asarray(synced)
  return out  # models_i: [T, W, D, K]; events_i: [T], 0 local or 2 models averaged


def one_model(models_WxDxK):
  return all(np.array_equal(models_WxDxK[0], m) for m in models_WxDxK[1:])


def schedule(events):
  """'grads 0, 1; models 2, 6, 10': at which steps which synchronisation ran."""
  parts = []
  for code, name in enumerate(EVENTS[1:], 1):
    steps = np.flatnonzero(events == code)
    if steps.size:
      parts.append(f'{name} {", ".join(map(str, steps))}')
  return '; '.join(parts) or 'never'


def local_sgd_report(inputs, sides):
  lines = []
  for i, (period, warmup, torch_warmup, ddp) in enumerate(inputs['settings']):
    grads = f'post_localSGD_hook(start_localSGD_iter={torch_warmup})' if ddp else 'local warm-up'
    lines += [
      f'\nperiod {period}: jaxdist local_sgd(warmup_steps={warmup}) | PyTorch '
      f'PeriodicModelAverager(warmup_steps={torch_warmup}), {grads}'
    ]
    runs = {side: (out[f'models_{i}'], out[f'events_{i}']) for side, out in sides.items()}
    lines += [f'{side:7} synchronised: {schedule(events)}' for side, (_, events) in runs.items()]
    if len(runs) == 2:
      same = np.array_equal(runs['jaxdist'][1] > 0, runs['PyTorch'][1] > 0)
      lines.append(f'steps that synchronised: {"the same" if same else "DIFFER"}')
    head = ' | '.join(f'{side:7}' for side in runs)
    lines.append(f'step | {head} | max rel. diff | one model bitwise: ' + ', '.join(runs))
    for t in range(len(inputs['x'])):
      events = ' | '.join(f'{EVENTS[e[t]]:7}' for _, e in runs.values())
      equal = ', '.join('yes' if one_model(m[t]) else 'no' for m, _ in runs.values())
      diff = '-'
      if len(runs) == 2:
        (a, _), (b, _) = runs.values()
        diff = f'{max(rel(a[t, n], b[t, n]) for n in range(len(b[t]))):.2e}'
      lines.append(f'{t:4} | {events} | {diff:>13} | {equal}')
  return lines


SECTIONS = {
  'fp16': (fp16_inputs, fp16_jaxdist, fp16_report),
  'powersgd': (powersgd_inputs, powersgd_jaxdist, powersgd_report),
  'local_sgd': (local_sgd_inputs, local_sgd_jaxdist, local_sgd_report),
}
PER_WORKER = ('memory_', 'models_')  # PyTorch's arrays that come back one a worker


def torch_side(section, inputs_path, workers, folder):
  """PyTorch's half of `section`: worker 0's arrays, with the workers' PER_WORKER ones stacked."""
  cmd = [FLAGS.torch_python, TORCH_SIDE, section, str(workers), inputs_path, folder]
  subprocess.run(cmd, check=True, timeout=900, env={**os.environ, 'PYTHONPATH': ''})
  ranks = [dict(np.load(os.path.join(folder, f'{w}.npz'))) for w in range(workers)]
  out = ranks[0]
  for key in out:
    if key.startswith(PER_WORKER):
      out[key] = np.stack([r[key] for r in ranks], axis=1)  # [T, W, ...]
  return out


def main(argv):
  del argv
  from jaxdist import runtime

  runtime.cpu_devices(FLAGS.workers)
  rng = np.random.default_rng(FLAGS.seed)
  out = []
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
    lines = [f'== {section} ({FLAGS.workers} workers)', *report(inputs, sides)]
    print('\n' + '\n'.join(lines), flush=True)
    out += [*lines, '']
  if FLAGS.results:
    write_results(FLAGS.results, out)


def write_results(path: str, lines: list[str]) -> None:
  """The comparisons as a results file: command, machine, date and torch's version, the text."""
  from jaxdist.train import report

  command = ' '.join(['python', 'experiments/peer_check.py', *sys.argv[1:]])
  head = report.provenance(command)
  if FLAGS.torch_python:
    ask = [FLAGS.torch_python, '-c', 'import torch; print(torch.__version__)']
    head += f' PyTorch {subprocess.run(ask, capture_output=True, text=True).stdout.strip()}.'
  with open(path, 'w') as f:
    f.write(head + '\n\n```\n' + '\n'.join(lines).rstrip() + '\n```\n')
  print(f'results: {path}')


if __name__ == '__main__':
  from jaxdist.train import cli

  app.run(main, flags_parser=cli.parse_flags)
