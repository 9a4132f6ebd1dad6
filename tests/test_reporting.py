"""The console line's rate and ETA without compilation time, and the final line's best evaluation and wall time."""

import json
import re

import jax
import jax.numpy as jnp
import pytest

from vit_jax_lab import reporting, train


def test_rate_and_eta_leave_out_compilation(monkeypatch):
  clock = {'now': 100.0}
  monkeypatch.setattr(reporting.time, 'perf_counter', lambda: clock['now'])
  progress = reporting.Progress(total_steps=100, batch_size=8, start_step=0)
  clock['now'] += 12.0  # 10 steps in 12 s, 10 of them compiling.
  jax.monitoring.record_event_duration_secs(reporting.COMPILE_EVENTS[2], 10.0)
  rate = progress.rate(10)
  assert rate == pytest.approx(5.0)
  assert progress.line(10, 0.5, rate) == 'step  10/100  loss 0.5000  5.00 steps/s  40 examples/s  ETA 00:00:18'
  clock['now'] += 4.0  # No compilation: every second counts.
  assert progress.rate(30) == pytest.approx(5.0)


def test_a_real_compilation_is_counted():
  before = reporting.compile_seconds()
  jax.jit(lambda x: jnp.sin(x) * 3.25 + x.sum())(jnp.arange(7.0)).block_until_ready()
  assert reporting.compile_seconds() > before


def test_best_eval_ranks_by_the_headline_metric(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  assert reporting.best_eval(str(path)) == ''
  rows = [
    {'step': 2, 'train/loss': 1.0},
    {'step': 2, 'eval/loss': 0.9, 'eval/accuracy': 0.5},
    {'step': 4, 'eval/loss': 0.4, 'eval/accuracy': 0.95},
    {'step': 6, 'eval/loss': 0.3, 'eval/accuracy': 0.9},
    {'step': 6, 'eval/fewshot/digits/5shot': 0.7},
  ]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  assert reporting.best_eval(str(path)) == 'best eval/accuracy 0.9500 at step 4'
  path.write_text(''.join(json.dumps({'step': s, 'eval/loss': v}) + '\n' for s, v in ((1, 2.0), (2, 0.5), (3, 0.7))))
  assert reporting.best_eval(str(path)) == 'best eval/loss 0.5000 at step 2'  # Lower is better.


@pytest.mark.slow
def test_the_done_line_gives_the_best_evaluation_what_chance_scores_and_the_wall_time(smoke_config, tmp_path, capsys):
  train.train_and_evaluate(smoke_config(total_steps=4, eval_every=2), str(tmp_path / 'run'))
  done = capsys.readouterr().out.splitlines()[-1]
  assert re.fullmatch(
    r'done: step 4  eval/accuracy \S+  eval/loss \S+  best eval/accuracy \S+ at step [24]  '
    r'chance eval/accuracy 0.1000 \(10 classes\)  wall 00:00:\d\d  '
    r'workdir \S+  checkpoint \S+',
    done,
  ), done


def test_the_last_line_ranks_by_the_tasks_headline(tmp_path):
  """SCAN's runs rank by exact match (task.headline), not the BLEU the same evaluations log."""
  path = tmp_path / 'metrics.jsonl'
  path.write_text(
    '{"step": 100, "eval/bleu": 0.9, "eval/exact_match": 0.5}\n'
    '{"step": 200, "eval/bleu": 0.8, "eval/exact_match": 0.7}\n'
  )
  assert reporting.best_eval(str(path)) == 'best eval/bleu 0.9000 at step 100'
  assert reporting.best_eval(str(path), 'eval/exact_match') == 'best eval/exact_match 0.7000 at step 200'
