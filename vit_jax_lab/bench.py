"""`python -m vit_jax_lab.bench` still works: the command lives in vit_jax_lab/tools/bench.py."""

import sys

from vit_jax_lab.tools.bench import main

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
