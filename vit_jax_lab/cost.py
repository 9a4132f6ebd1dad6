"""What a model costs: parameter counts and multiply-adds, from abstract shapes (nothing allocated)."""

import math
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx
from jax.extend import core as jax_core


def param_count(tree: Any) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def matmul_macs(fn: Callable, *args: Any) -> int:
  """Multiply-adds of every matmul and convolution `fn` runs (attention's included), the convention of
  published GMAC figures. Elementwise work (norms, activations, softmax) is not counted."""
  return jaxpr_macs(jax.make_jaxpr(fn)(*args).jaxpr)


def jaxpr_macs(jaxpr) -> int:
  """`matmul_macs` of a jaxpr (e.g. a jitted function's, from its `.trace(...)`)."""
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      lhs, rhs = (v.aval.shape for v in eqn.invars)
      (_, rhs_contract), (_, rhs_batch) = eqn.params['dimension_numbers']
      total += math.prod(lhs) * math.prod(d for i, d in enumerate(rhs) if i not in (*rhs_contract, *rhs_batch))
    elif name == 'conv_general_dilated':
      out, kernel = eqn.outvars[0].aval.shape, eqn.invars[1].aval.shape
      spec = eqn.params['dimension_numbers'].rhs_spec  # (out features, in features, *spatial)
      total += math.prod(out) * kernel[spec[1]] * math.prod(kernel[i] for i in spec[2:])
    repeats = eqn.params.get('length', 1) if name == 'scan' else 1
    for sub in jax_core.jaxprs_in_params(eqn.params):
      total += repeats * jaxpr_macs(sub)
  return total


def xla_flops(fn: Callable, *args: Any) -> float:
  """Floating-point operations of `fn` by XLA's cost analysis (elementwise work included)."""
  return float(jax.jit(fn).lower(*args).cost_analysis()['flops'])


def forward(model_fn: Callable, input_shape: tuple[int, ...]) -> tuple[Callable, Any]:
  """(fn, args) computing one example's forward pass of the NNX model built by `model_fn`, abstractly."""
  graphdef, params = nnx.split(nnx.eval_shape(model_fn), nnx.Param)

  def fn(p, x):
    return nnx.merge(graphdef, p)(x)

  return fn, (params, jax.ShapeDtypeStruct((1, *input_shape), np.float32))
