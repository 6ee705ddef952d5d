r"""Writes the GPU tables of the docs from the logs that experiments/results/gpu/gpu_run.sh left.

gpu_run.sh ran once on a one-GPU machine: bench_step (ResNet-20 at 8 and 256 simulated
workers, and the default CNN), bench_compress at 1M, 10M and 100M floats, and `make run`'s
compare.py on digits; each left a log in experiments/results/gpu/, env.log holds the date,
nvidia-smi, the package versions and a copy-bandwidth reference. This script only reads those
logs, so it runs anywhere (no GPU, no jax):

  python experiments/gpu_report.py          # writes experiments/results/gpu.md
  python experiments/gpu_report.py --check  # exit 1 if gpu.md differs from what the logs give
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGS = os.path.join(ROOT, 'experiments', 'results', 'gpu')
OUT = os.path.join(ROOT, 'experiments', 'results', 'gpu.md')
DASHES = re.compile(r'^-+(?:  -+)*$')
NOMINAL_GBPS = (
  3350  # H100 SXM (HBM3) memory bandwidth on NVIDIA's data sheet: a spec, not a reading
)


def _read(logs: str, name: str) -> str:
  with open(os.path.join(logs, name)) as f:
    return f.read()


def _num(cell: str) -> float:
  """'70,904' -> 70904.0; '4.11x' -> 4.11; '21%' -> 21.0."""
  return float(cell.replace(',', '').rstrip('x%'))


def text_tables(text: str) -> list[tuple[int, list[dict[str, str]]]]:
  """Every table jaxdist.train.report.table printed in `text`: (line number, rows as dicts).

  A table is a heading line, a line of dash runs (one per column, two spaces apart) and
  rows up to the first blank line; the dash runs give each column's character span.
  """
  lines = [line.rsplit('\r', 1)[-1] for line in text.split('\n')]  # drop progress bars
  found = []
  for i, line in enumerate(lines):
    if i == 0 or not DASHES.match(line):
      continue
    spans = [m.span() for m in re.finditer(r'-+', line)]
    cut = lambda row, spans=spans: [row[a:b].strip() for a, b in spans]
    heading = cut(lines[i - 1])
    rows = []
    for row in lines[i + 1 :]:
      if not row.strip() or len(row) != len(line):
        break
      rows.append(dict(zip(heading, cut(row), strict=True)))
    found.append((i, rows))
  return found


def _command(text: str) -> str:
  """The log's `command:` line, as the docs write commands (`python experiments/...`)."""
  command = re.search(r'^command: (.*)$', text, re.M)[1]
  return re.sub(r'^\S*python3?\s', 'python ', command)


def _exit(text: str) -> tuple[int, int]:
  m = re.search(r'^exit (\d+) after (\d+) s', text, re.M)
  return int(m[1]), int(m[2])


def environment(env: str) -> dict:
  """Date, commit, device, versions, copy bandwidth and each step's exit from env.log."""
  info = {
    'date': re.search(r'^date: (.*)$', env, re.M)[1],
    'commit': re.search(r'^commit: (\S+)', env, re.M)[1],
    'python': re.search(r'^python (\S+) (\S+)', env, re.M).groups(),
    'versions': dict(re.findall(r'^version (\S+) (\S+)$', env, re.M)),
    'total_s': int(re.search(r'^total (\d+) s', env, re.M)[1]),
  }
  platform, kind, count = re.search(r'^device (\S+) (.+) x(\d+)$', env, re.M).groups()
  info.update(platform=platform, device=kind, device_count=int(count))
  cuda = re.search(r'CUDA Version: (\S+)', env)
  info['cuda'] = cuda[1] if cuda else '-'
  csv = re.search(r'^name, memory\.total.*\n(.+)$', env, re.M)
  if csv:
    _, memory, driver, sm, mem_clock = (c.strip() for c in csv[1].split(','))
    info.update(memory=memory, driver=driver, sm_clock=sm, mem_clock=mem_clock)
  info['copy'] = [
    {
      'n': int(m[1]),
      'single_ms': float(m[2]),
      'single_gbps': float(m[3]),
      'chained_ms': float(m[4]),
      'chained_gbps': float(m[5]),
    }
    for m in re.finditer(
      r'^copy n=(\d+) single_ms=(\S+) single_GBps=(\S+) '
      r'back_to_back_ms=(\S+) back_to_back_GBps=(\S+)$',
      env,
      re.M,
    )
  ]
  info['steps'] = {
    m[1]: (int(m[2]), int(m[3]))
    for m in re.finditer(r'^(\w+): exit (\d+) after (\d+) s$', env, re.M)
  }
  return info


