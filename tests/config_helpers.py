"""Resolving experiment configs in tests: what the entry point does once per run."""

from __future__ import annotations

from typing import Any

from hmdlm_jax import config as config_lib


def resolved(config: Any, **changes: Any) -> config_lib.Config:
  """`config_lib.resolve` of a ConfigDict after dotted `changes` (e.g. `**{'train.num_steps':
  2}`); an already resolved Config gets the changes without re-deriving."""
  if isinstance(config, config_lib.Config):
    return config.replace(**changes)
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for dotted, value in changes.items():
      *path, name = dotted.split('.')
      node = config
      for part in path:
        node = node[part]
      node[name] = value
  return config_lib.resolve(config)
