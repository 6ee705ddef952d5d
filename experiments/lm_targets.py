r"""Which of the language-model targets hold, read from the runs of `make results-lm`.

The targets (the papers' qualitative claims at this scale), each checked on the
summaries the runs wrote (`<workdir>/<variant>/summary.json`) and on the step
table of `bench_step.py --lm`:

- DiLoCo H = 50 within 5 % of BSP's validation loss at >= 40x fewer bytes;
- DiLoCo H = 50 from BSP's checkpoint at the first 20 % of the steps (a warm
  start) within 2 % of BSP's loss; its bytes count BSP's steps before it;
- DiLoCo with one replica (M = 1) at or below BSP's loss;
- Streaming DiLoCo's peak bytes of a step <= 1/P of DiLoCo's, at a loss within
  1 % of DiLoCo's;
- SparseLoCo within 1 % of DiLoCo's loss at >= 10x fewer bytes than DiLoCo;
- DeMo within 5 % of AdamW's (BSP's) loss;
- 1-bit Adam within 2 % of AdamW's loss;
- the DiLoCo family's step <= 1.1x AdamW's on the CPU.

A target whose runs are missing says so. Bytes are the mean sent per worker and
step; the peak is the largest step's.

  python experiments/lm_targets.py --workdir=workdir/results_lm \
      --steps=experiments/results/step_lm.md --results=experiments/results/lm_targets.md
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

flags.DEFINE_string('workdir', 'workdir/results_lm', 'Where make results-lm trained the variants.')
flags.DEFINE_string('steps', 'experiments/results/step_lm.md', "bench_step.py --lm's table.")
flags.DEFINE_string('variants', 'configs/variants/lm.py', 'The variants file (for P and H).')
flags.DEFINE_string('results', None, 'Also write the markdown table here.')
FLAGS = flags.FLAGS

BSP, DILOCO, WARM, ONE, STREAMING, SPARSELOCO, DEMO, ONEBIT = (
  'bsp', 'diloco50', 'diloco50_warm', 'diloco50_m1', 'streaming48_fp8', 'sparseloco50', 'demo',
  'onebit_adam',
)  # fmt: skip
STREAMING_METHOD = 'streaming_diloco'
FAMILY = ('diloco10', 'diloco50', 'streaming48_fp8', 'sparseloco50', 'sparseloco10', 'demo')
NAMES = (BSP, DILOCO, WARM, ONE, STREAMING, SPARSELOCO, DEMO, ONEBIT)


def _summary(name: str) -> dict | None:
  path = os.path.join(FLAGS.workdir, name, 'summary.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _gap(a: dict, b: dict) -> float:
  """a's validation loss above b's, in % of b's."""
  return 100 * (a['test_loss'] - b['test_loss']) / b['test_loss']


def _fewer(a: dict, b: dict, key: str = 'sent_bytes_per_step') -> float:
  """How many times fewer bytes a sends than b."""
  return b[key] / a[key] if a[key] else float('inf')


