"""The HMDLM paper's 6M MGDM Sudoku baseline (Table 6): configs/sudoku_6m.py's GPT-2, MGDM's loss.

Expected: not measured in this repository (100k steps need an accelerator; docs/results/sudoku.md).

3 layers, width 384, 12 heads, GELU MLP 1536, learned positions, tied head, bidirectional attention
(MGDM's `model_config_tiny`), K = 1. Loss as MGDM's Sudoku script (alpha 0.25, gamma 1, linear
time weight, masked-count normalisation; docs/method.md §13.3) on the grid T = 81; decoding its
top-k mask-predict at T = 81 (Table 6: "T = 81 and confidence-based sampling"), 3 sampling seeds.
Data, optimiser and 100k steps as configs/sudoku_6m.py, the HMDLM 6M it is compared with (the
paper states no other MGDM settings; MGDM's own script: batch 1024, lr 1e-3, cosine, no warm-up).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_6m
from hmdlm_jax.configs import sudoku_mgdm


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_6m.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)  # MDLM's schedule (what offsets_max derives for K = 1)
  demo = sudoku_mgdm.get_config()
  c.process.kind = 'mgdm'
  c.process.mgdm = demo.process.mgdm
  for field in ('num_steps', 'ordering', 'remask_noise', 'remask_schedule', 'remask_decoded'):
    c.sample[field] = demo.sample[field]
  return c
