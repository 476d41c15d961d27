"""The ADLM section of the config (`process.adlm.*`, docs/method.md §13.4): its frozen view.

A leaf of hmdlm_jax/config, which re-exports `ADLMConfig` and lists `derived_model_fields` and
`check_section` in its table of process kinds; processes/adlm.py builds the process from it.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hmdlm_jax.config.checks import check_bool
from hmdlm_jax.config.checks import check_int
from hmdlm_jax.config.checks import check_number


@dataclasses.dataclass(frozen=True)
class ADLMSection:
  """`process.adlm`: ADLM (process.kind='adlm'; model.num_levels=1). The model's trunk is the
  anchor network; a denoiser of `denoiser_layers` blocks reads its raw logits (model.denoiser_layers
  is derived from this section)."""
  gamma: float = 3e-3  # γ, weight of the anchor cross-entropy (the authors' OWT/LM1B value)
  tau: int = 5  # anchor rule: a token occurring at most τ times in its row is an anchor
  # γ_k = min(γ, k / R) at optimiser step k: R = gamma_ramp_steps; -1 = train.num_steps (the
  # authors' code); 0 = γ from the first step.
  gamma_ramp_steps: int = -1
  denoiser_layers: int = 0  # blocks of the denoiser; 0 = model.num_layers // 2 (the paper's)


@dataclasses.dataclass(frozen=True)
class ADLMConfig:
  """Static settings of the ADLM process (`process.adlm.*`, docs/method.md §13.4); hashable.

  Attributes:
    gamma: γ >= 0, the anchor term's weight (0: the MDLM loss of the composite network).
    tau: τ >= 1 of the anchor rule (count in the row <= τ).
    ramp_steps: R >= 0 of γ_k = min(γ, k / R), resolved (0 = constant γ).
    t_min, antithetic: t ~ U(t_min, 1), stratified across the batch (loss section).
    mask_id: the resolved MASK id.
  """
  gamma: float = ADLMSection.gamma
  tau: int = ADLMSection.tau
  ramp_steps: int = 0
  t_min: float = 1e-3
  antithetic: bool = True
  mask_id: int = 0

  def __post_init__(self) -> None:
    check_number('process.adlm.gamma', self.gamma, lo=0.0)
    check_int('process.adlm.tau', self.tau, minimum=1)
    check_int('process.adlm.gamma_ramp_steps', self.ramp_steps, minimum=0)
    check_number('loss.t_min', self.t_min, lo=0.0, hi=1.0)
    check_bool('loss.antithetic', self.antithetic)

  @classmethod
  def _view(cls, config: ml_collections.ConfigDict) -> ADLMConfig:
    a = config.process.adlm
    ramp = a.gamma_ramp_steps
    check_int('process.adlm.gamma_ramp_steps', ramp, minimum=-1)
    return cls(gamma=a.gamma, tau=a.tau,
               ramp_steps=int(config.train.num_steps) if ramp == -1 else ramp,
               t_min=float(config.loss.t_min), antithetic=bool(config.loss.antithetic),
               mask_id=int(config.model.mask_id))


def derived_model_fields(config: ml_collections.ConfigDict) -> dict[str, int]:
  """`denoiser_layers`: process.adlm.denoiser_layers, or half the trunk's blocks when 0."""
  n = config.process.adlm.denoiser_layers
  check_int('process.adlm.denoiser_layers', n, minimum=0)
  return {'denoiser_layers': n or max(1, int(config.model.num_layers) // 2)}


def check_section(config: ml_collections.ConfigDict) -> None:
  """Validates `process.adlm` against the resolved model fields (ValueError naming the field)."""
  ADLMConfig._view(config)  # pylint: disable=protected-access
  if config.model.backbone != 'dit':
    raise ValueError(f"process.kind='adlm' builds its denoiser of DiT blocks: set "
                     f"model.backbone='dit' (got {config.model.backbone!r}).")
