"""The experiment scripts' bookkeeping of their training runs: what a table reports as its training time."""

import json

import pytest

from experiments import common


def test_training_minutes_count_runs_side_by_side_once(tmp_path):
  def run(name, kept):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'wall_seconds.json').write_text(json.dumps(kept))
    return str(tmp_path / name)

  # Two runs side by side (0-600 s and 60-660 s), then one alone after a pause (1000-1300 s): busy 660 + 300 s.
  side = [run('a', {'seconds': 600, 'start': 0, 'end': 600}), run('b', {'seconds': 600, 'start': 60, 'end': 660})]
  later = run('c', {'seconds': 300, 'start': 1000, 'end': 1300})
  assert common.training_minutes([*side, later]) == pytest.approx(960 / 60)
  assert common.training_minutes(side[:1]) == pytest.approx(10)
  assert [common.wall(w)['seconds'] for w in side] == [600, 600]
  # A run from before start and end were kept (its seconds alone): the times add up.
  old = run('d', 120.0)
  assert common.wall(old) == {'seconds': 120.0}
  assert common.training_minutes([*side, old]) == pytest.approx(1320 / 60)
