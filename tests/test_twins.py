"""Every HMDLM experiment config has an MDLM twin: `--config.model.num_levels=1` (README)."""

import importlib

import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import processes


def _load(name: str, arg: str | None):
  module = importlib.import_module(f'configs.{name}')
  return module.get_config(arg) if arg else module.get_config()


@pytest.mark.parametrize('name,arg,extra', [
    ('sudoku', None, {}), ('sudoku_learned_hierarchy', None, {}), ('lm1b', None, {}),
    ('text', None, {}),
    ('wikihow', '256,position', {'exponents': (1.0,)}),  # power ω: the twin names its one exponent
])
def test_num_levels_one_is_the_mdlm_schedule(name, arg, extra):
  hmdlm = config_lib.resolve(_load(name, arg))
  twin = _load(name, arg)
  twin.model.num_levels = 1
  for field, value in extra.items():
    twin.schedule[field] = value
  twin = config_lib.resolve(twin)
  assert twin.data.hierarchy == 'none'
  processes.build(twin)  # the registry's checks (Appendix D ordering) pass for the twin
  # Level 0 keeps its schedule, and that schedule is MDLM's α(t) = 1 - t up to the eps clip.
  t = np.linspace(0.01, 0.99, 7)
  s_twin = processes.schedules.schedule_from_config(twin.schedule, 1)
  s_hmdlm = processes.schedules.schedule_from_config(hmdlm.schedule, hmdlm.model.num_levels)
  np.testing.assert_allclose(s_twin.alpha(t, np)[:, 0], s_hmdlm.alpha(t, np)[:, 0], rtol=1e-12)
  np.testing.assert_allclose(s_twin.alpha(t, np)[:, 0], 1 - (1 - twin.schedule.eps) * t, rtol=1e-9)
  # pathway.round_tokens is derived from loss.beta_rounds, which K = 1 sets to 0 (no rounds).
  def fields(model):
    flat = config_lib.to_dict(model)
    flat['pathway'].pop('round_tokens')
    flat.pop('num_levels')
    return flat
  assert fields(twin.model) == fields(hmdlm.model)
