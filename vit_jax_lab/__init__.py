"""vit_jax_lab: one jit-sharded core for ViT, ViViT and seq2seq Transformers in JAX/Flax NNX.

Every command starts one way, `python -m vit_jax_lab.tools.NAME`; the old short forms of MOVED_COMMANDS answer
with one line naming it.
"""

import sys
from importlib import abc, machinery, metadata

try:
  __version__ = metadata.version('vit_jax_lab')
except metadata.PackageNotFoundError:  # Run from a clone without `pip install -e .`.
  __version__ = 'unknown'

# Commands once started as `python -m vit_jax_lab.NAME` too (or that a user may try so), now only as
# `python -m vit_jax_lab.tools.NAME`.
MOVED_COMMANDS = (
  'attention_map',
  'average',
  'bench',
  'evaluate',
  'export',
  'hub_benchmark',
  'plot',
  'predict',
  'results',
  'track',
)


class _MovedCommands(abc.MetaPathFinder):
  """Answers the old forms of MOVED_COMMANDS: run with -m, one line `error: ...` naming the new form and exit status
  2 (what a command's usage errors give); imported, a ModuleNotFoundError saying the same."""

  def find_spec(self, fullname: str, path=None, target=None) -> machinery.ModuleSpec | None:
    package, _, name = fullname.rpartition('.')
    if package != __name__ or name not in MOVED_COMMANDS:
      return None
    hint = f'python -m {fullname} is now python -m {__name__}.tools.{name}'
    if sys.argv[:1] == ['-m']:  # Python sets argv[0] to '-m' while it looks for the module -m runs.
      print(f'error: {hint}', file=sys.stderr)
      raise SystemExit(2)
    raise ModuleNotFoundError(f'{fullname} moved: {hint}')


sys.meta_path.insert(0, _MovedCommands())
