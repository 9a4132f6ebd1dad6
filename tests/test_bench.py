"""The benchmark command measures what it says, on any config, and rejects bad arguments in one line."""

import json
import os
import subprocess
import sys

import pytest

import conftest
from vit_jax_lab.tools import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, 'configs/vit/digits.py:smoke')
SCAN_SMOKE = os.path.join(ROOT, 'configs/seq2seq/scan.py:simple,smoke')


@pytest.mark.slow
def test_bench_reports_a_real_and_a_synthetic_config(data_dir, tmp_path, capsys):
  out = tmp_path / 'bench.json'
  smoke = ['--config', SMOKE, f'--config.data.data_dir={data_dir}']
  code = bench.main(
    [
      '--steps',
      '3',
      '--warmup',
      '1',
      '--input_batches',
      '4',
      '--out',
      str(out),
      *smoke,
      f'--config={SMOKE}',
      f'--config.data.data_dir={data_dir}',
      '--config.data.batch_size=64',
    ]
  )
  assert code == 0
  first, second = json.loads(out.read_text())
  assert (first['batch'], second['batch']) == (32, 64) and first['input_shape'] == [8, 8, 1]
  for r in (first, second):
    assert r['compile_s'] > 0 and 0 < r['step_s_min'] <= r['step_s_median'] <= r['step_s_max']
    assert r['examples_per_s'] == pytest.approx(r['batch'] / r['step_s_median'])
    assert r['input_examples_per_s'] > 0 and r['step_tflop'] > 0 and r['peak_memory_gib'] > 0
    assert r['mfu'] == pytest.approx(r['achieved_tflops'] / r['peak_tflops'])
    assert 'float32 2048^3 matmul measured now' in r['peak_source']
  assert second['step_tflop'] == pytest.approx(2 * first['step_tflop'], rel=0.1)  # Twice the batch.
  assert '| config | model |' in capsys.readouterr().out

  # Compile only; a scanned model's FLOPs are those of its unscanned twin (XLA counts a loop body once).
  code = bench.main(
    ['--steps', '0', '--synthetic', '16,16,3,100', '--out', str(out), *smoke, *smoke, '--config.model.scan=true']
  )
  plain, scanned = json.loads(out.read_text())
  assert code == 0 and plain['compile_s'] > 0 and plain['peak_memory_gib'] > 0 and 'step_s_median' not in plain
  assert plain['input_shape'] == [16, 16, 3] and plain['input_examples_per_s'] is None
  assert scanned['step_tflop'] == pytest.approx(plain['step_tflop'], rel=0.02)


@pytest.mark.slow
def test_bench_times_a_seq2seq_config_on_random_tokens(tmp_path):
  out = tmp_path / 'bench.json'
  assert (
    bench.main(
      [
        '--steps',
        '0',
        '--synthetic',
        '12,50',
        '--out',
        str(out),
        '--config',
        SCAN_SMOKE,
        '--config',
        SCAN_SMOKE,
        '--config.data.batch_size=64',
      ]
    )
    == 0
  )
  first, second = json.loads(out.read_text())
  assert first['input_shape'] == [12] and first['input_examples_per_s'] is None and first['compile_s'] > 0
  assert second['step_tflop'] == pytest.approx(2 * first['step_tflop'], rel=0.1)  # Twice the batch.


@pytest.mark.parametrize(
  'argv, message',
  [
    (['--config.seed=1'], 'give --config PATH before its overrides'),
    ([], 'give at least one --config'),
    (['--config', SMOKE, '--synthetic', '16,16'], 'expected H,W,C,CLASSES'),
    (['--config', SCAN_SMOKE, '--synthetic', '16,16,3,100'], 'expected LENGTH,VOCAB'),
    (['--config', SMOKE, '--config.model.widht=3'], "unknown config key 'model.widht'"),
    (['--steps', '-1', '--config', SMOKE], '--steps and --warmup must be >= 0'),
  ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
  assert bench.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and message in err and err.count('\n') == 1


def test_without_xla_counts_the_step_flops_are_its_matmuls(smoke_config, monkeypatch):
  """XLA:GPU counts nothing before compiling: there the step's FLOPs are its matmuls, forward and backward, a
  little below XLA's count on CPU, which adds the elementwise work; scanned layers count as many times as they run."""
  import jax

  counts = {}
  for scan in (False, True):
    config = smoke_config(model__scan=scan)
    s, batch = bench.synthetic_setup(config, '16,16,3,10')
    counts['xla', scan] = bench.step_flops(s, config, batch)
    with monkeypatch.context() as m:
      m.setattr(jax.stages.Lowered, 'cost_analysis', lambda self: None)
      counts['matmuls', scan] = bench.step_flops(s, config, batch)
  assert 0.8 * counts['xla', False] < counts['matmuls', False] < counts['xla', False]
  assert counts['matmuls', True] == counts['matmuls', False] and counts['xla', True] == counts['xla', False]


@pytest.mark.slow
def test_a_step_on_synthetic_input_and_every_family_need_no_tensorflow(tmp_path):
  script = """
import sys
from vit_jax_lab import config as config_lib, train
from vit_jax_lab.data import info
from vit_jax_lab.tools import bench
assert bench.main(['--steps', '1', '--warmup', '0', '--config', 'configs/vit/digits.py:smoke',
                   '--synthetic', '16,16,3,10']) == 0
for spec, shape in [('configs/vivit/moving_digits.py:factorised_encoder,smoke', '4,16,16,1,5'),
                    ('configs/seq2seq/scan.py:simple,smoke', '12,40'), ('configs/lra/listops.py:smoke', '32,20,10')]:
  config = config_lib.load(spec)
  s, batch = bench.synthetic_setup(config, shape)
  state, metrics = train.make_train_step(s)(train.init_state(s), batch)
  assert float(metrics['loss']) > 0, spec
config = config_lib.load('configs/tracking/digits.py:mlp,smoke')
d = config.data
geometry = info.TrackingInfo(1, 6, (48, 48), 8, 8, d.template_size, d.search_size, 2.0, 4.0)
train.init_state(train.setup(config, data=(None, geometry)))
loaded = [m for m in ('tensorflow', 'tensorflow_datasets', 'clu') if m in sys.modules]
assert not loaded, loaded
print('no tensorflow')
"""
  done = subprocess.run(
    [sys.executable, '-c', script], cwd=ROOT, env=conftest.without_packages(tmp_path), capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith('no tensorflow') and '| vit |' not in done.stderr


def test_the_package_refusal_itself_works(tmp_path):
  """The check above could pass vacuously if the refusal did nothing: an import of TensorFlow must fail under it."""
  done = subprocess.run(
    [sys.executable, '-c', 'import tensorflow'], env=conftest.without_packages(tmp_path), capture_output=True, text=True
  )
  assert done.returncode != 0 and 'made unimportable by the test' in done.stderr
