"""Command-line programs built on the library; the library never imports them.

Each starts one way, `python -m vit_jax_lab.tools.NAME`. Importing a command quiets the libraries' start-up
logging first (console.quiet_libraries), so that it prints its own lines only; VIT_JAX_LAB_VERBOSE=1 keeps the
logging. That is where a command loads TensorFlow: 5.4 s of the 5.9 s `import vit_jax_lab.tools.predict` takes
(`python -X importtime`). Every command needs it (`train` reads data through it), so commands import everything at
their top: an import deferred inside one would save nothing.
"""

from vit_jax_lab import console

console.quiet_libraries()
