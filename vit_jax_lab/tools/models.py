"""Lists the model families (model.name) and their variants (model.variant), with each variant's size.

python -m vit_jax_lab.tools.models

Any family's keys are set on the command line of a run, e.g. --config.model.variant=S/16; docs/models.md says more.
"""

import sys

from vit_jax_lab import console, models
from vit_jax_lab.models import seq2seq, text_classifier, vit


def _sizes(presets: dict[str, tuple[int, ...]], keys: tuple[str, ...]) -> list[str]:
  return [f'{name:<6} ' + ', '.join(f'{k} {v}' for k, v in zip(keys, dims)) for name, dims in presets.items()]


VIT_KEYS = ('width', 'depth', 'mlp_dim', 'heads')
# What model.variant takes in each family: its form, then the presets it names.
VARIANTS = {
  'vit': ('SIZE[/PATCH], e.g. B/16', _sizes(vit.VARIANTS, VIT_KEYS)),
  'vivit': ('SIZE[/PATCH[xTUBELET_FRAMES]], e.g. B/16x2; SIZE as vit', []),
  'tracker': ('SIZE[/PATCH], e.g. Ti/16; SIZE as vit', []),
  'transformer': ('a preset', _sizes(seq2seq.PRESETS, ('width', 'encoder_depth', 'decoder_depth', 'mlp_dim', 'heads'))),
  'text_classifier': ('a preset', _sizes(text_classifier.PRESETS, VIT_KEYS)),
}


def lines() -> list[str]:
  """Each family: its name and what its docstring says first, then its variants."""
  out = []
  for name, family in models.MODELS.items():
    doc = (family.__doc__ or '').strip().splitlines()
    out.append(f'{name}: {doc[0] if doc else family.__name__}')
    form, presets = VARIANTS.get(name, ('', []))
    if form:
      out.append(f'  model.variant: {form}')
    out += [f'    {p}' for p in presets]
  return out


@console.command
def main(argv: list[str]) -> int:
  parser = console.Parser(prog='python -m vit_jax_lab.tools.models', description=__doc__.split('\n\n')[0])
  parser.parse_args(argv)  # --help, and nothing else, is understood.
  print('\n'.join(lines()))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
