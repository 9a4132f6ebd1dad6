"""tools.plot: runs' metrics.jsonl drawn as one panel per metric and one line per run."""

import json

import numpy as np
import pytest
from PIL import Image

from vit_jax_lab.tools import plot


def write_run(folder, rows):
  folder.mkdir()
  (folder / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(folder)


@pytest.fixture
def runs(tmp_path):
  a = write_run(
    tmp_path / 'a',
    [
      {'step': 10, 'train/loss': 2.0, 'train/steps_per_sec': 5.0},
      {'step': 20, 'train/loss': 1.0, 'train/steps_per_sec': 5.0},
      {'step': 20, 'eval/loss': 1.2, 'eval/accuracy': 0.6, 'eval/examples': 360.0},
    ],
  )
  b = write_run(tmp_path / 'b', [{'step': 10, 'train/loss': 3.0}, {'step': 20, 'train/loss': 1.5}])
  return a, b


def test_each_metric_a_panel_each_run_a_line(runs, capsys):
  a, b = runs
  assert plot.main([a]) == 0
  assert capsys.readouterr().out.strip() == f'wrote {a}/curves.png: 3 metrics of 1 run'
  alone = open(f'{a}/curves.png', 'rb').read()
  assert plot.main([a, b]) == 0  # Beside the first run's own curves.png, which stays.
  assert capsys.readouterr().out.strip() == f'wrote {a}/curves_with_b.png: 3 metrics of 2 runs'
  assert np.asarray(Image.open(f'{a}/curves_with_b.png')).std() > 0 and open(f'{a}/curves.png', 'rb').read() == alone
  assert plot.main([a, '--out', f'{b}/mine']) == 0  # No extension: written as .png, and said so.
  assert capsys.readouterr().out.strip() == f'wrote {b}/mine.png: 3 metrics of 1 run'
  assert plot.main([a, '--out', f'{b}/mine.pdf']) == 2
  fig = plot.figure({'a': plot.read(a), 'b': plot.read(b)}, ['train/loss', 'eval/accuracy'])
  shown = [ax for ax in fig.axes if ax.get_visible()]
  assert [ax.get_title() for ax in shown] == ['train/loss', 'eval/accuracy']
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ['a', 'b']
  lines = shown[0].get_lines()
  assert [line.get_label() for line in lines] == ['a', 'b']
  np.testing.assert_array_equal(lines[1].get_xdata(), [10, 20])
  np.testing.assert_array_equal(lines[1].get_ydata(), [3.0, 1.5])
  assert [line.get_label() for line in shown[1].get_lines()] == ['a']  # Run b never evaluated.
  assert fig.get_suptitle() == 'metrics.jsonl of 2 runs'


def test_chosen_metrics_and_mistakes(runs, tmp_path, capsys):
  a, b = runs
  out = str(tmp_path / 'loss.png')
  assert plot.main([a, b, '--metrics', 'train/loss', '--out', out]) == 0
  assert Image.open(out).size[0] > 0
  capsys.readouterr()
  assert plot.main([a, '--metrics', 'eval/bleu']) == 2
  assert 'error: --metrics: eval/bleu not logged by these runs; they logged train/loss' in capsys.readouterr().err
  assert plot.main([str(tmp_path)]) == 2
  assert 'has no metrics.jsonl' in capsys.readouterr().err


def test_metrics_that_are_not_numbers_and_bad_outs_are_one_line(runs, tmp_path, capsys):
  a, _ = runs
  bad = tmp_path / 'bad'
  bad.mkdir()
  (bad / 'metrics.jsonl').write_text('{"step": 1, "train/loss": "high"}\n')
  assert plot.main([str(bad)]) == 2
  assert f'{bad}/metrics.jsonl:1 is not a metrics line of numbers' in capsys.readouterr().err
  (bad / 'metrics.jsonl').write_text('{"step": 1, "train/loss": null}\n')
  assert plot.main([str(bad)]) == 2
  assert plot.main([a, '--out', str(tmp_path / 'missing' / 'x.png')]) == 2
  assert 'its folder does not exist' in capsys.readouterr().err
  assert plot.main([a, '--out', '/proc/x.png']) == 2  # A folder that refuses new files (before: 35 lines).
  err = capsys.readouterr().err
  assert err == 'error: /proc/x.png cannot be written (No such file or directory): name a place that can\n'
