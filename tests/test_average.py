"""Checkpoint averaging (vit_jax_lab.tools.average): the mean of a run's last checkpoints, as a run of its own."""

import os

import jax
import numpy as np
import pytest

from vit_jax_lab import checkpoints, train
from vit_jax_lab.tools import average


def checkpoint_params(config, workdir, step):
  s = train.setup(config)
  ckpt = checkpoints.Checkpointer(workdir, every=1, keep=100)
  state = ckpt.restore(step, checkpoints.abstract(s.abstract_state, s.state_shardings))
  ckpt.close()
  return state, jax.device_get((state.params.to_pure_dict(), state.ema.to_pure_dict()))


@pytest.mark.slow
def test_average_is_the_mean_of_the_last_checkpoints_and_a_run_of_its_own(smoke_config, tmp_path, capsys):
  config = smoke_config(total_steps=3, checkpoint_every=1, keep=10, eval_every=3, ema_decay=0.5)
  run = str(tmp_path / 'run')
  train.train_and_evaluate(config, run)
  saved = [checkpoint_params(config, run, step)[1] for step in (1, 2, 3)]

  metrics = average.average(run, 2, str(tmp_path / 'avg2'))
  assert metrics['eval/examples'] == 360 and 0 <= metrics['eval/accuracy'] <= 1
  state, (params, ema) = checkpoint_params(config, str(tmp_path / 'avg2'), 3)
  jax.tree.map(
    lambda a, b, c: np.testing.assert_allclose(a, (b + c) / 2, rtol=1e-6, atol=1e-7), params, *[p for p, _ in saved[1:]]
  )
  jax.tree.map(
    lambda a, b, c: np.testing.assert_allclose(a, (b + c) / 2, rtol=1e-6, atol=1e-7), ema, *[e for _, e in saved[1:]]
  )
  # What evaluation, export and init_from read is the averaged parameter average.
  jax.tree.map(np.testing.assert_array_equal, checkpoints.read_params(str(tmp_path / 'avg2')), ema)
  # The new workdir is a complete run of the same config.
  train.train_and_evaluate(config, str(tmp_path / 'avg2'))
  assert 'the run is complete' in capsys.readouterr().out

  # Equal checkpoints average to exactly that checkpoint.
  ckpt = checkpoints.Checkpointer(run, every=1, keep=10)
  for step in (4, 5, 6):
    ckpt.save(step, state, force=True)
  ckpt.close()
  average.average(run, 3, str(tmp_path / 'avg3'), evaluate=False)
  _, same = checkpoint_params(config, str(tmp_path / 'avg3'), 6)
  jax.tree.map(np.testing.assert_array_equal, same, (params, ema))


@pytest.mark.slow
def test_average_mistakes_are_one_line(smoke_config, tmp_path, capsys):
  run = str(tmp_path / 'run')
  train.train_and_evaluate(smoke_config(total_steps=2, checkpoint_every=1, eval_every=2), run)
  capsys.readouterr()
  assert average.main(['--workdir', run, '--last', '3']) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'has 2 checkpoint(s) (steps 1, 2), fewer than --last 3' in err
  assert average.main(['--workdir', run, '--last', '1', '--out', run]) == 2
  assert 'exists: name a new file or folder' in capsys.readouterr().err
  assert average.main(['--workdir', str(tmp_path / 'nothing')]) == 2
  assert 'has no config.json' in capsys.readouterr().err
  data = os.path.join(run, 'checkpoints', '2', 'state', 'ocdbt.process_0', 'd')
  for name in os.listdir(data):  # The newest checkpoint damaged, as a crash or a full disk leaves it.
    with open(os.path.join(data, name), 'r+b') as f:
      f.truncate(10)
  assert average.main(['--workdir', run, '--last', '2', '--no_eval']) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith(f'error: checkpoint 2 of {run} does not read whole (')
  assert sorted(os.listdir(tmp_path)) == ['run']
