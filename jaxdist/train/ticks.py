"""Tick labels that never run into one another: plain-text log labels, thinned where crowded.

Matplotlib picks a number of ticks from the axis length and a guess at the
labels' width, and labels each one: over less than a decade its log
formatter labels every minor tick (`2e-013e-014e-016e-01`), and long linear
labels in a narrow panel end up touching (`1000012500`). The formatters here
measure their labels when matplotlib asks for them, at every draw, with the
tick labels' font (`matplotlib.textpath`, no renderer needed) at the axes'
current size in pixels, and leave out the labels that would come within
`PAD_EM` of the font size of a neighbour; the ticks and grid lines stay.
Doing it inside the formatters rather than in a pass over a drawn figure
costs no extra draw (about 0.01 s of a figure's 0.2 s save), and a figure
resized, shown in a notebook or saved at another dpi is spaced afresh.
`log_labels` sets up a log axis; `space` wraps the other numeric axes of a
figure (the package's plot functions and `report.save` call it).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np
from matplotlib import category, textpath, ticker
from matplotlib.figure import Figure

PAD_EM = 1.0  # the least gap between two labels, in units of the font size
SUPERSCRIPTS = str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹')
# A minor log label's claim to a place: fewer significant digits first, then by its last digit
# (2 and 5 split a decade in thirds, 3 halves the gap between them)
LAST_DIGIT_ORDER = '523468791'

Span = tuple[float, float] | None  # a label's extent along its axis in pixels; None: out of view


def plain_number(x: float, pos: int | None = None) -> str:
  """A tick label in plain text: '0.25', '300', '20000'; outside [0.001, 1e5) '10⁻⁵', '2×10⁶'.

  Plain text, not mathtext: matplotlib's mathtext parser costs about 0.2 s to
  build in every process and a parse per label, most of the time of saving
  a run's figure.

  Args:
    x: the tick's value.
    pos: its position (unused; matplotlib's formatter signature).

  Returns:
    The label.
  """
  del pos
  if x < 0:
    return '−' + plain_number(-x)
  if x == 0 or not math.isfinite(x) or 1e-3 <= x < 1e5:
    return f'{x:.6g}'  # no exponent below 1e6
  exponent = math.floor(math.log10(x))
  mantissa = float(f'{x / 10**exponent:.6g}')
  if mantissa >= 10:  # 9.9999999e4 rounds up to the next power
    mantissa, exponent = mantissa / 10, exponent + 1
  power = '10' + str(exponent).translate(SUPERSCRIPTS)
  return power if mantissa == 1 else f'{mantissa:g}×{power}'


class SpacedLabels(ticker.Formatter):
  """`inner`'s major tick labels, every n-th only where all would not fit.

  At every draw it keeps every label in view if no two come closer than
  `pad_em`, else every second, every third, ... (the least n that fits).
  Everything else (offset, cursor read-out) is `inner`'s.

  Args:
    inner: the formatter whose labels it spaces.
    pad_em: the least gap between two labels, in units of the font size.
  """

  def __init__(self, inner: ticker.Formatter, pad_em: float = PAD_EM):
    self.inner = inner
    self.pad_em = pad_em

  def set_axis(self, axis) -> None:
    """Attaches this formatter and `inner` to `axis`.

    Args:
      axis: a Matplotlib axis.
    """
    super().set_axis(axis)
    self.inner.set_axis(axis)

  def __call__(self, x: float, pos: int | None = None) -> str:
    return self.inner(x, pos)

  def format_ticks(self, values: Sequence[float]) -> list[str]:
    """`inner`'s labels of `values`, '' where a label is left out.

    Args:
      values: the major ticks' values.

    Returns:
      A label per value.
    """
    texts = self.inner.format_ticks(values)
    spans = label_spans(self.axis, values, texts, minor=False, pad_em=self.pad_em)
    if spans is None:  # in no figure yet: all
      return texts
    keep = set(thinned(spans))
    return [t if i in keep else '' for i, t in enumerate(texts)]

  def get_offset(self) -> str:
    """`inner`'s offset text.

    Returns:
      The text.
    """
    return self.inner.get_offset()

  def format_data(self, value: float) -> str:
    """`inner`'s full-precision text of `value`.

    Args:
      value: a data value.

    Returns:
      The text.
    """
    return self.inner.format_data(value)

  def format_data_short(self, value: float) -> str:
    """`inner`'s cursor read-out of `value`.

    Args:
      value: a data value.

    Returns:
      The text.
    """
    return self.inner.format_data_short(value)


class LogMinorLabels(ticker.Formatter):
  """A log axis's minor labels (`plain_number`) where they clear the major ones and each other.

  The major labels are taken to be `plain_number`'s, spaced by
  `SpacedLabels` (as `log_labels` sets them). Minor labels show only while
  fewer than three major ticks (decades) are in view, so an axis over a few
  decades shows its decades alone. The minor ticks take their places
  roundest first: 2 and 5, then 3, 4, ...; over a small part of a decade
  (where matplotlib's locator falls back to linear steps) 0.25 before 0.22.

  Args:
    pad_em: the least gap between two labels, in units of the font size.
  """

  def __init__(self, pad_em: float = PAD_EM):
    self.pad_em = pad_em

  def __call__(self, x: float, pos: int | None = None) -> str:
    return plain_number(x)

  def format_ticks(self, values: Sequence[float]) -> list[str]:
    """The minor ticks' labels, '' where a label is left out.

    Args:
      values: the minor ticks' values.

    Returns:
      A label per value.
    """
    texts = [plain_number(v) for v in values]
    majors = label_spans(
      self.axis, self.axis.get_majorticklocs(), None, minor=False, pad_em=self.pad_em
    )
    if majors is None:  # in no figure yet: all
      return texts
    if sum(s is not None for s in majors) >= 3:
      return [''] * len(values)
    spans = label_spans(self.axis, values, texts, minor=True, pad_em=self.pad_em)
    taken = [majors[i] for i in thinned(majors)]
    keep = set()
    for i in sorted((i for i, s in enumerate(spans) if s is not None),
                    key=lambda i: _roundness(values[i])):  # fmt: skip
      if all(spans[i][1] <= low or high <= spans[i][0] for low, high in taken):
        taken.append(spans[i])
        keep.add(i)
    return [t if i in keep else '' for i, t in enumerate(texts)]


def log_labels(axis) -> None:
  """Gives a log `axis` plain-text labels (`plain_number`) that never run into one another.

  Args:
    axis: a Matplotlib axis on a log scale.
  """
  axis.set_major_formatter(SpacedLabels(ticker.FuncFormatter(plain_number)))
  axis.set_minor_formatter(LogMinorLabels())


def space(fig: Figure) -> Figure:
  """Spaces the major labels of every numeric axis of `fig` (`SpacedLabels`); returns `fig`.

  Category axes (bar names) keep every label: a left-out name would leave a
  bar unnamed. Spacing an axis twice changes nothing.

  Args:
    fig: the figure.

  Returns:
    `fig`.
  """
  for ax in fig.axes:
    for axis in (ax.xaxis, ax.yaxis):
      formatter = axis.get_major_formatter()
      plain = (SpacedLabels, ticker.NullFormatter, ticker.FixedFormatter)
      if not isinstance(formatter, (*plain, category.StrCategoryFormatter)):
        axis.set_major_formatter(SpacedLabels(formatter))
  return fig


def label_spans(axis, values, texts, *, minor: bool, pad_em: float) -> list[Span] | None:
  """Each label's extent along `axis` in pixels, grown by half of `pad_em` each side.

  None for a value out of view; None for all where the axis is in no figure.

  Args:
    axis: a Matplotlib axis.
    values: the ticks' values.
    texts: their labels; None: `plain_number`'s (a log axis's majors).
    minor: whether the ticks are minor ones (whose font to measure with).
    pad_em: the gap to keep between labels, in units of the font size.

  Returns:
    A (low, high) span in pixels per value, or None.
  """
  ax = getattr(axis, 'axes', None)
  if ax is None or ax.figure is None:
    return None
  if not len(values):
    return []
  vertical = axis.axis_name == 'y'
  length = ax.bbox.height if vertical else ax.bbox.width
  scale = axis.get_transform()
  low, high = scale.transform(np.asarray(axis.get_view_interval(), dtype=float))
  if not (np.isfinite(low) and np.isfinite(high) and high != low and length > 0):
    return None
  with np.errstate(divide='ignore', invalid='ignore'):
    where = (scale.transform(np.asarray(values, dtype=float)) - low) / (high - low) * length
  tick = (axis.get_minor_ticks(1) if minor else axis.get_major_ticks(1))[0]
  font = tick.label1.get_fontproperties()
  px = ax.figure.dpi / 72  # textpath measures in points
  line = _size('lp', font)[1]  # a label's box is at least a line high
  spans: list[Span] = []
  for p, text in zip(where, texts or [plain_number(v) for v in values], strict=True):
    if not (np.isfinite(p) and -0.5 <= p <= length + 0.5):
      spans.append(None)
      continue
    width, height = _size(text, font)
    half = (
      px * ((max(height, line) if vertical else width) + pad_em * font.get_size_in_points()) / 2
    )
    spans.append((p - half, p + half))
  return spans


def thinned(spans: Sequence[Span]) -> list[int]:
  """The indices of every n-th span in view (in order along the axis), for the least n at
  which no two overlap.

  Args:
    spans: the labels' spans (`label_spans`).

  Returns:
    The indices of the labels to show.
  """
  shown = sorted((i for i, s in enumerate(spans) if s is not None), key=lambda i: spans[i][0])
  for stride in range(1, len(shown) + 1):
    for start in range(stride):
      keep = shown[start::stride]
      if all(spans[a][1] <= spans[b][0] for a, b in itertools.pairwise(keep)):
        return keep
  return []


@functools.lru_cache(maxsize=4096)
def _size(text: str, font) -> tuple[float, float]:
  """(width, height) of `text` in `font` (a `FontProperties`), in points."""
  width, height, _ = textpath.text_to_path.get_text_width_height_descent(text, font, ismath=False)
  return width, height


def _roundness(x: float) -> tuple[int, int]:
  digits = f'{abs(x):.5e}'.split('e')[0].replace('.', '').rstrip('0') or '0'
  return len(digits), LAST_DIGIT_ORDER.find(digits[-1])
