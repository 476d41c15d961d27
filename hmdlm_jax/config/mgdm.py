"""The MGDM section of the config (`process.mgdm.*`, docs/method.md §13.3): its frozen view.

A leaf of hmdlm_jax/config, which re-exports `MGDMConfig` and lists `check_section` in its table of
process kinds; processes/mgdm.py builds the process from it. The defaults are those of MGDM's
released Sudoku recipe (docs/method.md §13.3 lists them with the code's bare argument defaults).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hmdlm_jax.config.checks import check_bool as _check_bool
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number

TIME_WEIGHTINGS = ('linear', 'elbo', 'none')
NORMALISATIONS = ('masked', 'positions')


@dataclasses.dataclass(frozen=True)
class MGDMSection:
  """`process.mgdm`: MGDM (process.kind='mgdm'; model.num_levels=1): MDLM's forward process and
  bound, trained by the token-reweighted loss v·w(t)·CE with v = alpha·(1 - p)^gamma. Also the
  process's static view (`MGDMConfig`, hashable), checked when built."""
  token_reweighting: bool = True  # False: v = 1 (the MDLM loss with MGDM's time weight)
  alpha: float = 0.25
  gamma: float = 1.0  # the Sudoku recipe's exponent (Countdown: 2)
  # w(t): 'linear' 1 + T(1 - t) (= T - k on MGDM's grid) | 'elbo' MDLM's -α'/(1-α) | 'none' 1.
  time_weighting: str = 'linear'
  # T: training times on the grid t = (k + 1)/T, k ~ U{0..T-1}; 0 = MDLM's continuous t.
  diffusion_steps: int = 20
  # The loss divides by the batch's masked loss positions ('masked', MGDM) or by all its loss
  # positions ('positions', MDLM's normalisation).
  normalisation: str = 'masked'

  def __post_init__(self) -> None:
    f = 'process.mgdm.'
    _check_bool(f + 'token_reweighting', self.token_reweighting)
    _check_number(f + 'alpha', self.alpha, lo=0.0, lo_open=True)
    _check_number(f + 'gamma', self.gamma, lo=0.0)
    if self.time_weighting not in TIME_WEIGHTINGS:
      raise ValueError(f'{f}time_weighting={self.time_weighting!r} is not one of '
                       f'{TIME_WEIGHTINGS}.')
    _check_int(f + 'diffusion_steps', self.diffusion_steps, minimum=0)
    if self.time_weighting == 'linear' and self.diffusion_steps == 0:
      raise ValueError(f"{f}time_weighting='linear' weighs by T - k on MGDM's grid: set "
                       f'{f}diffusion_steps >= 1 (got 0).')
    if self.normalisation not in NORMALISATIONS:
      raise ValueError(f'{f}normalisation={self.normalisation!r} is not one of '
                       f'{NORMALISATIONS}.')

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> MGDMSection:
    """The section of a resolved `Config` or of an experiment's ConfigDict, checked."""
    g = config.process.mgdm
    if isinstance(g, cls):
      return g
    return cls(**{f.name: g[f.name] for f in dataclasses.fields(cls)})


MGDMConfig = MGDMSection  # the process's view is the section itself (no derived fields)


def check_section(config: ml_collections.ConfigDict) -> None:
  """Validates `process.mgdm` (ValueError naming the field)."""
  MGDMConfig.from_config(config)
