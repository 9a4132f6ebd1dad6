"""`python -m vit_jax_lab.attention_map` still works: the command lives in vit_jax_lab/tools/attention_map.py."""

import sys

from vit_jax_lab.tools.attention_map import main

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
