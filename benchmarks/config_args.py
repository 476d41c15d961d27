"""The tools' config arguments: `--config=configs/X.py` and `--set section.field=value`.

Shared by scripts/probe_levels.py, scripts/step_cost.py, scripts/twin_budget.py and
benchmarks/profile.py, so that one config file plus overrides names the same setting in all of
them (and in hmdlm_jax.main, whose `--config.section.field=value` they mirror). It lives in
benchmarks/ because scripts/ import benchmarks/, never the other way.
"""

from __future__ import annotations

import ast
import importlib
import os
from typing import Any, Iterable

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
DEFAULT_CONFIG = 'configs/sudoku.py'


def load_config(path: str) -> Any:
  """get_config() of a configs/*.py file given as its path (as `--config=` of hmdlm_jax.main)."""
  directory, name = os.path.split(os.path.normpath(path))
  if directory != 'configs' or not name.endswith('.py') or not os.path.isfile(
      os.path.join(_REPO, path)):
    raise SystemExit(f'--config={path!r}: give a file of the repository\'s configs/ folder, '
                     f'e.g. --config={DEFAULT_CONFIG}')
  return importlib.import_module(f'configs.{name[:-3]}').get_config()


def override(config: Any, items: Iterable[str]) -> Any:
  """Apply `section.field=value` overrides in place (values parsed as Python literals where they
  parse, else kept as strings) and return the config. A malformed item, or a field that
  configs/base.py does not list (a typo would otherwise add a field nothing reads), exits with one
  line naming it."""
  for item in items:
    key, _, value = item.partition('=')
    parts = key.split('.')
    if not _ or len(parts) != 2:
      raise SystemExit(f'--set {item!r}: give section.field=value, e.g. --set '
                       'optim.hier_lr_scale=3.0')
    section, field = parts
    if section not in config or field not in config[section]:
      raise SystemExit(f'--set {item!r}: {key} is not a config field (every field is listed in '
                       'configs/base.py)')
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    config[section][field] = value
  return config
