"""What exists, said by the commands: `python -m main --help` lists the configs with their :ARG forms and choices,
tools.models the model families and their variants."""

import glob
import os

import pytest

import main
from vit_jax_lab import models
from vit_jax_lab.tools import models as models_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_main_help_lists_every_config_with_its_argument(capsys):
  with pytest.raises(SystemExit):
    main.parse_args(['--help'])
  out = capsys.readouterr().out
  for path in glob.glob(os.path.join(ROOT, 'configs', '*', '*.py')):
    assert f'\n{os.path.relpath(path, ROOT)}' in out
  assert '\nconfigs/seq2seq/scan.py:SPLIT[,beam][,smoke]\n' in out
  assert (
    '\nconfigs/vit/digits.py:[smoke]\n    A small ViT on the built-in UCI digits' in out
  )  # From its example commands.
  assert 'KIND is model.attention: full (the default), local, sparse or linear.' in out  # The choices.
  assert 'python -m vit_jax_lab.tools.models' in out


def test_models_command_lists_the_families_and_their_variants(capsys):
  assert models_tool.main([]) == 0
  out = capsys.readouterr().out.splitlines()
  assert [line.split(':')[0] for line in out if not line.startswith(' ')] == list(models.MODELS)
  assert '    B      width 768, depth 12, mlp_dim 3072, heads 12' in out
  assert '    big    width 1024, encoder_depth 6, decoder_depth 6, mlp_dim 4096, heads 16' in out
  assert '  model.variant: SIZE[/PATCH[xTUBELET_FRAMES]], e.g. B/16x2; SIZE as vit' in out
