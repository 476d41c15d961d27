"""The static views of a resolved config that the jitted code takes (hashable frozen dataclasses).

`LossConfig` (docs/method.md §5) and `SampleConfig` (§7, §10) gather what the loss and the sampler
read from several sections; `hdlm_config` is HDLM's (§13.1). Each is built from a resolved
`Config` by `from_config`; their defaults are the schema's. No JAX here.
"""

from __future__ import annotations

import dataclasses

from hmdlm_jax.config import schema
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number
from hmdlm_jax.config.hdlm import HDLMConfig

VARIANTS = schema.VARIANTS
ORDERINGS = ('ancestral', 'confidence', 'remask', 'remdm')
REMASK_SCHEDULES = ('linear', 'cosine')
NUCLEUS_RULES = ('inclusive', 'exclusive')
REMASK_DECODED = ('carry', 'repredict')
REMDM_SCHEDULES = ('loop', 'cap', 'rescale')
LEVEL_CONTEXTS = ('candidates', 'none')
HIER_OBJECTIVES = ('bound', 'cross_entropy')
TOKEN_ROWS = ('auto', 'all', 'selected')
_LOSS = schema.LossSection
_SAMPLE = schema.SampleSection
_MODEL = schema.ModelConfig


def _typed(config: object, what: str) -> schema.Config:
  if not isinstance(config, schema.Config):
    raise ValueError(f'{what} needs the resolved config (hmdlm_jax.config.resolve of the '
                     f'experiment), got {type(config).__name__}.')
  return config


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static loss settings of HMDLM (docs/method.md §5); hashable.

  Attributes:
    beta_hier, beta_cons: weights of L_hier and L_cons (1, 1 = tied weights = the bound).
    t_min: t ~ U(t_min, 1).
    antithetic: stratified times across the batch (MDLM's default).
    train_steps_T: T_train of Algorithm 1 line 15, s = max(t - 1/T_train, 0).
    variant: 'two_pass' (paper) | 'single_pass' (docs/method.md §4).
    prior_corrected: prior-corrected hierarchy head (docs/method.md §4).
    mask_id: MASK token id (resolved, >= 0).
    num_levels: K.
    hier_objective: what trains the hierarchy head: 'bound' (β_hier L_hier + β_cons L_cons) or
      'cross_entropy' (β_hier × mean −log g[h0] over masked loss positions; docs/method.md §5.1).
    given_state: given positions enter the network as h_g = K+1 (model.given_state).
    beta_rounds: weight of the per-round token loss L_rounds (training only, never in the bound;
      0 = off; needs model.pathway.readout='rounds', which derives model.pathway.round_tokens;
      docs/method.md §5.1).
    token_rows: where the training loss evaluates the token head: 'all' positions (dense logits,
      then the masked ones are read) or only the 'selected' ones (masked loss positions;
      models/token_head.py: same values, about half the head's cost, one device only); 'auto'
      is resolved by the train step (`Process.for_devices`): 'selected' on one device, else
      'all'; a loss called outside a train step reads 'auto' as 'all'.
  """
  beta_hier: float = _LOSS.beta_hier
  beta_cons: float = _LOSS.beta_cons
  t_min: float = _LOSS.t_min
  antithetic: bool = _LOSS.antithetic
  train_steps_T: int = 1000
  variant: str = _MODEL.variant
  prior_corrected: bool = _MODEL.prior_corrected_head
  mask_id: int = 0
  num_levels: int = _MODEL.num_levels
  hier_objective: str = _LOSS.hier_objective
  given_state: bool = _MODEL.given_state
  beta_rounds: float = _LOSS.beta_rounds
  token_rows: str = _LOSS.token_rows

  def __post_init__(self) -> None:
    for name in ('beta_hier', 'beta_cons', 'beta_rounds'):
      _check_number(f'loss.{name}', getattr(self, name), lo=0.0)
    _check_number('loss.t_min', self.t_min, lo=0.0, hi=1.0)
    if int(self.train_steps_T) != self.train_steps_T or self.train_steps_T < 1:
      raise ValueError(f'loss.train_steps_T={self.train_steps_T} must be an integer >= 1.')
    if self.variant not in VARIANTS:
      raise ValueError(f'model.variant={self.variant!r} is not one of {VARIANTS}.')
    if self.mask_id < 0:
      raise ValueError(f'mask_id={self.mask_id} must be resolved to a token id >= 0.')
    if self.num_levels < 1:
      raise ValueError(f'model.num_levels={self.num_levels} must be >= 1.')
    if self.hier_objective not in HIER_OBJECTIVES:
      raise ValueError(f'loss.hier_objective={self.hier_objective!r} is not one of '
                       f'{HIER_OBJECTIVES}.')
    if self.token_rows not in TOKEN_ROWS:
      raise ValueError(f'loss.token_rows={self.token_rows!r} is not one of {TOKEN_ROWS}.')

  @classmethod
  def from_config(cls, config: schema.Config) -> LossConfig:
    """The view of a resolved config (its `loss` and `model` sections)."""
    config = _typed(config, 'LossConfig.from_config')
    m, l = config.model, config.loss
    return cls(beta_hier=float(l.beta_hier), beta_cons=float(l.beta_cons), t_min=float(l.t_min),
               antithetic=bool(l.antithetic), train_steps_T=int(l.train_steps_T),
               variant=str(m.variant), prior_corrected=bool(m.prior_corrected_head),
               mask_id=int(m.mask_id), num_levels=int(m.num_levels),
               hier_objective=l.hier_objective, given_state=m.given_state,
               beta_rounds=l.beta_rounds, token_rows=l.token_rows)


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """Static sampler settings (docs/method.md §7, §10); hashable.

  Attributes:
    num_steps: T, the number of reverse steps (t_n = n / T).
    num_levels: K (1 = MDLM); must equal the schedule's.
    mask_id: the MASK token id.
    temperature: τ > 0 for token draws (log f / τ); unused when greedy.
    top_p: nucleus mass in (0, 1] of the tempered token law (1 = no truncation; §8.5).
    nucleus: 'inclusive' (the token crossing top_p is kept) | 'exclusive' (dropped; §8.5).
    greedy: argmax tokens instead of draws.
    ordering: 'ancestral' (Algorithm 2) | 'confidence' (top-k by score) | 'remask' (MGDM's top-k
      mask-predict, docs/method.md §13.3; MGDM only) | 'remdm' (ReMDM's remasking sampler,
      §13.5; K = 1: MDLM, ADLM).
    remask_noise, remask_schedule, remask_decoded: 'remask' only: the Gumbel scale on the
      confidences (greedy: none), the schedule of the masked share, and whether decoded cells
      are carried over ('carry') or predicted afresh each step ('repredict', MGDM's code).
    remdm_schedule, remdm_eta, remdm_t_on, remdm_t_off, remdm_alpha_on: 'remdm' only: the σ_t
      schedule ('loop' | 'cap' | 'rescale'), η, and the loop's phase times and held α (§13.5).
    use_cache: skip unneeded calls and reuse unchanged pass-1 outputs.
    prior_corrected: apply the prior correction to the hierarchy head; False for an exact oracle.
    variant: 'two_pass' (paper) | 'single_pass'; ignored for K == 1.
    time_conditioning: whether the model reads t; the pass-1 cache is used only when False.
    level_context: confidence ordering only: 'candidates' (pass 2 sees ĥ at every masked
      position) | 'none' (pass 2 sees h_m there; one call computes both heads).
    hierarchy_weight: confidence ordering only: w >= 0 in score = w · log π + log max f.
    given_state: given positions enter the network as h_g = K+1 (model.given_state).
  """
  num_steps: int
  num_levels: int
  mask_id: int
  temperature: float = _SAMPLE.temperature
  top_p: float = _SAMPLE.top_p
  nucleus: str = _SAMPLE.nucleus
  greedy: bool = _SAMPLE.greedy
  ordering: str = _SAMPLE.ordering
  use_cache: bool = _SAMPLE.use_cache
  prior_corrected: bool = _MODEL.prior_corrected_head
  variant: str = _MODEL.variant
  time_conditioning: bool = True
  level_context: str = _SAMPLE.level_context
  hierarchy_weight: float = _SAMPLE.hierarchy_weight
  given_state: bool = _MODEL.given_state
  remask_noise: float = _SAMPLE.remask_noise
  remask_schedule: str = _SAMPLE.remask_schedule
  remask_decoded: str = _SAMPLE.remask_decoded
  remdm_schedule: str = _SAMPLE.remdm_schedule
  remdm_eta: float = _SAMPLE.remdm_eta
  remdm_t_on: float = _SAMPLE.remdm_t_on
  remdm_t_off: float = _SAMPLE.remdm_t_off
  remdm_alpha_on: float = _SAMPLE.remdm_alpha_on

  def __post_init__(self) -> None:
    _check_int('sample.num_steps', self.num_steps, minimum=1)
    _check_int('model.num_levels', self.num_levels, minimum=1)
    _check_int('model.mask_id', self.mask_id, minimum=0)
    for name in ('greedy', 'use_cache', 'prior_corrected', 'time_conditioning', 'given_state'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'SampleConfig.{name} must be a bool, got {getattr(self, name)!r}.')
    if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
        or not self.temperature > 0 or self.temperature == float('inf')):
      raise ValueError(f'sample.temperature must be a finite number > 0 (use sample.greedy=True '
                       f'for argmax decoding), got {self.temperature!r}.')
    _check_number('sample.top_p', self.top_p, lo=0.0, hi=1.0, lo_open=True, hi_open=False)
    if self.nucleus not in NUCLEUS_RULES:
      raise ValueError(f'sample.nucleus must be one of {NUCLEUS_RULES}, got {self.nucleus!r}.')
    if self.ordering not in ORDERINGS:
      raise ValueError(f'sample.ordering must be one of {ORDERINGS}, got {self.ordering!r}.')
    if self.level_context not in LEVEL_CONTEXTS:
      raise ValueError(f'sample.level_context must be one of {LEVEL_CONTEXTS}, got '
                       f'{self.level_context!r}.')
    _check_number('sample.hierarchy_weight', self.hierarchy_weight, lo=0.0)
    _check_number('sample.remask_noise', self.remask_noise, lo=0.0)
    if self.remask_schedule not in REMASK_SCHEDULES:
      raise ValueError(f'sample.remask_schedule must be one of {REMASK_SCHEDULES}, got '
                       f'{self.remask_schedule!r}.')
    if self.remask_decoded not in REMASK_DECODED:
      raise ValueError(f'sample.remask_decoded must be one of {REMASK_DECODED}, got '
                       f'{self.remask_decoded!r}.')
    self._check_remdm()
    if self.variant not in VARIANTS:
      raise ValueError(f'model.variant must be one of {VARIANTS}, got {self.variant!r}.')

  def _check_remdm(self) -> None:
    """The `sample.remdm_*` fields of ReMDM's sampler (docs/method.md §13.5).

    η ∈ [0, 1] (a probability); 'loop' needs 0 < t_off < t_on < 1, α_on ∈ (0, 1) and
    η ≤ (1 - α_on)/α_on, else its held phase would fill a masked position with probability
    η·α_on/(1 - α_on) > 1.
    """
    if self.remdm_schedule not in REMDM_SCHEDULES:
      raise ValueError(f'sample.remdm_schedule must be one of {REMDM_SCHEDULES}, got '
                       f'{self.remdm_schedule!r}.')
    eta = _check_number('sample.remdm_eta', self.remdm_eta, lo=0.0, hi=1.0, hi_open=False)
    if self.remdm_schedule != 'loop':
      return
    t_on = _check_number('sample.remdm_t_on', self.remdm_t_on, lo=0.0, hi=1.0, lo_open=True)
    _check_number('sample.remdm_t_off', self.remdm_t_off, lo=0.0, hi=t_on, lo_open=True)
    alpha_on = _check_number('sample.remdm_alpha_on', self.remdm_alpha_on, lo=0.0, hi=1.0,
                             lo_open=True)
    if eta * alpha_on > 1.0 - alpha_on:
      raise ValueError(f'sample.remdm_eta={eta!r} must be <= (1 - sample.remdm_alpha_on) / '
                       f'remdm_alpha_on = {(1.0 - alpha_on) / alpha_on:.4g} for the loop schedule.')

  @classmethod
  def from_config(cls, config: schema.Config) -> SampleConfig:
    """The view of a resolved config (its `sample` and `model` sections)."""
    config = _typed(config, 'SampleConfig.from_config')
    sm, m = config.sample, config.model
    return cls(num_steps=sm.num_steps, num_levels=m.num_levels, mask_id=m.mask_id,
               temperature=sm.temperature, top_p=sm.top_p, nucleus=sm.nucleus, greedy=sm.greedy,
               ordering=sm.ordering,
               use_cache=sm.use_cache, prior_corrected=m.prior_corrected_head,
               variant=m.variant,
               # The pass-1 cache may reuse logits only if nothing in the network reads t.
               time_conditioning=m.time_conditioning or m.pathway.time_conditioning,
               level_context=sm.level_context, hierarchy_weight=float(sm.hierarchy_weight),
               given_state=m.given_state, remask_noise=float(sm.remask_noise),
               remask_schedule=sm.remask_schedule, remask_decoded=sm.remask_decoded,
               remdm_schedule=sm.remdm_schedule,
               remdm_eta=float(sm.remdm_eta), remdm_t_on=float(sm.remdm_t_on),
               remdm_t_off=float(sm.remdm_t_off), remdm_alpha_on=float(sm.remdm_alpha_on))


def hdlm_config(config: schema.Config) -> HDLMConfig:
  """The HDLM view (`process.hdlm`, `loss` and `model` sections) of a whole experiment config."""
  return HDLMConfig._view(_typed(config, 'hdlm_config'))  # pylint: disable=protected-access


