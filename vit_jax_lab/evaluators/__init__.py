"""Evaluations beside the task's own, chosen by config: `config.eval.<name>` holds evaluator <name>'s keys.

An evaluator is a module of this package with an `Evaluator` class (the contract: common.Evaluator), registered in
common.EVALUATORS; its keys and their checks are defined here, one pair of functions per evaluator, because the
evaluators import TensorFlow (about 5 s) and a config mistake should be reported before it loads. A new evaluator is
its module, its keys here and one line in common.EVALUATORS; the training loop does not change.
"""

from typing import Callable

import ml_collections

from vit_jax_lab.errors import check


def fewshot_keys() -> dict:
  """Few-shot linear evaluation (fewshot.py, as big_vision's fewshot_lsr): the model's frozen pre-logits features
  of a dataset's train and test images; per draw, k random train images per class and a closed-form ridge
  regression from their (standardised) features to {-1, 1} one-hot targets; the test accuracy, averaged over the
  draws. Logged as eval/fewshot/<dataset>/<k>shot. Images are preprocessed as data.* says for evaluation."""
  return dict(
    datasets=(),  # TFDS dataset names (built-in or in data.data_dir), e.g. ('digits',); (): off.
    shots=(1, 5, 10, 25),  # k: training images per class of a draw.
    draws=5,  # Random draws per k (seeded by `seed`; the same on any device and host count).
    every=0,  # Evaluate every this many steps, and at the end; 0: whenever the run evaluates (eval_every).
    l2_reg=2.0**10,  # Ridge regularisation (big_vision's default, 1024).
    train_split='train',  # The split the k-shot examples are drawn from (TFDS split syntax)...
    test_split='test',  # ...and the one scored.
    # Read at most this many of train_split's first examples (features of all of them are computed at each
    # evaluation; the draws come from them).
    max_train=50_000,
  )


def check_fewshot(f: ml_collections.ConfigDict) -> None:
  names = f.datasets
  check(
    all(isinstance(n, str) and n.strip() for n in names) and len(set(names)) == len(names),
    f'eval.fewshot.datasets={names} must be distinct TFDS dataset names, e.g. ("digits",); () turns it off',
  )
  check(
    len(f.shots) > 0
    and all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in f.shots)
    and len(set(f.shots)) == len(f.shots),
    f'eval.fewshot.shots={f.shots} must be distinct positive integers (training images per class), e.g. (1, 5, 10, 25)',
  )
  check(
    0 < f.draws <= MAX_DRAWS,
    f'eval.fewshot.draws={f.draws} must be from 1 to {MAX_DRAWS:,} (each draw is a regression per shot count at every '
    'evaluation; big_vision averages a few): use 5',
  )
  check(f.every >= 0, f'eval.fewshot.every={f.every} must be >= 0 (0: whenever the run evaluates)')
  check(f.l2_reg > 0, f'eval.fewshot.l2_reg={f.l2_reg} must be positive')
  check(f.max_train > 0, f'eval.fewshot.max_train={f.max_train} must be a positive integer')
  for key in ('train_split', 'test_split'):
    check(f[key].strip() != '', f'eval.fewshot.{key} is empty: name a split, e.g. train')


MAX_DRAWS = 1_000  # eval.fewshot.draws beyond it would hold an evaluation for days (10**12 was accepted).

# name -> (its keys, their checks): the groups of config.eval.
KEYS: dict[str, tuple[Callable[[], dict], Callable[[ml_collections.ConfigDict], None]]] = {
  'fewshot': (fewshot_keys, check_fewshot),
}


def config() -> ml_collections.ConfigDict:
  """`config.eval`: one group per evaluator."""
  return ml_collections.ConfigDict({name: keys() for name, (keys, _) in KEYS.items()})


def validate(eval_config: ml_collections.ConfigDict) -> None:
  for name, (_, checks) in KEYS.items():
    checks(eval_config[name])
