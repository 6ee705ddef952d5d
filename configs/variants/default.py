r"""The variants `make run` compares: dense against three ways to send less.

  python experiments/compare.py --config=configs/digits.py --workdir=/tmp/cmp \
      --variants=configs/variants/default.py

A variants file holds `VARIANTS` (name -> overrides of the config, set after
the command line's `--config.*`) and, optionally, `SETTINGS` (dotted keys the
whole group shares, set before them). `--only` names any variant of the files
in this folder; a name means the same overrides in every file.
"""

from jaxdist.train.config import compressed, method

VARIANTS = {
  'dense': method('allreduce'),
  'topk1_ef': compressed('topk', ratio=0.01, selection='bisect'),  # 'auto' = top_k at 151K
  'artopk1': compressed('topk', 'allreduce', ratio=0.01),
  'powersgd2': method('powersgd', rank=2),
}
