"""The evaluators a run's config turns on, and what the training loop asks of each (`Evaluator`)."""

from typing import Any, Protocol

import jax
import ml_collections
from flax import nnx

from vit_jax_lab.evaluators import fewshot


class Evaluator(Protocol):
  """Built before anything compiles (every mistake in its keys or data is one ConfigError then); called by the
  training loop after a step."""

  name: str  # What the loop's log line calls it, e.g. 'few-shot'.

  def due(self, step: int, last: bool) -> bool:
    """Whether to evaluate after `step` (`last`: the run's final step)."""

  def evaluate(self, params: nnx.State) -> dict[str, float]:
    """Metrics of the evaluated parameters, keyed 'eval/<name>/...' as they are logged."""

  def summary(self, metrics: dict[str, float]) -> str:
    """One line of `evaluate`'s metrics for the console."""


EVALUATORS: dict[str, type] = {'fewshot': fewshot.Evaluator}  # config.eval.<name> -> its Evaluator.


def build(
  config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, graphdef: nnx.GraphDef, param_shardings: Any, info: Any
) -> list[Evaluator]:
  """Every evaluator of `config.eval`; `param_shardings`: how `evaluate`'s parameters are sharded; `info`: what the
  run's task knows of its data."""
  return [EVALUATORS[name](config, mesh, graphdef, param_shardings, info) for name in config.eval]
