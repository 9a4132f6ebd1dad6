"""Command-line programs built on the library; the library never imports them.

Importing a command quiets the libraries' start-up logging first (console.quiet_libraries), so that it
prints its own lines only; VIT_JAX_LAB_VERBOSE=1 keeps the logging.
"""

from vit_jax_lab import console

console.quiet_libraries()
