"""Hierarchical masked diffusion language models in JAX: `hmdlm_jax.load(DIR)` uses a trained run
from Python (hmdlm_jax/trained.py); `python -m hmdlm_jax.main` trains, evaluates and samples."""


def __getattr__(name: str):
  # Imported on first use: `python -m hmdlm_jax.main` sets up its allocator before JAX is imported.
  if name == 'load':
    from hmdlm_jax.trained import load  # pylint: disable=g-import-not-at-top
    return load
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
