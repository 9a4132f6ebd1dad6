"""Two local processes x 4 CPU devices train like one process x 8 devices (same losses)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from vit_jax_lab import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = [json.loads(line) for line in f]
  return {m['step']: m['train/loss'] for m in lines if 'train/loss' in m}, [m for m in lines if 'eval/accuracy' in m]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one_process(smoke_config, data_dir, tmp_path):
  # data.shards=2 fixes how the split is cut, so one process reads both shards, two processes one each.
  config = smoke_config(data__shards=2)
  single = str(tmp_path / 'single')
  train.train_and_evaluate(config, single)

  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  multi = str(tmp_path / 'multi')
  env = os.environ | {'JAX_NUM_CPU_DEVICES': '4', 'JAX_PLATFORMS': 'cpu'}
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        '-m',
        'main',
        '--config',
        'configs/vit/digits.py:smoke',
        '--workdir',
        multi,
        f'--config.data.data_dir={data_dir}',
        '--config.data.shards=2',
        f'--config.distributed.coordinator_address=127.0.0.1:{port}',
        '--config.distributed.num_processes=2',
        f'--config.distributed.process_id={i}',
      ],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  assert "mesh {'data': 8, 'fsdp': 1, 'model': 1}" in outputs[0]

  single_losses, single_evals = losses(single)
  multi_losses, multi_evals = losses(multi)
  assert sorted(multi_losses) == list(range(1, 7))
  np.testing.assert_allclose(
    [multi_losses[k] for k in sorted(multi_losses)], [single_losses[k] for k in sorted(single_losses)], rtol=1e-5
  )
  assert [e['eval/examples'] for e in multi_evals] == [360.0, 360.0]
  np.testing.assert_allclose([e['eval/accuracy'] for e in multi_evals], [e['eval/accuracy'] for e in single_evals])
