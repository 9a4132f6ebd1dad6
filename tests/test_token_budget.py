"""Training batches by a token budget (`data.token_budget`): batches fit the budget and their bucket, each epoch of a
bucket uses its examples once, a resumed stream repeats the uninterrupted one, the device count changes nothing,
a shard's prepared examples are held once and picked by index, SentencePiece tokenises batches as it does one text,
and a run trains."""

import collections

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from conftest import load_config as load
from test_train import read_metrics
from vit_jax_lab import train
from vit_jax_lab.config import ConfigError
from vit_jax_lab.data import builders, pipeline, text
from vit_jax_lab.tasks import seq2seq


@pytest.fixture(scope='module')
def scan_dir(data_dir):
  builders.register('scan/simple')
  tfds.builder('scan/simple', data_dir=data_dir).download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  return data_dir


def scan_config(data_dir, **overrides):
  """SCAN (512 train pairs; inputs up to 20, targets up to 49 tokens: buckets 8, 16, 32, 49) by a budget of 400
  tokens: 50, 25, 12 and 8 rows."""
  return load(
    'configs/seq2seq/scan.py:simple,smoke', data_dir, **dict(data__pack_factor=1, data__token_budget=400) | overrides
  )


def batches(config, num, start=0, devices=None):
  s = train.setup(config, devices or jax.devices()[:1])
  it = train.train_batches(s, start)
  return [jax.device_get(next(it)) for _ in range(num)]


def pairs(batch):
  """Each row's (source, target) tokens without padding."""
  return [(tuple(x[x != 0]), tuple(y[y != 0])) for x, y in zip(batch['inputs'], batch['targets'])]


def test_batches_fit_the_budget_and_their_bucket(scan_dir):
  lengths = [8, 16, 32, 49]
  seen = collections.Counter()
  for b in batches(scan_config(scan_dir), 30):
    rows, length = b['targets'].shape
    assert length in lengths and b['inputs'].shape == (rows, min(length, 20))
    assert rows == 400 // length and rows * length <= 400
    assert (b['inputs'] != 0).sum() <= 400 and (b['targets'] != 0).sum() <= 400
    longest = [max(len(x), len(y)) for x, y in pairs(b)]
    shorter = lengths[lengths.index(length) - 1] if length > 8 else 0
    assert all(shorter < n <= length for n in longest)  # Each pair is in the smallest bucket that holds it.
    seen[length] += 1
  assert set(seen) == set(lengths)
  assert seen[32] > seen[8]  # SCAN has more pairs of 17-32 tokens than of 8 or fewer, for fewer rows.


def test_each_epoch_of_a_bucket_uses_its_examples_once(scan_dir):
  config = scan_config(scan_dir)
  s = train.setup(config, jax.devices()[:1])
  prepared = s.task.prepare(s.info, True)(s.builder.as_dataset(split=config.data.train_split, shuffle_files=False))
  bucket = collections.defaultdict(list)  # Bucket length -> its examples.
  for ex in prepared.as_numpy_iterator():
    pair = (tuple(ex['inputs']), tuple(ex['targets']))
    bucket[next(n for n in (8, 16, 32, 49) if max(map(len, pair)) <= n)].append(pair)
  assert sum(map(len, bucket.values())) == 512 and len(set(p for v in bucket.values() for p in v)) == 512
  stream = collections.defaultdict(list)
  it = train.train_batches(s)
  while any(len(stream[n]) < 2 * len(v) for n, v in bucket.items()):
    b = jax.device_get(next(it))
    stream[b['targets'].shape[1]] += pairs(b)
  for n, examples in bucket.items():
    first, second = stream[n][: len(examples)], stream[n][len(examples) : 2 * len(examples)]
    assert sorted(first) == sorted(examples) and sorted(second) == sorted(examples)  # Each once per epoch.
    assert first != second  # Reshuffled.


@pytest.mark.slow
def test_resumed_stream_equals_the_uninterrupted_one(scan_dir):
  config = scan_config(scan_dir, data__shards=2)  # Two shards on one process: rows 50, 24, 12, 8.
  full = batches(config, 32)
  for start in (7, 25):
    for a, b in zip(batches(config, 32 - start, start), full[start:], strict=True):
      assert a.keys() == b.keys()
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(batches(scan_config(scan_dir, seed=1), 1)[0]['targets'], full[0]['targets'])


