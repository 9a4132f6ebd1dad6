"""Command-line programs built on the library; the library never imports them.

Each starts one way, `python -m vit_jax_lab.tools.NAME`. Importing a command quiets the libraries' start-up
logging first (console.quiet_libraries), so that it prints its own lines only; VIT_JAX_LAB_VERBOSE=1 keeps the
logging. TensorFlow (5.4 s of start-up) loads with the first module that reads a dataset; a command that reads
none (`bench --synthetic`) never loads it.
"""

from vit_jax_lab import console

console.quiet_libraries()
