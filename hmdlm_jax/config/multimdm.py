"""The MultiMDM section of the config (`process.multimdm.*`, docs/method.md §13.2): its frozen view.

A leaf of hmdlm_jax/config, which re-exports `MultiMDMConfig` and lists `noise_ids` and
`check_section` in its table of process kinds; processes/multimdm.py builds the process from it.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hmdlm_jax.config.checks import check_bool as _check_bool
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number
from hmdlm_jax.config.checks import is_int as _is_int

DISTILL_KL = ('reverse', 'forward')
# The distillation target θ̄ (docs/method.md §13.2): a per-step EMA of the student (Algorithm 3
# read literally) or the student copied at the start of each of R rounds and held (DUO's rounds).
TARGETS = ('ema', 'frozen_rounds')


@dataclasses.dataclass(frozen=True)
class MultiMDMSection:
  """`process.multimdm`: MultiMDM (process.kind='multimdm'; model.num_levels=1). Ids: words 0..V-1,
  masks V..V+M-1 with V = model.vocab_size - num_masks; model.mask_id must be one of the mask
  ids (-1: the last)."""
  num_masks: int = 50  # M (the paper's LM1B/OWT value); M = 1 is MDLM
  designated: str = 'mod'  # m_x = x mod M, or a .npy / .txt file of V ints in [0, M) (e.g. clusters)
  alpha: str = 'linear'  # α_t: 'linear' (1 - t) | 'power' ((1 - t)^p) | 'cosine'
  alpha_power: float = 1.0
  beta: str = 'linear'  # β_t: the same curves or 'alpha_power' (β = α^ρ, ρ = beta_power)
  beta_power: float = 1.0
  # Curriculum: weight of the identification term (3.6) = 0 before curriculum_start, then a linear
  # ramp to 1 over curriculum_steps optimiser steps (0 = full weight from curriculum_start).
  curriculum_start: int = 0
  curriculum_steps: int = 0
  # Consistency distillation (Algorithm 3): the loss becomes (3.11) against the EMA network.
  distill: bool = False
  distill_kl: str = 'reverse'  # 'reverse' KL(f_t || f̄_s) (App. C.2, the paper's runs) | 'forward' (3.11)
  # Step size δ_k = min(delta_init · 2^floor(k / delta_double_every), delta_max) (App. C.2).
  delta_init: float = 2.0 ** -9
  delta_double_every: int = 10_000
  delta_max: float = 2.0 ** -5
  # θ̄: 'ema' (optim.ema_decay per step) | 'frozen_rounds' (the student at each round's start,
  # held for train.num_steps / rounds steps).
  target: str = 'ema'
  rounds: int = 5  # R with target='frozen_rounds' (App. C.2: R = 5); must divide train.num_steps


@dataclasses.dataclass(frozen=True)
class MultiMDMConfig:
  """Static MultiMDM settings (`process.multimdm.*`, docs/method.md §13.2); hashable.

  Attributes:
    num_masks, num_words: M >= 1 and V = vocab_size - M; words are ids 0..V-1, masks V..V+M-1.
    designated: 'mod' (m_x = x mod M) or the path of a file of V classes.
    alpha, alpha_power, beta, beta_power: the schedules (processes/multimdm_math.MaskSchedule).
    curriculum_start, curriculum_steps: ramp of the identification term's weight over steps.
    distill: consistency distillation (Algorithm 3) instead of the pretraining loss (3.6).
    distill_kl: 'reverse' (App. C.2) | 'forward' ((3.11)).
    delta_init, delta_double_every, delta_max: the step-size schedule δ_k.
    target, rounds: θ̄ = 'ema' | 'frozen_rounds' (R rounds); steps_per_round: num_steps / R
      (0 unless a distillation with target='frozen_rounds').
    t_min, antithetic: t ~ U(t_min, 1), stratified (loss.t_min, loss.antithetic).
  """
  num_masks: int
  num_words: int
  designated: str = MultiMDMSection.designated
  alpha: str = MultiMDMSection.alpha
  alpha_power: float = MultiMDMSection.alpha_power
  beta: str = MultiMDMSection.beta
  beta_power: float = MultiMDMSection.beta_power
  curriculum_start: int = MultiMDMSection.curriculum_start
  curriculum_steps: int = MultiMDMSection.curriculum_steps
  distill: bool = MultiMDMSection.distill
  distill_kl: str = MultiMDMSection.distill_kl
  delta_init: float = MultiMDMSection.delta_init
  delta_double_every: int = MultiMDMSection.delta_double_every
  delta_max: float = MultiMDMSection.delta_max
  target: str = MultiMDMSection.target
  rounds: int = MultiMDMSection.rounds
  steps_per_round: int = 0
  t_min: float = 1e-3
  antithetic: bool = True

  def __post_init__(self) -> None:
    f = 'process.multimdm.'
    _check_int(f + 'num_masks', self.num_masks, minimum=1)
    if not _is_int(self.num_words) or self.num_words < 1:
      raise ValueError(f'model.vocab_size must count the words AND the {self.num_masks} masks '
                       f'(process.multimdm.num_masks): it leaves {self.num_words} words.')
    if not isinstance(self.designated, str) or not self.designated:
      raise ValueError(f"{f}designated={self.designated!r} must be 'mod' or a file path.")
    for name in ('alpha_power', 'beta_power'):
      _check_number(f + name, getattr(self, name), lo=0.0, lo_open=True)
    _check_int(f + 'curriculum_start', self.curriculum_start, minimum=0)
    _check_int(f + 'curriculum_steps', self.curriculum_steps, minimum=0)
    _check_bool(f + 'distill', self.distill)
    if self.distill_kl not in DISTILL_KL:
      raise ValueError(f'{f}distill_kl={self.distill_kl!r} is not one of {DISTILL_KL}.')
    _check_number(f + 'delta_init', self.delta_init, lo=0.0, hi=1.0, lo_open=True, hi_open=False)
    _check_number(f + 'delta_max', self.delta_max, lo=self.delta_init, hi=1.0, hi_open=False)
    _check_int(f + 'delta_double_every', self.delta_double_every, minimum=1)
    _check_number('loss.t_min', self.t_min, lo=0.0, hi=1.0)
    if self.target not in TARGETS:
      raise ValueError(f'{f}target={self.target!r} is not one of {TARGETS}.')
    _check_int(f + 'rounds', self.rounds, minimum=1)
    _check_int(f + 'steps_per_round', self.steps_per_round, minimum=0)

  @classmethod
  def _view(cls, config: ml_collections.ConfigDict) -> MultiMDMConfig:
    mm = config.process.multimdm
    num_masks = mm.num_masks
    _check_int('process.multimdm.num_masks', num_masks, minimum=1)
    return cls(target=mm.target, rounds=mm.rounds, steps_per_round=steps_per_round(config),
               num_masks=num_masks, num_words=int(config.model.vocab_size) - num_masks,
               designated=mm.designated, alpha=mm.alpha, alpha_power=mm.alpha_power,
               beta=mm.beta, beta_power=mm.beta_power, curriculum_start=mm.curriculum_start,
               curriculum_steps=mm.curriculum_steps, distill=mm.distill,
               distill_kl=mm.distill_kl, delta_init=mm.delta_init,
               delta_double_every=mm.delta_double_every, delta_max=mm.delta_max,
               t_min=float(config.loss.t_min), antithetic=bool(config.loss.antithetic))


def steps_per_round(config: ml_collections.ConfigDict) -> int:
  """MultiMDM's optimiser steps per frozen-target round: train.num_steps / process.multimdm.rounds
  for a distillation with target='frozen_rounds', else 0 (the EMA target; docs/method.md §13.2).
  A run of any process reads `config.steps_per_round` (config/kinds.py), which calls this."""
  mm = config.process.multimdm
  if mm.target != 'frozen_rounds':
    return 0
  f = 'process.multimdm.'
  if mm.distill is not True:
    raise ValueError(f"{f}target='frozen_rounds' is the target of a distillation: set "
                     f"{f}distill=True, or leave {f}target='ema'.")
  _check_int(f + 'rounds', mm.rounds, minimum=1)
  num_steps = int(config.train.num_steps)
  if num_steps % mm.rounds:
    raise ValueError(f'{f}rounds={mm.rounds} must divide train.num_steps={num_steps}: every '
                     f'round holds its target for the same number of steps (e.g. rounds='
                     f'{_divisor_near(num_steps, mm.rounds)}).')
  return num_steps // mm.rounds


def _divisor_near(n: int, r: int) -> int:
  """The divisor of n closest to r (the suggestion in the rounds error)."""
  return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - r), d))


def noise_ids(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The M masks: the last M rows of the token table, after the words."""
  vocab, m = int(config.model.vocab_size), int(config.process.multimdm.num_masks)
  return tuple(range(vocab - m, vocab))


def check_section(config: ml_collections.ConfigDict) -> None:
  """Validates `process.multimdm` against the resolved model and data fields."""
  mm = MultiMDMConfig._view(config)
  if not mm.num_words <= config.model.mask_id < config.model.vocab_size:
    raise ValueError(f'model.mask_id={config.model.mask_id} must be one of the MultiMDM mask ids '
                     f'{mm.num_words}..{config.model.vocab_size - 1} (-1 = the last one).')
  # Data with a tokenizer (the text tasks) takes its words from it: the masks go after them.
  if config.data.tokenizer and config.data.mask_token != 'append':
    raise ValueError(f"process.kind='multimdm' appends its {mm.num_masks} masks after the "
                     f"tokenizer's words: set data.mask_token='append' (got "
                     f'{config.data.mask_token!r}).')
