"""MGDM on the Sudoku demo: configs/sudoku_mdlm.py's model, data, optimiser and 1,200 steps.

  python -m hmdlm_jax.main --config=configs/sudoku_mgdm.py --workdir=/tmp/mgdm_sudoku

Expected: not measured with MGDM's own decoding (re-predicting decoded cells, the setting here);
with decoded cells carried over (`--config.sample.remask_decoded=carry`) about 54-59% solved
greedy, 17-21% stochastic (docs/results/baselines.md: 1,091 and 1,450 steps, 3 seeds).

MGDM (Ye et al., ICLR 2025; docs/method.md §13.3) is MDLM trained with a focal token weight
v = 0.25 (1 - p)^1 and the linear time weight T - k on the grid t = (k + 1)/T, normalised by the
masked cells; its bound is MDLM's. Decoding: its top-k mask-predict ('remask'), T = 81 (the HMDLM
paper's Sudoku T, also MGDM's training grid here; its script uses 20), Gumbel noise 0.5·k/T on the
confidences for stochastic decoding, none for greedy. Givens are never masked (this repository's
Sudoku layout); one network call per step, as MDLM.
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import sudoku_mdlm

T = 81


def get_config() -> ml_collections.ConfigDict:
  c = sudoku_mdlm.get_config()
  c.process.kind = 'mgdm'
  g = c.process.mgdm
  g.token_reweighting = True  # MGDM's Sudoku script: alpha 0.25, gamma 1, linear time weight
  g.alpha = 0.25
  g.gamma = 1.0
  g.time_weighting = 'linear'
  g.diffusion_steps = T
  g.normalisation = 'masked'
  sm = c.sample
  sm.num_steps = T
  sm.ordering = 'remask'
  sm.remask_noise = 0.5  # 'stochastic0.5-linear', the script's decoding
  sm.remask_schedule = 'linear'
  sm.remask_decoded = 'repredict'  # the code re-reads every non-given cell (docs/method.md §13.3)
  return c
