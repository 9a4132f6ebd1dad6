"""`python -m vit_jax_lab.export` still works: the command lives in vit_jax_lab/tools/export.py."""

import sys

from vit_jax_lab.tools.export import main

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