@pytest.mark.slow
def test_same_batches_on_1_device_and_8(scan_dir):
  # Buckets 8, 16, 32, 64 by 512 tokens: 64, 32, 16 and 8 rows, multiples of the 8 devices' batch shards too.
  config = scan_config(scan_dir, data__shards=2, data__max_input_length=16, data__max_target_length=64)
  config.data.token_budget = 512
  one, eight = batches(config, 12), batches(config, 12, devices=jax.devices())
  for a, b in zip(one, eight):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert {b['targets'].shape for b in one} == {(64, 8), (32, 16), (16, 32), (8, 64)}


def test_batches_padded_in_numpy_are_the_per_example_pipelines(scan_dir, monkeypatch):
  """Token ids alone (the translation task's preprocess carries .padded_to): Held.padded makes each bucket's batches
  in NumPy, equal to the per-example path's (a stream, the padding preprocess, batch, the bucket's cut), over
  epochs and from a resumed step; inputs cut at 16 pad to 16 where the bucket is longer."""
  config = scan_config(scan_dir, data__shards=2, data__max_input_length=16)
  assert seq2seq.Seq2Seq().preprocess(config.data, train.setup(config, jax.devices()[:1]).info, True).padded_to
  fast, resumed = batches(config, 40), batches(config, 20, start=20)
  padding = seq2seq.Seq2Seq.preprocess

  def per_example(*args, **kwargs):
    fn = padding(*args, **kwargs)
    return lambda example, seed: fn(example, seed)  # Without .padded_to.

  monkeypatch.setattr(seq2seq.Seq2Seq, 'preprocess', per_example)
  slow = batches(config, 40)
  assert {b['inputs'].shape[1] for b in slow} == {8, 16} and len({b['targets'].shape for b in slow}) == 4
  for a, b in zip(fast, slow):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  for a, b in zip(resumed, fast[20:]):
    np.testing.assert_array_equal(a['targets'], b['targets'])


def test_buckets_a_shard_lacks_join_the_next_longer_and_the_schedule_keeps_proportions():
  assert pipeline._groups(np.array([[1, 1, 1], [1, 0, 1]])) == [(0, 0), (1, 2)]
  assert pipeline._groups(np.array([[0, 3, 1, 0], [1, 2, 0, 0]])) == [(0, 2)]  # The longest joins the one before.
  assert pipeline._groups(np.array([[2, 0, 0], [1, 1, 0]])) == [(0, 1)]
  period = pipeline._schedule([6, 3, 1])
  assert np.bincount(period).tolist() == [6, 3, 1] and period[:4].tolist() == [0, 1, 0, 0]
  assert pipeline.Buckets(256, None, None).lengths() == [8, 16, 32, 64, 128, 256]
  assert pipeline.Buckets(49, None, None).lengths() == [8, 16, 32, 49]
  assert pipeline.Buckets(6, None, None).lengths() == [6]


@pytest.mark.slow
def test_a_run_by_token_budget_trains(scan_dir, tmp_path, capsys):
  # Buckets 8 and 16 only: pairs of at most 16 tokens, two compilations of the step.
  config = scan_config(scan_dir, data__max_input_length=16, data__max_target_length=16, total_steps=4)
  metrics = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert np.isfinite(metrics['eval/loss'])
  out = capsys.readouterr().out
  assert 'step 4/4' in out and 'examples/s' not in out  # Batches vary in size.
  losses = [m['train/loss'] for m in read_metrics(str(tmp_path / 'run')) if 'train/loss' in m]
  assert len(losses) == 4 and np.all(np.isfinite(losses))


def test_token_budget_mistakes_are_one_line_errors(scan_dir, smoke_config):
  for config, match in (
    (smoke_config(data__token_budget=1000), 'data.token_budget=1000 batches sequences by their length'),
    (scan_config(scan_dir, data__pack_factor=2), 'data.token_budget=400 and data.pack_factor=2'),
    (scan_config(scan_dir, data__token_budget=40), 'data.token_budget=40 is too small.*use at least 49$'),
  ):
    with pytest.raises(ConfigError, match=match) as e:
      train.setup(config, jax.devices()[:1])
    assert '\n' not in str(e.value)
  with pytest.raises(ConfigError, match='use at least 392'):  # 8 rows on 8 devices.
    train.setup(scan_config(scan_dir, data__token_budget=100), jax.devices())


