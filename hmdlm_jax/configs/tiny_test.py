"""The smallest Sudoku config, for tests: 2 layers × width 32, batch 8, 4 generated puzzles.

Expected: no meaningful accuracy (it trains for a few steps); a test runs it in seconds.

Tests override fields with `config.train.num_steps = ...` or `--config.train.num_steps=...`; the
puzzle cache goes to `data.cache_dir` (tests point it at a temporary directory).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_base_config()
  c.seed = 0

  m = c.model
  m.backbone = 'dit'
  m.num_levels = 6
  m.vocab_size = 10  # digits 1..9 -> tokens 0..8, MASK = 9 (hmdlm_jax/data/sudoku.py)
  m.mask_id = -1
  m.seq_len = 81
  m.num_layers = 2
  m.hidden_size = 32
  m.num_heads = 2
  m.mlp_dim = 64
  m.cond_dim = 16
  m.dropout = 0.0
  m.position_embedding = 'sudoku'

  c.schedule.kind = 'loglinear'
  c.schedule.offsets_max = 0.5  # δ = (0, .1, .2, .3, .4, .5): level 5 (easiest) revealed first
  c.schedule.offsets = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)

  c.loss.train_steps_T = 81

  d = c.data
  d.kind = 'sudoku'
  d.batch_size = 8
  d.eval_batch_size = 8
  d.num_workers = 0
  # Four fixed puzzles, no symmetries: a memorisable set, so a few dozen steps visibly lower the
  # loss (a 2-layer width-32 model learns nothing general about Sudoku that fast).
  d.augment = False
  d.num_train_puzzles = 4
  d.num_test_puzzles = 8
  d.gen_attempts = 1
  d.gen_processes = 1

  o = c.optim
  o.lr = 2e-2
  o.warmup_steps = 0
  o.decay = 'constant'
  o.grad_clip = 1.0
  o.ema_decay = 0.99
  o.ema_warmup = True

  t = c.train
  t.num_steps = 60
  t.log_every = 1
  t.eval_every = 0
  t.ckpt_every = 10
  t.keep_last = 3
  t.max_bad_steps = 3
  t.final_eval = False

  c.sample.num_steps = 9
  c.sample.ordering = 'confidence'
  c.sample.greedy = True
  c.sample.seeds = (0,)

  c.eval.kind = 'sudoku'
  c.eval.num_examples = 8
  c.eval.use_ema = True
  return c
