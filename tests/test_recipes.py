"""The cluster recipes' tables (reference value, its source, our config's value) are what the configs set."""

import os

import pytest

from experiments import common
from experiments.vit_finetune import recipes as vit_finetune
from experiments.vivit_kinetics400 import recipes as vivit_kinetics400
from experiments.wmt14_ende import recipes as wmt14_ende


@pytest.mark.parametrize(
  'script', [vit_finetune, vivit_kinetics400, wmt14_ende], ids=lambda m: m.__name__.split('.')[1]
)
def test_recipe_tables_in_the_readmes_are_up_to_date_and_agree(script):
  with open(os.path.join(os.path.dirname(script.__file__), 'README.md')) as f:
    readme = f.read()
  recipe = common.recipe_lines(script.recipe_rows())
  for table in (recipe, *([script.accuracy_lines()] if hasattr(script, 'accuracy_lines') else [])):
    assert '\n'.join(table) in readme, f'rerun python -m {script.__name__}'
  # Each setting is the reference's, but for the differences the script names (and the README explains).
  differing = {line.split(' | ')[0].removeprefix('| ') for line in recipe if line.endswith('| ≠ |')}
  assert differing == set(getattr(script, 'DIFFERENCES', {}))
