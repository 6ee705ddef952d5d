"""Text from tfds as token ids: characters or bytes of a train and a validation split.

`load_text('shakespeare')` builds the bundled complete works on first use
(no download). Any other tfds text dataset prepared as array_record
(`lm1b`, `tiny_shakespeare`, ...) reads through the same path: a split's
examples, each a document, are joined by a newline into one stream, which
`jaxdist.data.sequences` cuts into windows.

Tokens are characters (`level='char'`: the vocabulary is the sorted set of
characters that occur in the two splits as read, nanoGPT's reading of
`shakespeare_char`) or UTF-8 bytes (`level='byte'`: vocabulary 256, nothing
depends on the data).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import tensorflow_datasets as tfds

from jaxdist.data import loader

LEVELS = ('char', 'byte')


@dataclasses.dataclass(frozen=True)
class Text:
  """Two token streams and how to read them back.

  Attributes:
    train: training tokens, int32.
    validation: validation tokens, int32.
    vocab_size: the number of token ids (every id is in [0, vocab_size)).
    level: 'char' or 'byte'.
    chars: the characters of the ids, in id order ('char' level; '' for bytes).
  """

  train: np.ndarray
  validation: np.ndarray
  vocab_size: int
  level: str
  chars: str = ''

  def encode(self, text: str) -> np.ndarray:
    """`text` as token ids (a character outside the vocabulary is an error).

    Args:
      text: a string.

    Returns:
      int32 ids: its characters' ('char') or its UTF-8 bytes' ('byte').

    Raises:
      ValueError: if a character is outside the vocabulary.
    """
    return _ids(text, self.chars)

  def decode(self, ids) -> str:
    """Token ids as text (bytes that are not valid UTF-8 become U+FFFD).

    Args:
      ids: token ids, any shape (read flat).

    Returns:
      The text.
    """
    ids = np.asarray(ids).reshape(-1)
    if self.level == 'byte':
      return ids.astype(np.uint8).tobytes().decode('utf-8', errors='replace')
    return ''.join(self.chars[i] for i in ids)


def load_text(
  name: str,
  *,
  data_dir: str | None = None,
  download: bool = False,
  level: str = 'char',
  train_split: str = 'train',
  validation_split: str = 'validation',
  text_key: str | None = None,
) -> Text:
  """Loads a tfds text dataset as character or byte tokens.

  Args:
    name: `shakespeare` (bundled, built on first use) or any tfds text
      dataset prepared in `data_dir` as array_record.
    data_dir: tfds data directory (default `$TFDS_DATA_DIR` or
      `~/tensorflow_datasets`).
    download: let tfds download and prepare a missing dataset.
    level: 'char' or 'byte'.
    train_split: the training split's tfds name, slicing allowed.
    validation_split: the validation split's tfds name, slicing allowed.
    text_key: the feature holding the text; None: 'text', or the only text
      feature.

  Returns:
    The `Text`.

  Raises:
    DatasetError: unknown name, not prepared, no text feature, or an empty split.
    ValueError: an unknown level.
  """
  if level not in LEVELS:
    raise ValueError(f'level must be one of {LEVELS}, got {level!r}')
  data_dir = data_dir or loader.default_data_dir()
  train, validation = _read(name, data_dir, download, train_split, validation_split, text_key)
  chars = '' if level == 'byte' else ''.join(sorted(set(train) | set(validation)))
  vocab_size = len(chars) if chars else 256
  return Text(_ids(train, chars), _ids(validation, chars), vocab_size, level, chars)


def _ids(text: str, chars: str) -> np.ndarray:
  """Ids of `text`: its UTF-8 bytes where `chars` is '', else its characters in `chars`."""
  if not chars:
    return np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32)
  points = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  vocab = np.frombuffer(chars.encode('utf-32-le'), np.uint32)
  ids = np.searchsorted(vocab, points)
  unknown = (ids >= len(vocab)) | (vocab[np.minimum(ids, len(vocab) - 1)] != points)
  if unknown.any():
    bad = sorted({chr(p) for p in points[unknown]})[:5]
    raise ValueError(f'characters outside the vocabulary: {bad!r}')
  return ids.astype(np.int32)


@functools.lru_cache(maxsize=2)
def _read(
  name: str,
  data_dir: str,
  download: bool,
  train_split: str,
  validation_split: str,
  text_key: str | None,
) -> tuple[str, str]:
  """The two splits' documents, each joined by newlines."""
  builder = loader.prepared_builder(name, data_dir, download, kind='text')
  key = _text_key(name, builder.info.features, text_key)
  sources = loader.sources(name, builder, data_dir, download, (train_split, validation_split))
  out = []
  for split, source in zip((train_split, validation_split), sources, strict=True):
    docs = [r[key] for records in loader.record_chunks(source) for r in records]
    text = '\n'.join(d.decode('utf-8') if isinstance(d, bytes) else str(d) for d in docs)
    if not text:
      raise loader.DatasetError(f'dataset {name!r}: split {split!r} has no text')
    out.append(text)
  return out[0], out[1]


def _text_key(name: str, features, text_key: str | None) -> str:
  """The feature that holds the text: `text_key`, else 'text', else the only text feature."""
  texts = [k for k, f in features.items() if isinstance(f, tfds.features.Text)]
  if text_key is not None:
    if text_key not in features:
      raise loader.DatasetError(
        f'dataset {name!r} has no feature {text_key!r} (config.dataset.text_key); '
        f'its features are {sorted(features)}'
      )
    return text_key
  if 'text' in features:
    return 'text'
  if len(texts) == 1:
    return texts[0]
  raise loader.DatasetError(
    f'dataset {name!r}: cannot tell which feature is the text among {sorted(features)}; '
    f'name it with config.dataset.text_key'
  )
