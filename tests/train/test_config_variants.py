"""configs/variants/<group>.py: every variant builds; settings, names and errors."""

import os
import re

import pytest

from jaxdist import runtime
from jaxdist.train import compare, factory
from jaxdist.train import config as config_lib

from conftest import REPO

FOLDER = os.path.join(REPO, 'configs', 'variants')
GROUPS = compare.load_groups(FOLDER)


@pytest.mark.parametrize(
  'group, variant', [(g, v) for g, group in GROUPS.items() for v in group.variants]
)
def test_every_variant_builds_its_chain(group, variant):
  base, variants = compare.choose(config_lib.base(), GROUPS[group].path, folder=FOLDER)
  config = compare.variant_config(base, variants, variant)
  tx, _ = factory.build_chain(
    config, runtime.layout(config.workers, devices=config.devices or None)
  )
  assert callable(tx.update)


def test_a_name_means_one_variant_in_every_file(tmp_path):
  known = compare.known_variants(GROUPS.values())
  assert known['dense'] == known['bsp'] == {'sync': {'method': 'allreduce'}}
  assert 'variants' not in config_lib.base() and 'compare' not in config_lib.base()
  (tmp_path / 'a.py').write_text("VARIANTS = {'x': {'steps': 1}}\n")
  (tmp_path / 'b.py').write_text("SETTINGS = {'workers': 2}\nVARIANTS = {'x': {'steps': 2}}\n")
  groups = compare.load_groups(str(tmp_path))
  assert groups['b'].settings == {'workers': 2} and groups['a'].settings == {}
  with pytest.raises(factory.ConfigError, match=r"variant 'x' differs between .*a.py and .*b.py"):
    compare.known_variants(groups.values())


def test_the_file_s_settings_go_under_the_command_line_and_the_variant_over_both():
  base = config_lib.base()
  base.batch_size = 64  # as --config.batch_size=64 sets it
  path = GROUPS['heterogeneous'].path
  config, variants = compare.choose(base, path, folder=FOLDER, keep={'batch_size': 64})
  assert list(variants) == ['uniform_h2', 'dynamic_h2', 'uniform_h10', 'dynamic_h10']
  assert (config.workers, config.batch_size) == (3, 64)
  assert (base.workers, base.batch_size) == (8, 64)  # base itself unchanged
  dynamic = compare.variant_config(config, variants, 'dynamic_h2')
  assert (dynamic.workers, dynamic.batching, dynamic.dynamic_batching.b_max) == (3, 'dynamic', 64)


def test_only_names_any_variant_of_the_folder_in_its_order():
  path = GROUPS['default'].path
  _, default = compare.choose(config_lib.base(), path, folder=FOLDER)
  assert list(default) == ['dense', 'topk1_ef', 'artopk1', 'powersgd2']
  _, chosen = compare.choose(config_lib.base(), path, ['qsgd8', 'dense', 'gravac'], folder=FOLDER)
  assert list(chosen) == ['qsgd8', 'dense', 'gravac']
  with pytest.raises(factory.ConfigError, match=r"unknown variant 'qsdg8' \(did you mean 'qsgd8'"):
    compare.choose(config_lib.base(), path, ['dense', 'qsdg8'], folder=FOLDER)


def test_a_key_the_config_does_not_have_is_an_error(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text("SETTINGS = {'cluster.sped': '1,2'}\nVARIANTS = {'x': {}}\n")
  with pytest.raises(factory.ConfigError, match=r"bad.py: SETTINGS sets 'cluster.sped', which"):
    compare.choose(config_lib.base(), str(bad), folder=FOLDER)
  variants = {'x': {'sync': {'metod': 'ssp'}}}
  with pytest.raises(factory.ConfigError, match=r"variant 'x.sync' sets 'metod', which the"):
    compare.variant_config(config_lib.base(), variants, 'x')
  (tmp_path / 'none.py').write_text('X = 1\n')
  with pytest.raises(factory.ConfigError, match=r'none\.py has no VARIANTS dict'):
    compare.load_group(str(tmp_path / 'none.py'))
  with pytest.raises(factory.ConfigError, match='no variants file at'):
    compare.load_group(str(tmp_path / 'absent.py'))
  typo = os.path.join(FOLDER, 'compresion.py')
  with pytest.raises(factory.ConfigError, match=r'did you mean .*/variants/compression\.py\?'):
    compare.load_group(typo)


def test_every_results_group_of_the_makefile_is_a_variants_file_with_a_results_table():
  with open(os.path.join(REPO, 'Makefile')) as f:
    makefile = f.read()
  groups = re.findall(r'\$\(call group,(\w+)', makefile)
  assert len(groups) == len(set(groups)) >= 12
  for name in groups:
    assert name in GROUPS, name
    assert os.path.exists(os.path.join(REPO, 'experiments', 'results', f'{name}.md')), name
  rest = {'default', 'default_lm', 'elastic', 'peers', 'lm', 'network', 'network_lm', 'overlap_lm',
          'hetero_hosts', 'hetero_diloco', 'hetero_streams'}  # fmt: skip
  assert set(GROUPS) - set(groups) == rest  # make run, run-lm, results-lm, bench-network, ...
  # the language model's group trains its own config (make results-lm)
  assert '--variants=configs/variants/lm.py --results=experiments/results/lm.md' in makefile
