"""Language-model data: a token stream cut into windows, read like an image dataset.

An example is a window of `context + 1` consecutive tokens; windows start
every `context` tokens (so consecutive windows share one token and every
token after the first is a target once). Its input is the first `context`
tokens, its labels the last `context` (the next token at every position).
The windows are fixed; each epoch visits them in a fresh order (the
trainer's samplers, as for images). The validation split is cut the same
way, so the validation loss covers every token of it but the first.

`Sequences` offers what the trainer asks of a dataset (`train`, `test`,
`inputs`, `input_shape`, `num_classes`, ...), so every method runs on a
language model unchanged; its `unit` ('char', 'byte' or 'token') names
what the bits of `test_bits` are per.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np


class Windows:
  """A token stream as windows of `context + 1` tokens every `context` tokens.

  Args:
    tokens: the stream's token ids (kept as int32).
    context: tokens a model reads per window (>= 1); window i is tokens
      [i·context, (i + 1)·context], one more to give the last one's label.
  """

  def __init__(self, tokens: np.ndarray, context: int):
    if context < 1:
      raise ValueError(f'context must be >= 1 token, got {context}')
    if len(tokens) < context + 1:
      raise ValueError(
        f'a split of {len(tokens)} tokens has no window of context {context} + 1: '
        f'use a shorter context'
      )
    self.tokens = np.asarray(tokens, np.int32)
    self.context = context
    # One label per window, for samplers that read labels (only 'iid' partitions text).
    self.labels = np.zeros(len(self), np.int32)

  def __len__(self) -> int:
    return (len(self.tokens) - 1) // self.context

  def window(self, idx: np.ndarray) -> np.ndarray:
    """The windows `idx` (any shape) as tokens [..., context + 1].

    Args:
      idx: window indices, any shape.

    Returns:
      int32 [*idx.shape, context + 1].
    """
    starts = np.asarray(idx, np.int64)[..., None] * self.context
    return self.tokens[starts + np.arange(self.context + 1)]


@dataclasses.dataclass(frozen=True)
class Sequences:
  """Train and validation windows of a token stream, and what its tokens are.

  Attributes:
    name: the dataset's name.
    train: training windows.
    test: validation windows (the trainer's held-out split).
    num_classes: the vocabulary size (the model's output width).
    unit: what a token is: 'char', 'byte' or 'token'.
    decode: ids -> text, where the tokens are characters or bytes.
  """

  name: str
  train: Windows
  test: Windows
  num_classes: int
  unit: str = 'token'
  decode: object = None

  input_dtype: ClassVar[type] = np.int32

  @property
  def context(self) -> int:
    return self.train.context

  @property
  def tokens_per_example(self) -> int:
    return self.context

  @property
  def input_shape(self) -> tuple[int, ...]:
    return (self.context,)

  @property
  def example_bytes(self) -> int:
    """Bytes of one window's tokens as fed (int32)."""
    return 4 * (self.context + 1)

  def inputs(self, split: Windows, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [..., context], next tokens [..., context]) of the windows `idx`.

    Args:
      split: `train` or `test`.
      idx: window indices, any shape.

    Returns:
      (inputs, labels), each int32 [*idx.shape, context]: labels are the
      inputs shifted by one token.
    """
    w = split.window(idx)
    return w[..., :-1], w[..., 1:]


def from_tokens(
  name: str,
  train: np.ndarray,
  validation: np.ndarray,
  vocab_size: int,
  context: int,
  unit: str = 'token',
  decode=None,
) -> Sequences:
  """`Sequences` of two token streams; every id must be in [0, vocab_size)."""
  for split, tokens in (('train', train), ('validation', validation)):
    tokens = np.asarray(tokens)
    if tokens.size and not 0 <= tokens.min() <= tokens.max() < vocab_size:
      raise ValueError(
        f'{name} {split}: token ids must lie in [0, {vocab_size}), got '
        f'[{tokens.min()}, {tokens.max()}]'
      )
  try:
    return Sequences(
      name, Windows(train, context), Windows(validation, context), vocab_size, unit, decode
    )
  except ValueError as e:
    raise ValueError(f'{name}: {e}') from None


def bits(loss_nats: float | None) -> float | None:
  """A loss in nats as bits (per token: per character at character level)."""
  return None if loss_nats is None else loss_nats / math.log(2)
