"""`python -m vit_jax_lab.track` (the issue's name): the command lives in vit_jax_lab/tools/track.py."""

import sys

from vit_jax_lab.tools.track import main

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
