"""Writes a ViT run's parameters in the vision_transformer .npz layout, readable by other tools.

python -m vit_jax_lab.tools.export --workdir runs/vit_digits --out runs/vit_digits/vit.npz
"""

import argparse
import sys

from vit_jax_lab import checkpoints, console, workdir as workdir_lib
from vit_jax_lab.errors import ConfigError
from vit_jax_lab.models import release, vit


def export(workdir: str, out: str) -> dict:
  """Exports the newest checkpoint of `workdir` to `out` and returns the flat arrays written."""
  model = workdir_lib.load_run(workdir).model
  if model.name != 'vit':
    raise ConfigError(f'--workdir {workdir} holds a {model.name!r} model; only vit has a release layout')
  num_heads = model.num_heads or vit.decode_variant(model.variant)['num_heads']
  flat = release.to_release(checkpoints.read_params(workdir), num_heads)
  checkpoints.write_npz(out, flat)
  return flat


@console.command
def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(prog='python -m vit_jax_lab.tools.export', description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--out', required=True, help='the .npz file to write')
  args = parser.parse_args(argv)
  flat = export(args.workdir, args.out)
  print(f'wrote {len(flat)} arrays, {sum(v.size for v in flat.values()):,} parameters, to {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