def test_held_examples_stream_as_permutations_of_the_read_examples_and_resume_anywhere():
  """pipeline.Held: each epoch of a stream is a permutation of the examples it is given (as read: variable-length
  ids, scalars, strings, across read batches), each tagged with e * n + its index in the shard; a stream started at
  an epoch and an offset is the uninterrupted one from there."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(0, 9, 9000)
  examples = [
    {'ids': rng.integers(1, 50, n).astype(np.int32), 'label': np.int32(k), 'name': f'x{k}'.encode()}
    for k, n in enumerate(lengths)
  ]
  ds = tf.data.Dataset.from_generator(
    lambda: ((np.int32(len(e['ids']) // 3), e) for e in examples),
    output_signature=(
      tf.TensorSpec([], tf.int32),
      {
        'ids': tf.TensorSpec([None], tf.int32),
        'label': tf.TensorSpec([], tf.int32),
        'name': tf.TensorSpec([], tf.string),
      },
    ),
  )
  held = pipeline.Held(ds.ragged_batch(1000))
  np.testing.assert_array_equal(held.buckets, lengths // 3)
  mine = np.flatnonzero(held.buckets == 1)
  stream = list(held.stream(mine, (0, 0, 1), 0, 0).take(2 * len(mine) + 7).as_numpy_iterator())
  for epoch in (0, 1):
    part = stream[epoch * len(mine) : (epoch + 1) * len(mine)]
    indices = [index - epoch * 9000 for index, _ in part]
    assert sorted(indices) == list(mine) and indices != list(mine)  # All of them, shuffled.
    for k, ex in zip(indices, (ex for _, ex in part)):
      np.testing.assert_array_equal(ex['ids'], examples[k]['ids'])
      assert ex['label'] == k and ex['name'] == examples[k]['name']
  assert [i for i, _ in stream[: len(mine)]] != [i - 9000 for i, _ in stream[len(mine) : 2 * len(mine)]]
  resumed = list(held.stream(mine, (0, 0, 1), 1, 5).take(len(mine) + 2).as_numpy_iterator())
  assert [i for i, _ in resumed] == [i for i, _ in stream[len(mine) + 5 : 2 * len(mine) + 7]]


def test_sentencepiece_tokenises_a_batch_as_each_text_alone(tmp_path):
  texts = [f'jump {"twice " * (k % 3)}and walk left {k}' for k in range(300)] + ['', 'éà ✓ unseen']
  vocab = text.train_sentencepiece(texts[:200], 40, str(tmp_path / 'sp.model'))
  ragged = text.encoder(vocab)(tf.constant(texts))
  assert ragged.to_list() == [vocab.encode(t) for t in texts]


def test_prepared_batches_hold_the_examples_prepare_gives_one_by_one(scan_dir):
  """The batched form Held reads (no tf.data op per example) keeps and tokenises exactly what the per-example one
  does, lengths filtered alike (max_target_length 20 leaves some of SCAN's pairs out), and buckets by their lengths."""
  config = scan_config(scan_dir, data__max_target_length=20)
  s = train.setup(config, jax.devices()[:1])
  prepare = s.task.prepare(s.info, True)
  raw = s.builder.as_dataset(split='train', shuffle_files=False)
  one_by_one = [(tuple(ex['inputs']), tuple(ex['targets'])) for ex in prepare(raw).as_numpy_iterator()]
  batched = [
    (tuple(x), tuple(y)) for b in prepare.batches(raw) for x, y in zip(b['inputs'].to_list(), b['targets'].to_list())
  ]
  assert batched == one_by_one and 0 < len(one_by_one) < s.builder.info.splits['train'].num_examples
  lengths = s.task.buckets(config.data, s.info).length(next(iter(prepare.batches(raw))))
  assert list(lengths.numpy()[:5]) == [max(len(x), len(y)) for x, y in one_by_one[:5]]
