"""Tests of the generative metrics of text samples (hmdlm_jax/evaluation/generative.py).

Reference values are hand-computed (entropy, token-weighted NLL) or a direct log-softmax of a tiny
random GPT-2 saved locally (the scorer).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hmdlm_jax.evaluation import generative as gm


def test_entropy_of_known_sequences():
  tokens = np.array([[0, 0, 1, 1], [0, 1, 2, 3], [5, 5, 5, 5], [7, 7, 7, 8]])
  ent = gm.per_sequence_entropy(tokens)
  np.testing.assert_allclose(ent, [math.log(2), math.log(4), 0.0,
                                   -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))], rtol=1e-12)
  assert gm.sample_entropy(tokens) == pytest.approx(ent.mean(), rel=1e-12)
  assert gm.sample_entropy(tokens[:2], base=2) == pytest.approx(1.5, rel=1e-12)  # (1 + 2) / 2 bits
  valid = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
  ent_v = gm.per_sequence_entropy(tokens, valid)
  assert ent_v[0] == 0.0 and ent_v[1] == pytest.approx(math.log(4)) and math.isnan(ent_v[2])
  rep = gm.entropy_report(tokens, valid)
  assert rep['entropy_num_empty'] == 1 and rep['entropy_num_sequences'] == 3
  assert rep['entropy'] == pytest.approx((0 + math.log(4) + ent[3]) / 3)
  with pytest.raises(ValueError, match='every sequence is empty'):
    gm.sample_entropy(tokens, np.zeros_like(valid))


class _ListScorer:
  name = 'fixed'

  def __init__(self, nlls):
    self.nlls = nlls

  def score(self, texts):
    return [np.asarray(v, np.float64) for v in self.nlls[:len(texts)]]


def test_gen_ppl_token_weighted_and_unavailable_when_weights_absent(tmp_path):
  res = gm.generative_perplexity(['a b c', 'd'], _ListScorer([[1.0, 2.0], [3.0]]))
  assert res['gen_nll_per_token'] == pytest.approx(2.0) and res['gen_ppl'] == pytest.approx(
      math.exp(2.0)) and res['gen_ppl_num_tokens'] == 3
  with pytest.raises(FloatingPointError, match='non-finite NLL in text 1'):
    gm.generative_perplexity(['a', 'b'], _ListScorer([[1.0], [np.nan]]))
  # Nothing scorable (every sample empty): undefined, reported as such.
  empty = gm.gen_ppl_report(['', ''], scorer=_ListScorer([[], []]))
  assert empty['gen_ppl'] is None and 'no token could be scored' in empty[
      'gen_ppl_unavailable_reason']
  # No weights here (and no network): reported unavailable, never a number.
  absent = str(tmp_path / 'no_such_model')
  rep = gm.gen_ppl_report(['some text'], model_name=absent)
  assert rep['gen_ppl'] is None
  assert 'not available locally' in rep['gen_ppl_unavailable_reason']
  assert absent in rep['gen_ppl_unavailable_reason']
  if gm.mauve_unavailable() is not None:
    m = gm.mauve_report(['x'], ['y'])
    assert m['mauve'] is None and 'mauve' in m['mauve_unavailable_reason']


def test_transformers_scorer_matches_manual_nll(tmp_path):
  """A tiny random GPT-2 saved locally: the scorer's NLLs equal a direct log-softmax computation,
  chunking included (max_length 4: a 6-token text is scored as 3 + 1 tokens)."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  tokenizers = pytest.importorskip('tokenizers')
  words = ['<eos>', 'a', 'b', 'c', 'd', 'e', 'f']
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                        unk_token='<eos>'))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token='<eos>',
                                                bos_token='<eos>')
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=len(words), n_positions=16, n_embd=16, n_layer=1, n_head=2,
      bos_token_id=0, eos_token_id=0)).eval()  # eval: no dropout in the manual reference
  path = str(tmp_path / 'tiny_gpt2')
  hf_tok.save_pretrained(path)
  model.save_pretrained(path)
  scorer = gm.TransformersGPT2Scorer(path, max_length=4, batch_size=2)
  texts = ['a b c d e f', 'f e', 'c']
  got = scorer.score(texts)

  def manual(ids):
    with torch.no_grad():
      logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [-float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]

  want = [manual([1, 2, 3, 4]) + manual([5, 6]), manual([6, 5]), []]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  rep = gm.gen_ppl_report(texts, scorer=scorer)
  flat = np.concatenate([np.asarray(w, np.float64) for w in want])
  assert rep['gen_ppl_num_tokens'] == 5
  assert rep['gen_ppl'] == pytest.approx(math.exp(flat.mean()), rel=1e-5)