def _step_ratios(path: str) -> dict[str, float]:
  """variant -> step ÷ the first variant's, from bench_step's markdown table."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    rows = [line for line in f if line.startswith('|')]
  if len(rows) < 3:
    return {}
  head = [c.strip() for c in rows[0].strip('|\n').split('|')]
  out = {}
  for line in rows[2:]:
    cells = dict(zip(head, (c.strip() for c in line.strip('|\n').split('|')), strict=False))
    out[cells['variant']] = float(cells['÷ first'])
  return out


def _fragments() -> int:
  """P of the streaming variant, from the variants file."""
  from jaxdist.train import compare

  return compare.load_group(FLAGS.variants).variants[STREAMING]['sync'][STREAMING_METHOD][
    'fragments'
  ]


def rows() -> list[dict[str, str]]:
  s = {n: _summary(n) for n in NAMES}
  out = []

  def add(target, names, measure):
    if any(s.get(n) is None for n in names):
      out.append({'target': target, 'measured': f'not run ({", ".join(names)})', 'holds': '-'})
      return
    text, ok = measure()
    out.append({'target': target, 'measured': text, 'holds': 'yes' if ok else 'no'})

  def diloco():
    gap, fewer = _gap(s[DILOCO], s[BSP]), _fewer(s[DILOCO], s[BSP])
    return f'loss {gap:+.2f} %, {fewer:.0f}x fewer bytes', gap <= 5 and fewer >= 40

  def warm():
    gap, w = _gap(s[WARM], s[BSP]), s[WARM]
    source = w.get('source_sent_bytes_per_worker') or 0.0
    whole = (source + w['sent_bytes_per_worker']) / w['steps']  # BSP's steps before it too
    fewer = s[BSP]['sent_bytes_per_step'] / whole
    text = (f"loss {gap:+.2f} % (from BSP's step {w.get('init_step')} of {w['steps']}), "
            f"{fewer:.1f}x fewer bytes counting BSP's steps before it")  # fmt: skip
    return text, gap <= 2

  def one():
    gap = _gap(s[ONE], s[BSP])
    return f"loss {gap:+.2f} % of BSP's ({s[ONE]['workers']} replica)", gap <= 0

  def near_adamw(name, within):
    """The measure of a whole optimizer's loss within `within` % of AdamW's (BSP's)."""

    def measure():
      gap = _gap(s[name], s[BSP])
      return f"loss {gap:+.2f} % of AdamW's", gap <= within

    return measure

  def streaming():
    p = _fragments()
    if not s[DILOCO]['peak_sent_bytes_per_step']:
      return "DiLoCo sent nothing: no outer step in the run's steps", False
    peak = s[STREAMING]['peak_sent_bytes_per_step'] / s[DILOCO]['peak_sent_bytes_per_step']
    gap = _gap(s[STREAMING], s[DILOCO])
    text = f"peak {peak:.3f} of DiLoCo's (1/P = {1 / p:.3f}), loss {gap:+.2f} % of DiLoCo's"
    return text, peak <= 1 / p and gap <= 1

  def sparseloco():
    gap, fewer = _gap(s[SPARSELOCO], s[DILOCO]), _fewer(s[SPARSELOCO], s[DILOCO])
    return f"loss {gap:+.2f} % of DiLoCo's, {fewer:.1f}x fewer bytes", gap <= 1 and fewer >= 10

  add('DiLoCo H=50: loss within 5 % of BSP, >= 40x fewer bytes', [DILOCO, BSP], diloco)
  add("DiLoCo H=50 from BSP's first 20 % of the steps: loss within 2 % of BSP", [WARM, BSP],
      warm)  # fmt: skip
  add("DiLoCo with one replica (M=1): loss at or below BSP's", [ONE, BSP], one)
  add('Streaming DiLoCo: peak <= 1/P of DiLoCo\'s, loss within 1 % of it', [STREAMING, DILOCO],
      streaming)  # fmt: skip
  add('SparseLoCo H=50: loss within 1 % of DiLoCo\'s, >= 10x fewer bytes', [SPARSELOCO, DILOCO],
      sparseloco)  # fmt: skip
  add("DeMo: loss within 5 % of AdamW's", [DEMO, BSP], near_adamw(DEMO, 5))
  add("1-bit Adam: loss within 2 % of AdamW's", [ONEBIT, BSP], near_adamw(ONEBIT, 2))
  ratios = _step_ratios(FLAGS.steps)
  family = {n: r for n, r in ratios.items() if n in FAMILY}
  if family:
    worst = max(family, key=family.get)
    out.append({
      'target': 'DiLoCo family: step <= 1.1x AdamW\'s (CPU)',
      'measured': ', '.join(f'{n} {r:.3f}x' for n, r in family.items()) + f' (worst {worst})',
      'holds': 'yes' if family[worst] <= 1.1 else 'no',
    })  # fmt: skip
  else:
    out.append({'target': 'DiLoCo family: step <= 1.1x AdamW\'s (CPU)',
                'measured': f'not run ({FLAGS.steps})', 'holds': '-'})  # fmt: skip
  return out


def main(argv):
  del argv
  from jaxdist.train import report

  table = rows()
  columns = [('target', 'target'), ('measured', 'measured'), ('holds', 'holds')]
  print(report.table(table, columns))
  if FLAGS.results:
    command = ' '.join(['python', 'experiments/lm_targets.py', *sys.argv[1:]])
    with open(FLAGS.results, 'w') as f:
      f.write(report.provenance(command) + '\n\n' + report.markdown(table, columns) + '\n')
    print(f'results: {FLAGS.results}')


if __name__ == '__main__':
  app.run(main)
