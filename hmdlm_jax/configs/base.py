"""The config schema as the ConfigDict every experiment file overrides.

Experiment files (`configs/sudoku.py`, `configs/lm1b.py`, ...) call `get_base_config()` and set
fields; the fields, their meaning and their only defaults are hmdlm_jax/config/schema.py, so an
experiment file never adds a field. `--config.a.b=...` overrides of unknown keys are rejected,
and values are validated once, before anything is written (hmdlm_jax.config.resolve).
"""

from __future__ import annotations

import ml_collections

from hmdlm_jax.config import schema


def get_base_config() -> ml_collections.ConfigDict:
  return schema.defaults()