def machine(info: dict, cores: str) -> str:
  return f'{info["python"][1]} {cores} cores, {info["device"]}'


def _flag(command: str, name: str, default: str) -> str:
  m = re.search(rf'--{name}=(\S+)', command)
  return m[1] if m else default


def step_section(logs: str, name: str, info: dict, cores: str) -> list[str]:
  text = _read(logs, name)
  command = _command(text)
  model = re.search(r'^(\w+), input (\(.*?\)), global batch (\d+), (\d+) (\w+) device', text, re.M)
  batch = int(model[3])
  tables = [rows for _, rows in text_tables(text)]
  rc, seconds = _exit(text)
  windows = f'{_flag(command, "repeats", "5")} windows of {_flag(command, "steps", "20")} steps'
  out = [
    f'{model[1]}, input {model[2]}, global batch {batch}, {model[4]} {model[5]} device '
    f'({seconds} s, exit status {rc}; median of {windows}):',
    '',
    '| layout | workers | devices × sim | per_worker | samples/s | ms/step | vs single device '
    '| compile s | memory/device |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for i, rows in enumerate(tables):
    if i == 1:
      out += ['', 'Scaling with the number of workers:', '', *out[2:4]]
    for r in rows:
      sps = _num(r['samples/s'])
      out.append(
        f'| {r.get("layout", "simulated, allreduce")} | {r["workers"]} | {r["devices"]} × '
        f'{r["sim/device"]} | {r.get("per_worker", "-")} | {r["samples/s"]} | '
        f'{1e3 * batch / sps:.2f} | {r["vs single device"]} | {r.get("compile s", "-")} | '
        f'{r.get("memory/device", "-")} |'
      )
  out += ['', _provenance(command, info, cores), '']
  return out


def _provenance(command: str, info: dict, cores: str) -> str:
  return f'Command: `{command}`; machine: {machine(info, cores)}; date: {info["date"][:10]}.'


def compress_section(logs: str, info: dict, cores: str) -> list[str]:
  text = _read(logs, 'bench_compress.log')
  (_, rows), *_ = text_tables(text)
  sizes = list(dict.fromkeys(int(r['n'].replace(',', '')) for r in rows))
  largest = sizes[-1]
  copy_rows = {
    int(r['n'].replace(',', '')): r for r in rows if r['compressor'].startswith('memory')
  }
  chained = {c['n']: c for c in info['copy']}
  hbm = chained[largest]['chained_gbps'] if largest in chained else None

  out = [
    'The memory pass is a jitted `jnp.copy` (one read and one write, 8 bytes per float). '
    'bench_compress times every call on its own (dispatch, run, `block_until_ready`), so at '
    'small sizes its copy measures launch latency, not bandwidth; env.log also times 100 '
    'copies back to back:',
    '',
    '| floats | copy ms (bench) | GB/s (bench) | copy ms (back to back) | GB/s (back to back) |',
    '|---|---|---|---|---|',
  ]
  for n in sizes:
    ms = _num(copy_rows[n]['ms (median)'])
    c = chained.get(n)
    tail = f'{c["chained_ms"]:.4f} | {c["chained_gbps"]:,.0f}' if c else '- | -'
    out.append(f'| {n:,} | {ms:.3f} | {8 * n / ms / 1e6:,.0f} | {tail} |')
  out.append('')
  if hbm:
    nominal = (
      f", {hbm / NOMINAL_GBPS:.0%} of the H100 SXM's nominal {NOMINAL_GBPS / 1e3:.2f} TB/s "
      '(HBM3, data sheet)'
      if 'H100' in info['device'] and 'HBM3' in info['device']
      else ''
    )
    out += [
      f'Back to back at {largest:,} floats the copy moves {hbm:,.0f} GB/s{nominal}. The last '
      f'column below divides each time by that pass: {8 * largest / hbm / 1e6:.3f} ms for '
      f'{largest:,} floats.',
      '',
    ]

  names = list(dict.fromkeys(re.sub(r' \[.*\]$', '', r['compressor']) for r in rows))
  by = {(re.sub(r' \[.*\]$', '', r['compressor']), int(r['n'].replace(',', ''))): r for r in rows}
  head = ['compressor', 'of dense']
  for n in sizes:
    head += [f'{_short(n)}: ms', f'{_short(n)}: × copy']
  if hbm:
    head.append(f'{_short(largest)}: × HBM pass')
  out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name in names:
    cells = [name, by[(name, largest)]['of dense']]
    for n in sizes:
      r = by[(name, n)]
      cells += [r['ms (median)'], r['vs memory pass']]
    if hbm:
      ms = _num(by[(name, largest)]['ms (median)'])
      cells.append(f'{ms / (8 * largest / hbm / 1e6):.2f}x')
    out.append('| ' + ' | '.join(cells) + ' |')
  target = re.search(r'^target: (.*)$', text, re.M)[1]
  out += ['', f"The benchmark's own verdict (against its per-call copy): {target}."]
  if hbm:
    best = {
      name: _num(by[(name, largest)]['ms (median)']) / (8 * largest / hbm / 1e6)
      for name in ('dgc', 'mstopk')
      if (name, largest) in by
    }
    name = min(best, key=best.get)
    out += [
      f'Against the back-to-back pass at {hbm:,.0f} GB/s the best approximate top-k, {name}, '
      f'takes {best[name]:.2f}x at {largest:,} floats: '
      f'{"within" if best[name] <= 3 else "over"} 3x.'
    ]
  out += ['', _provenance(_command(text), info, cores), '']
  return out


def _short(n: int) -> str:
  return f'{n // 1_000_000}M' if n % 1_000_000 == 0 else f'{n:,}'


def make_run_section(logs: str, info: dict) -> list[str]:
  text = _read(logs, 'make_run.log')
  tables = text_tables(text)
  lines = text.split('\n')
  measured = {}
  for i, rows in tables:
    variant = next(
      (m[1] for line in reversed(lines[:i]) if (m := re.match(r'^=== (\S+)$', line))), None
    )
    if variant and len(rows) == 1 and 'samples/s' in rows[0]:
      measured[variant] = rows[0]
  finals = []  # compare's tables close the log: one, or a per-run and a per-step one
  for _, rows in reversed(tables):
    if not (rows and 'variant' in rows[0]):
      break
    finals.insert(0, rows)
  final = [{k: v for rows in finals for k, v in rows[i].items()} for i in range(len(finals[0]))]
  rc, seconds = _exit(text)
  target = next(k for k in final[0] if k.endswith('@1gbps')).split()[2]
  steps = measured[final[0]['variant']]['steps']
  layout = re.search(
    r'(\d+ workers = \d+ devices \(\w+\) x \d+ simulated); (global batch \d+)', text
  )
  out = [
    f'{layout[1]}, {layout[2]}, {steps} steps per variant; the whole run took '
    f"{seconds} s (exit status {rc}). Samples/s is each variant's measured training rate; "
    f"the time columns are modelled (steps × one worker's measured step + α-β "
    f"communication) to the first variant's final accuracy, {target}.",
    '',
    '| variant | test acc | samples/s | payload B/worker/step | worker step s | '
    f'time to {target} @1gbps | time to {target} @10gbps |',
    '|---|---|---|---|---|---|---|',
  ]
  for r in final:
    sps = measured.get(r['variant'], {}).get('samples/s', '-')
    out.append(
      f'| {r["variant"]} | {r["test acc"]} | {sps} | {r["payload B/worker/step"]} | '
      f'{r["worker step s"]} | {r[f"time to {target} @1gbps"]} | '
      f'{r[f"time to {target} @10gbps"]} |'
    )
  table_md = _read(logs, 'make_run_table.md')
  out += ['', re.search(r'^Command: .*$', table_md, re.M)[0], '']
  return out


def render(logs: str = LOGS) -> str:
  info = environment(_read(logs, 'env.log'))
  cores = re.search(r'machine: \S+ (\d+) cores', _read(logs, 'make_run_table.md'))[1]
  v = info['versions']
  failed = {name: rc for name, (rc, _) in info['steps'].items() if rc}
  out = [
    '<!-- generated by experiments/gpu_report.py from experiments/results/gpu/; do not edit -->',
    '',
    f'On one {info["device"]} ({info.get("memory", "-")}, driver {info.get("driver", "-")}, '
    f'CUDA {info["cuda"]}), {cores} CPU cores; jax {v.get("jax")} with '
    f'jax-cuda13-plugin {v.get("jax-cuda13-plugin")}, flax {v.get("flax")}, '
    f'optax {v.get("optax")}, orbax-checkpoint {v.get("orbax-checkpoint")}, '
    f'Python {info["python"][0]}; jaxdist at commit {info["commit"][:7]} from the source tree '
    f'(`PYTHONPATH=.`, not installed: pyproject pins jax 0.10); {info["date"]}. Every step '
    f'below ran in one call of `experiments/results/gpu/gpu_run.sh` ({info["total_s"]} s); '
    'its raw logs are beside it. '
    + (
      'Every step exited 0.'
      if not failed
      else 'Failed: ' + ', '.join(f'{k} (exit {rc})' for k, rc in failed.items()) + '.'
    ),
    '',
    '#### Training step (`bench_step.py`)',
    '',
    'With one GPU there is no sharded row: the 8-worker layout that uses 8 devices on the '
    'CPU runs here as 8 workers simulated with `vmap` on the one device, and every worker '
    "row is simulated. `make_train_step`'s `per_worker='auto'` picks `vmap` on a GPU (the "
    'trainer picks `mean` for a plain all-reduce, which this run did not measure); the '
    "`loop` rows (the CPU's choice) run the workers one after the other. Windows are timed "
    'after a warm-up; '
    "ms/step is the global batch over samples/s; memory is XLA's compiled memory analysis "
    '(arguments + outputs + temporaries).',
    '',
  ]
  for name in ('bench_step_resnet20.log', 'bench_step_cnn.log'):
    if os.path.exists(os.path.join(logs, name)):
      out += step_section(logs, name, info, cores)
  out += ['#### Compressors: encode + decode against a memory pass (`bench_compress.py`)', '']
  out += compress_section(logs, info, cores)
  out += ['#### `make run` (`compare.py`, digits)', '']
  out += make_run_section(logs, info)
  return '\n'.join(out).rstrip() + '\n'


def main(argv: list[str]) -> int:
  text = render()
  if '--check' in argv:
    with open(OUT) as f:
      if f.read() != text:
        print('error: experiments/results/gpu.md differs from the logs; run '
              'python experiments/gpu_report.py', file=sys.stderr)  # fmt: skip
        return 1
    return 0
  with open(OUT, 'w') as f:
    f.write(text)
  print(f'wrote {OUT}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
