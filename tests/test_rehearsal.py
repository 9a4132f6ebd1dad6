"""The rehearsal's arithmetic (the mid-epoch step, the real-scale memory and resume estimates) and a tiny rehearsal
of the DeiT recipe's input path that writes its table."""

import json
import os
import subprocess
import sys

import pytest

from experiments.rehearsal import run as rehearsal

MB = 2**20


def measurements(**changes) -> dict:
  """A row's measurements as a probe reports them: 1,000 examples, a buffer of all of them beside one of 16."""
  m = dict(
    n=1_000,
    record_bytes=100_000.0,
    repeats=1,
    batch=10,
    groups=0,
    buffer=1_000,
    cache=False,
    recipe_buffer=250_000,
    recipe_batch=1_000,
    token_budget=None,
    estimated_example_bytes=90_000.0,
    main=dict(
      examples=500,
      cpu_s=5.0,
      wall_s=2.5,
      peak=600 * MB,
      before=100 * MB,
      out_bytes_per_example=1_000.0,
      tokens_per_example=0.0,
      batches=50,
      first_s=1.0,
      rows_per_batch=10.0,
      first_rows=10,
    ),
    small=dict(peak=600 * MB - 984 * 100_000, buffer=16, batches=52),
    resume={'step': 50, 'skipped': 500, 'first_0': [1.0, 1.2], 'first_mid': [2.0, 2.2]},
  )
  return m | changes


def test_mid_epoch_step_lands_nearest_the_middle():
  assert rehearsal.mid_epoch_step(1_000, 10) == (50, 500)
  assert rehearsal.mid_epoch_step(1_000, 300) == (5, 500)  # 1,500 examples in: the middle of the second epoch.
  step, skipped = rehearsal.mid_epoch_step(1_000, 96)
  assert abs(skipped - 500) <= 48 and round(step * 96) % 1_000 == skipped


def test_real_scale_numbers_follow_from_the_measurements():
  row = rehearsal.BY_NAME['imagenet_deit']
  d = rehearsal.derive(row, measurements())
  assert d['per_cpu_s'] == 100 and d['per_s'] == 200
  assert d['measured_bytes'] == pytest.approx(100_000)  # (peak - small peak) / (1,000 - 16) buffered examples.
  assert d['example_bytes'] == pytest.approx(100_000)  # The larger of measured and estimated.
  assert d['real_buffered'] == 250_000
  assert d['batch_bytes'] == rehearsal.PREFETCHED * (1_000 - 10) * 1_000
  assert d['real_peak'] == pytest.approx(600 * MB + 249_000 * 100_000 + d['batch_bytes'])
  assert d['resume_extra'] == pytest.approx(1.0)
  assert d['real_skipped'] == row.real_examples // 2
  assert d['real_resume'] == pytest.approx(row.real_examples // 2 / 500)
  assert d['cores'] == pytest.approx(row.gpu_rate / 100)
  # A larger estimate than measured wins; a cache holds every example besides the buffer.
  assert rehearsal.derive(row, measurements(estimated_example_bytes=2e5))['example_bytes'] == 2e5
  cached = rehearsal.derive(row, measurements(cache=True))
  assert cached['real_buffered'] == 250_000 + row.real_examples
  # A token budget's pipeline buffers per bucket group, and its batches are already the recipe's.
  budget = rehearsal.derive(row, measurements(groups=3, buffer=100, recipe_buffer=100, token_budget=4096))
  assert budget['real_buffered'] == 300 and budget['batch_bytes'] == 0


def test_a_failed_row_is_shown_with_its_line(tmp_path):
  results = {
    'imagenet_deit': {'error': 'main: exit 1: ValueError: no', 'seconds': 1.0, 'date': 'd', 'commit': 'c', 'dirty': ''}
  }
  rehearsal.write(results, str(tmp_path / 'README.md'), tiny=True)
  text = (tmp_path / 'README.md').read_text()
  assert '| imagenet_deit | `configs/vit/imagenet_deit.py:Ti` | 96 | failed: main: exit 1: ValueError: no |' in text
  assert json.loads((tmp_path / 'README.json').read_text()) == results


@pytest.mark.slow
def test_tiny_rehearsal_of_the_deit_recipe_writes_its_row(tmp_path):
  readme = tmp_path / 'README.md'
  command = [sys.executable, '-m', 'experiments.rehearsal.run', '--tiny', '--rows', 'imagenet_deit']
  done = subprocess.run(
    [*command, '--scratch', str(tmp_path), '--readme', str(readme)],
    cwd=rehearsal.common.ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  m = json.loads((tmp_path / 'README.json').read_text())['imagenet_deit']
  assert 'error' not in m, m['error']
  # The recipe's input settings (3 repeated copies), the batch here: 2 batches of 6 from the 24-image stand-in.
  assert (m['n'], m['repeats'], m['batch'], m['recipe_batch'], m['recipe_buffer']) == (24, 3, 6, 1152, 250_000)
  assert m['main']['batches'] == 2 and m['main']['examples'] == 12 and m['small']['buffer'] == 6
  assert (m['resume']['step'], m['resume']['skipped']) == rehearsal.mid_epoch_step(24 * 3, 6)
  assert len(m['resume']['first_0']) == len(m['resume']['first_mid']) == 1
  assert m['limit_what'] == 'decode' and m['limit'] > 0  # The host limit: the stand-in's JPEGs decoded alone.
  lines = readme.read_text().splitlines()
  assert '**Made with --tiny: the numbers mean nothing.**' in lines
  assert (
    sum(line.startswith('| imagenet_deit | `configs/vit/imagenet_deit.py:Ti` | 6 (1152) | 2 (12) |') for line in lines)
    == 1
  )


def test_the_readme_option_never_overwrites_a_file_it_did_not_write(tmp_path):
  """--readme PATH of a file this script did not write (no PATH's .json beside it) is refused, and --tiny without
  --readme too (its numbers would replace the committed table); nothing is written."""
  notes = tmp_path / 'notes.md'
  notes.write_text('mine\n')
  command = [sys.executable, '-m', 'experiments.rehearsal.run', '--scratch', str(tmp_path), '--rows', 'imagenet_deit']
  for extra, message in (
    (['--readme', str(notes)], f'--readme {notes}: the file exists and this script did not write it; give a new path'),
    (['--tiny'], '--tiny: its numbers mean nothing, so it does not write the README: give --readme NEW_PATH'),
  ):
    done = subprocess.run([*command, *extra], cwd=rehearsal.common.ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [message]
  assert notes.read_text() == 'mine\n' and sorted(os.listdir(tmp_path)) == ['notes.md']
