"""The paper's 25M Sudoku model (Appendix F.1, docs/method.md §4a): 12-layer DiT, width 384, 6 heads.

Expected: not measured in this repository (100k steps need an accelerator; docs/results/sudoku.md).

Rotary positions, bidirectional attention over the 81 cells, K = 6 (7×384 level table + level
head, ≈104K extra parameters). Sampling: T = 81, confidence ordering, 3 seeds; Table 5 reports
stochastic and greedy decoding (`--config.sample.greedy=True`). `--config.model.num_levels=1` is
the 25M MDLM baseline. The paper trained on Palm's sudoku-hard (180k / 18k / 18k): point
data.train_path / data.test_path at those CSVs; otherwise as many puzzles are generated
(slow: use data.gen_processes). The paper states no Sudoku optimiser settings or batch size; we use
the LM1B ones (docs/method.md §9: AdamW 3e-4, 2,500 warm-up steps, clip 1.0, EMA 0.9999) and batch
256.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_base


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_base.get_config()
  m = c.model
  m.backbone = 'dit'
  m.num_layers = 12
  m.hidden_size = 384
  m.num_heads = 6
  m.mlp_dim = 1536
  m.cond_dim = 128
  m.dropout = 0.1
  m.position_embedding = 'rotary'

  d = c.data
  d.batch_size = 256
  d.eval_batch_size = 500
  d.num_train_puzzles = 180_000
  d.num_test_puzzles = 18_000
  d.gen_processes = 8

  o = c.optim
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.ema_decay = 0.9999
  o.ema_warmup = False

  t = c.train
  t.num_steps = 100_000
  t.time_budget_s = 0.0
  t.log_every = 100
  t.eval_every = 10_000
  t.ckpt_every = 5000
  t.keep_last = 3
  t.keep_period = 25_000

  c.sample.num_steps = 81
  c.sample.ordering = 'confidence'
  c.sample.greedy = False
  c.sample.seeds = (0, 1, 2)
  c.eval.num_examples = 18_000
  return c
