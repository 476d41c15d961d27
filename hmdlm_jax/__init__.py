"""Hierarchical masked diffusion language models in JAX: `hmdlm_jax.load(DIR)` uses a trained run
from Python (hmdlm_jax/trained.py); `python -m hmdlm_jax.main` trains, evaluates and samples."""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
  # `load` is imported on first use (PEP 562), not with the package: `python -m hmdlm_jax.main`
  # sets up its allocator before JAX is imported (hmdlm_jax/runtime.py).
  if name == 'load':
    return importlib.import_module('hmdlm_jax.trained').load
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
