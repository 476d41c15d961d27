"""The run record in a workdir: the resolved config as config.json / config.yaml (process 0)."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections


def config_to_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """JSON-ready nested dict (tuples become lists)."""
  return json.loads(config.to_json_best_effort())


def write_config(config: ml_collections.ConfigDict, workdir: str, name: str = 'config') -> None:
  """DIR/<name>.json (and DIR/<name>.yaml when PyYAML is installed); process 0 only.

  Training writes config.json; eval/sample runs write config_<mode>.json so that their overrides
  never overwrite the record of how the checkpoints were trained.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir={workdir!r} exists and is not a directory.')
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  d = config_to_dict(config)
  with open(os.path.join(workdir, f'{name}.json'), 'w', encoding='utf-8') as f:
    json.dump(d, f, indent=2, sort_keys=True)
  try:
    import yaml  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  with open(os.path.join(workdir, f'{name}.yaml'), 'w', encoding='utf-8') as f:
    yaml.safe_dump(d, f, sort_keys=True)
