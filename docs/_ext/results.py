"""MkDocs hook: the plots in experiments/results/ are served as results/<name>.png.

The runs write their tables and plots to experiments/results/
(`experiments/docs_tables.py` copies the tables into the pages); the plots
are not copied but added to the site from there, so a page links one as
`../results/<name>.png` and the strict build fails on a plot that is missing.
"""

import os

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(ROOT, 'experiments')


def on_files(files, config):
  folder = os.path.join(EXPERIMENTS, 'results')
  for name in sorted(os.listdir(folder)):
    if name.endswith('.png'):
      files.append(
        File(
          f'results/{name}',
          src_dir=EXPERIMENTS,
          dest_dir=config['site_dir'],
          use_directory_urls=config['use_directory_urls'],
        )
      )
  return files
