"""The MDLM baseline twin of configs/lm1b.py: K = 1 (no level table, no hierarchy head), δ = (0,).

Expected: not measured in this repository (no LM1B, no accelerator); compiled for 8 devices its
step needs 16.6 GB per device at batch 512 (docs/results/performance.md).

Everything else (data, model size, optimiser, steps) is identical, so the two runs differ only in
the hierarchy. K = 1 with δ = 0 is MDLM's log-linear schedule exactly (docs/method.md §2); the data carry no
levels (`data.hierarchy = 'none'`: every level 0).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.configs import lm1b


def get_config() -> ml_collections.ConfigDict:
  c = lm1b.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)
  c.data.hierarchy = 'none'
  return c
