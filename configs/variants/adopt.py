"""ADOPT against each of its candidate ratios held fixed, on ADOPT's varying network
(`make results`: experiments/results/adopt.md)."""

from jaxdist.train.config import ADOPT_RATIOS, compressed

SETTINGS = {'network.profiles': 'adopt_c1@25,1gbps'}
VARIANTS = {
  **{f'fixed{round(1 / r)}x': compressed('topk', 'auto', ratio=r) for r in ADOPT_RATIOS},
  'adopt': {**compressed('topk', 'auto', ratio=0.1), 'adaptive': 'adopt'},
  'adopt_lazy': {
    **compressed('topk', 'auto', ratio=0.1),
    'adaptive': 'adopt',
    'adopt': {'gain_threshold': 0.5},
  },
}
