"""Every notebook is in sync with its py:percent twin and runs top to bottom."""

import glob
import json
import math
import os

import jupytext
import nbclient
import pytest

from conftest import REPO, xla_flags_for_tests

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, 'notebooks', '*.ipynb')))


def sources(notebook):
  return [(c.cell_type, c.source.strip()) for c in notebook.cells]


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_ipynb_matches_its_py_percent_twin(path):
  twin = path[: -len('.ipynb')] + '.py'
  assert os.path.exists(twin), (
    f'{path} has no py:percent twin; run `jupytext --set-formats ipynb,py:percent`'
  )
  assert sources(jupytext.read(path)) == sources(jupytext.read(twin)), (
    f'{path} and {twin} differ; run `jupytext --sync {twin}`'
  )


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', data_dir)
  monkeypatch.setenv('PYTHONPATH', REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
  monkeypatch.setenv('XLA_FLAGS', xla_flags_for_tests())  # not the parent's device count
  notebook = jupytext.read(path[: -len('.ipynb')] + '.py')
  # run in a folder of its own, as on Colab: outputs land in tmp_path, and the configs are
  # the ones that come with jaxdist (found by name), not a ../configs beside the notebook
  workdir = tmp_path / 'notebooks'
  workdir.mkdir()
  nbclient.NotebookClient(
    notebook, timeout=300, kernel_name='python3', resources={'metadata': {'path': str(workdir)}}
  ).execute()
  text = '\n'.join(
    o.get('text', '') for c in notebook.cells if c.cell_type == 'code' for o in c.outputs
  )
  assert 'test accuracy' in text
  images = [
    o for c in notebook.cells if c.cell_type == 'code' for o in c.outputs
    if 'image/png' in o.get('data', {})
  ]  # fmt: skip
  assert images, f'{os.path.basename(path)} shows no plot (no image/png output)'
  name = os.path.basename(path)[: -len('.ipynb')]
  assert list((workdir / 'workdir' / name).glob('**/metrics.jsonl')), 'it trained nothing'
  for found in (workdir / 'workdir' / name).glob('**/summary.json'):  # each run it trained
    summary = json.loads(found.read_text())
    assert math.isfinite(summary['test_loss']) and math.isfinite(summary['test_accuracy']), found
    if summary.get('unit') == 'char':  # Shakespeare: better than guessing among 84 characters
      assert summary['test_loss'] < math.log(84), (found, summary['test_loss'])
