"""MDLM twin of configs/sudoku_base.py: one level (K = 1) and the plain log-linear schedule δ = (0,).

Expected: 60.3 ± 2.3% solved greedy, cell accuracy 82.7 ± 0.7% (200 generated test puzzles,
T = 81, 3 seeds, as scripts/few_step.py runs it; docs/results/multimdm.md).

Everything else (model, data, optimiser, sampling) is identical, so the two runs compare HMDLM
with MDLM at equal budget. The same twin of any config is `--config.model.num_levels=1`:
`schedule.offsets_max` re-derives δ = (0,) from K (hmdlm_jax/train.py `resolve_config`), and the
training loop feeds level 0 everywhere (the Sudoku levels are dropped for K = 1).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_base


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_base.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)  # what offsets_max derives for K = 1 (docs/method.md §2: MDLM)
  return c
