"""The experiment config, resolved and validated once, read through frozen typed views.

Every experiment is one `configs/*.py` file whose `get_config()` overrides fields of the schema in
configs/base.py (which lists every field any code reads). `resolve(config)` returns a copy with the
derived values computed, each in exactly one place:

* `model.mask_id = -1` -> `model.vocab_size - 1` (minus HDLM's cluster rows, below);
* `schedule.offsets_max >= 0` (log-linear) -> `schedule.offsets = (offsets_max · k / (K-1))_k`,
  `(0,)` for K = 1, so `--config.model.num_levels=1` alone turns HMDLM into its MDLM twin
  (docs/method.md §2: K = 1 with δ = 0 is MDLM);
* `loss.train_steps_T = 0` -> `sample.num_steps` (Algorithm 1's T_train on the sampling grid);
* `model.num_levels = 1` -> `data.hierarchy = 'none'`, `loss.beta_rounds = 0`:
  with one level every position is level 0 whatever the rule, which
  is moot, and so are its rounds and pass 1;
* per process kind (config_kinds.PROCESS_RULES): `process.kind = 'mdlm'` requires K = 1 (MDLM
  is HMDLM's K = 1 case, reachable by name); `process.kind = 'hdlm'` (docs/method.md §13.1):
  `model.extra_vocab_rows` = the cluster-token rows (num_clusters, 0 for one cluster, which is
  identified with MASK), `model.mask_id = -1` -> the last row before them
  (`vocab_size - 1 - extra_vocab_rows`), and `model.cluster_head` = n when
  `process.hdlm.aux_weight > 0` (the auxiliary cluster head; config_hdlm.derived_model_fields);

and validates every section that the code reads without touching data or devices (ValueError naming
the field and what to do). The views (`ModelConfig`, `LossConfig`, `SampleConfig`; the schedule's is
`processes.schedules.Schedule`) are hashable frozen dataclasses: valid static arguments of
`jax.jit`. Nothing here imports JAX or the rest of the package.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Mapping

import ml_collections

from hmdlm_jax.config import kinds as config_kinds
from hmdlm_jax.config.checks import check_bool as _check_bool
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number
from hmdlm_jax.config.checks import is_int as _is_int
# The HDLM and MultiMDM views and the per-kind rules live in leaf modules; re-exported here.
from hmdlm_jax.config.hdlm import HDLMConfig
from hmdlm_jax.config.hdlm import hdlm_cluster_rows
from hmdlm_jax.config.kinds import noise_ids
from hmdlm_jax.config.kinds import num_noise_rows
from hmdlm_jax.config.multimdm import MultiMDMConfig
from hmdlm_jax.config.pathway import check_pathway

VARIANTS = ('two_pass', 'single_pass')
# What hmdlm_jax/models implements (tests/test_models.py checks the registries agree).
BACKBONES = ('dit', 'gpt2')
POSITION_EMBEDDINGS = ('rotary', 'learned', 'sudoku', 'sudoku_rel')
COMPUTE_DTYPES = ('float32', 'bfloat16')
SUDOKU_CELLS = 81
ORDERINGS = ('ancestral', 'confidence')
LEVEL_CONTEXTS = ('candidates', 'none')
HIER_OBJECTIVES = ('bound', 'cross_entropy')
TOKEN_ROWS = ('auto', 'all', 'selected')


# ------------------------------------------------------------------------------------------ views


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The validated `model` config section (docs/method.md §4); hashable.

  Built from the section with `from_section` (models.build_model(config.model)) or from the whole
  config with `from_config`; `mask_id` is resolved (never -1).
  """
  backbone: str
  num_levels: int
  vocab_size: int
  mask_id: int
  seq_len: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  cond_dim: int
  dropout: float
  time_conditioning: bool
  variant: str
  position_embedding: str
  tie_embeddings: bool
  dtype: str
  hier_stop_gradient: bool
  # The hierarchy pathway (docs/method.md §4.7). Defaults = off, so a `model` section written
  # before these fields existed (a checkpoint's config.json) reads as the same model.
  hier_layers: int = 0
  hier_repeats: int = 1
  hier_time_conditioning: bool = False
  hier_input_embed: bool = False
  given_state: bool = False
  hier_readout: str = 'head'
  hier_width: int = 0
  hier_num_heads: int = 0
  cluster_head: int = 0  # outputs of HDLM's auxiliary cluster head (derived; 0 = none)
  sudoku_candidates: bool = False
  candidates_pathway_only: bool = False
  hier_round_tokens: bool = False  # derived: loss.beta_rounds > 0 (the per-round token head)
  hier_source: str = 'features'

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> ModelConfig:
    return cls.from_section(resolve(config).model)

  @classmethod
  def from_section(cls, cfg_model: Any) -> ModelConfig:
    """Validates a `model` section; errors name the field and the allowed values."""
    if isinstance(cfg_model, ModelConfig):
      return cfg_model
    get = (cfg_model.get if isinstance(cfg_model, Mapping) or hasattr(cfg_model, 'get')
           else lambda k, d=None: getattr(cfg_model, k, d))
    if get('backbone', None) is None and get('model', None) is not None:
      raise ValueError('ModelConfig.from_section expects the `model` config section '
                       '(config.model), not the whole config.')
    values = {}
    for f in dataclasses.fields(cls):
      v = get(f.name, None)
      if v is None and f.default is dataclasses.MISSING:
        raise ValueError(f'model.{f.name} is missing from the model config.')
      values[f.name] = f.default if v is None else v
    for name, lo in (('num_levels', 1), ('vocab_size', 2), ('seq_len', 1), ('num_layers', 1),
                     ('hidden_size', 1), ('num_heads', 1), ('mlp_dim', 1), ('cond_dim', 1)):
      _check_int(f'model.{name}', values[name], minimum=lo)
    values['mask_id'] = config_kinds.resolve_mask_id(values['vocab_size'], values['mask_id'],
                                                     get('extra_vocab_rows', None) or 0)
    values['dropout'] = _check_number('model.dropout', values['dropout'], lo=0.0, hi=1.0)
    for name in ('time_conditioning', 'tie_embeddings', 'hier_stop_gradient',
                 'hier_time_conditioning', 'hier_input_embed', 'given_state',
                 'sudoku_candidates', 'candidates_pathway_only', 'hier_round_tokens'):
      _check_bool(f'model.{name}', values[name])
    _check_int('model.cluster_head', values['cluster_head'], minimum=0)
    check_pathway(values)
    return cls(**values)

  def __post_init__(self) -> None:
    def bad(field: str, allowed: str) -> ValueError:
      return ValueError(f'model.{field}={getattr(self, field)!r} is invalid: {allowed}.')

    if self.backbone not in BACKBONES:
      raise bad('backbone', f'allowed {BACKBONES}')
    if self.hidden_size % self.num_heads:
      raise bad('hidden_size', f'must be divisible by model.num_heads={self.num_heads}')
    if self.variant not in VARIANTS:
      raise bad('variant', f'allowed {VARIANTS}')
    pe = self.position_embedding
    if pe not in POSITION_EMBEDDINGS:
      raise bad('position_embedding', f'allowed {POSITION_EMBEDDINGS}')
    if pe in ('sudoku', 'sudoku_rel') and self.seq_len != SUDOKU_CELLS:
      raise bad('seq_len', f'model.position_embedding={pe!r} needs model.seq_len == 81 '
                '(a 9×9 grid)')
    if pe == 'sudoku_rel' and self.backbone != 'dit':
      raise bad('position_embedding', "'sudoku_rel' (relation attention bias) needs "
                "model.backbone='dit'")
    if pe == 'rotary' and (self.hidden_size // self.num_heads) % 2:
      raise bad('num_heads', 'rotary embeddings need an even head dimension hidden_size / '
                'num_heads')
    if self.dtype not in COMPUTE_DTYPES:
      raise bad('dtype', f'allowed {COMPUTE_DTYPES}')
    if self.sudoku_candidates and (self.seq_len, self.vocab_size, self.mask_id) != (
        SUDOKU_CELLS, 10, 9):
      raise bad('sudoku_candidates', 'the candidate features need a Sudoku grid: model.seq_len '
                '= 81, vocab_size = 10 and mask_id = 9 (tokens 0..8 = digits 1..9; '
                f'got {self.seq_len}, {self.vocab_size}, {self.mask_id})')
    if self.candidates_pathway_only and not (self.sudoku_candidates and self.hier_input_embed):
      raise bad('candidates_pathway_only', 'the candidate features would feed nothing: set '
                'model.sudoku_candidates=True and model.hier_input_embed=True')


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
      0 = off; needs model.hier_readout='rounds', which derives model.hier_round_tokens;
      docs/method.md §5.1).
    token_rows: where the training loss evaluates the token head: 'all' positions (dense logits,
      then the masked ones are read) or only the 'selected' ones (masked loss positions;
      models/token_head.py: same values, about half the head's cost, one device only); 'auto'
      is resolved by the train step (`Process.for_devices`): 'selected' on one device, else
      'all'; a loss called outside a train step reads 'auto' as 'all'.
  """
  beta_hier: float = 1.0
  beta_cons: float = 1.0
  t_min: float = 1e-3
  antithetic: bool = True
  train_steps_T: int = 1000
  variant: str = 'two_pass'
  prior_corrected: bool = True
  mask_id: int = 0
  num_levels: int = 2
  hier_objective: str = 'bound'
  given_state: bool = False
  beta_rounds: float = 0.0
  token_rows: str = 'all'

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
  def from_config(cls, config: ml_collections.ConfigDict) -> LossConfig:
    """The view of a full experiment config (`loss` and `model` sections)."""
    return cls._view(resolve(config))

  @classmethod
  def _view(cls, config: ml_collections.ConfigDict) -> LossConfig:
    m, l = config.model, config.loss
    return cls(beta_hier=float(l.beta_hier), beta_cons=float(l.beta_cons), t_min=float(l.t_min),
               antithetic=bool(l.antithetic), train_steps_T=int(l.train_steps_T),
               variant=str(m.variant), prior_corrected=bool(m.prior_corrected_head),
               mask_id=int(m.mask_id), num_levels=int(m.num_levels),
               hier_objective=str(l.get('hier_objective', 'bound')),
               given_state=bool(m.get('given_state', False)),
               beta_rounds=float(l.get('beta_rounds', 0.0)),
               token_rows=str(l.get('token_rows', 'auto')))


@dataclasses.dataclass(frozen=True)
class SampleConfig:
  """Static sampler settings (docs/method.md §7, §10); hashable.

  Attributes:
    num_steps: T, the number of reverse steps (t_n = n / T).
    num_levels: K (1 = MDLM); must equal the schedule's.
    mask_id: the MASK token id.
    temperature: τ > 0 for token draws (log f / τ); unused when greedy.
    greedy: argmax tokens instead of draws.
    ordering: 'ancestral' (Algorithm 2) | 'confidence' (top-k by score).
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
  temperature: float = 1.0
  greedy: bool = False
  ordering: str = 'ancestral'
  use_cache: bool = True
  prior_corrected: bool = True
  variant: str = 'two_pass'
  time_conditioning: bool = True
  level_context: str = 'candidates'
  hierarchy_weight: float = 1.0
  given_state: bool = False

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
    if self.ordering not in ORDERINGS:
      raise ValueError(f'sample.ordering must be one of {ORDERINGS}, got {self.ordering!r}.')
    if self.level_context not in LEVEL_CONTEXTS:
      raise ValueError(f'sample.level_context must be one of {LEVEL_CONTEXTS}, got '
                       f'{self.level_context!r}.')
    _check_number('sample.hierarchy_weight', self.hierarchy_weight, lo=0.0)
    if self.variant not in VARIANTS:
      raise ValueError(f'model.variant must be one of {VARIANTS}, got {self.variant!r}.')

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> SampleConfig:
    """The view of a full experiment config (`sample` and `model` sections)."""
    for section in ('sample', 'model'):
      if not hasattr(config, section):
        raise ValueError(f'SampleConfig.from_config needs the full config with a `{section}` '
                         f'section; got {type(config).__name__} without it.')
    return cls._view(resolve(config))

  @classmethod
  def _view(cls, config: ml_collections.ConfigDict) -> SampleConfig:
    sm, m = config.sample, config.model
    return cls(num_steps=sm.num_steps, num_levels=m.num_levels, mask_id=m.mask_id,
               temperature=sm.temperature, greedy=sm.greedy, ordering=sm.ordering,
               use_cache=sm.use_cache, prior_corrected=m.prior_corrected_head,
               variant=m.variant,
               # The pass-1 cache may reuse logits only if nothing in the network reads t.
               time_conditioning=bool(m.time_conditioning or m.get('hier_time_conditioning',
                                                                   False)),
               level_context=sm.level_context, hierarchy_weight=float(sm.hierarchy_weight),
               given_state=bool(m.get('given_state', False)))


def hdlm_config(config: ml_collections.ConfigDict) -> HDLMConfig:
  """The HDLM view (`process.hdlm`, `loss` and `model` sections) of a whole experiment config."""
  return HDLMConfig._view(resolve(config))  # pylint: disable=protected-access


# ---------------------------------------------------------------------------------------- resolve


def _resolve_offsets(config: ml_collections.ConfigDict) -> None:
  s = config.schedule
  top = s.offsets_max
  if s.kind != 'loglinear' or top == -1.0:
    return
  top = _check_number('schedule.offsets_max', top, lo=0.0, hi=1.0)
  k = config.model.num_levels
  s.offsets = tuple(0.0 if k == 1 else round(top * i / (k - 1), 10) for i in range(k))


def _check_train(config: ml_collections.ConfigDict) -> None:
  """The fields of the training loop (the optimiser's are checked by `_check_optim`)."""
  t = config.train
  for name in ('num_steps', 'log_every', 'ckpt_every', 'grad_accum', 'max_bad_steps', 'keep_last'):
    _check_int(f'train.{name}', t[name], minimum=1)
  for name in ('eval_every', 'keep_period'):
    _check_int(f'train.{name}', t[name], minimum=0)
  _check_number('train.time_budget_s', t.time_budget_s, lo=0.0)
  for name in ('final_eval', 'async_checkpoint'):
    _check_bool(f'train.{name}', t[name])
  b = config.data.batch_size
  _check_int('data.batch_size', b, minimum=1)
  if b % t.grad_accum:
    raise ValueError(f'data.batch_size={b} must be a multiple of train.grad_accum='
                     f'{t.grad_accum}.')
  for s in t.debug_nan_steps:
    if not _is_int(s) or s < 0:
      raise ValueError(f'train.debug_nan_steps must hold step numbers >= 0, got {s!r}.')


def _check_optim(config: ml_collections.ConfigDict) -> None:
  o = config.optim
  _check_number('optim.lr', o.lr, lo=0.0, lo_open=True)
  _check_int('optim.warmup_steps', o.warmup_steps, minimum=0)
  if o.decay not in ('constant', 'cosine'):
    raise ValueError(f"optim.decay={o.decay!r} is not one of ('constant', 'cosine').")
  for name in ('b1', 'b2', 'ema_decay'):
    _check_number(f'optim.{name}', o[name], lo=0.0, hi=1.0)
  _check_number('optim.weight_decay', o.weight_decay, lo=0.0)
  _check_number('optim.grad_clip', o.grad_clip, lo=0.0)
  _check_number('optim.eps', o.get('eps', 1e-8), lo=0.0, lo_open=True)
  _check_number('optim.decay_floor', o.get('decay_floor', 0.0), lo=0.0, hi=1.0, hi_open=False)
  _check_bool('optim.ema_warmup', o.ema_warmup)


def _check_eval_sample_data(config: ml_collections.ConfigDict) -> None:
  """The fields of evaluation, sampling and data loading that every task reads."""
  seed = config.seed
  if not _is_int(seed) or not 0 <= seed < 2**32:
    raise ValueError(f'seed must be an integer in [0, 2**32), got {seed!r}.')
  e, sm, d = config.eval, config.sample, config.data
  for field, value, lo in (('eval.num_examples', e.num_examples, 0),
                           ('eval.time_seed', e.time_seed, 0),
                           ('eval.num_t_samples', e.num_t_samples, 1),
                           ('eval.num_samples', e.num_samples, 0),
                           ('sample.num_samples', sm.num_samples, 1),
                           ('data.eval_batch_size', d.eval_batch_size, 1),
                           ('data.num_workers', d.num_workers, 0),
                           ('data.read_threads', d.read_threads, 1),
                           ('data.prefetch_batches', d.prefetch_batches, 0)):
    _check_int(field, value, minimum=lo)
  for field, value in (('eval.use_ema', e.use_ema), ('sample.pictures', sm.pictures)):
    _check_bool(field, value)
  seeds = (sm.seeds,) if _is_int(sm.seeds) else tuple(sm.seeds)
  if not seeds or not all(_is_int(x) and x >= 0 for x in seeds):
    raise ValueError(f'sample.seeds must be a non-empty tuple of integers >= 0, got '
                     f'{sm.seeds!r}; write it --config.sample.seeds=(0,1).')


def _check_init(config: ml_collections.ConfigDict) -> None:
  """A warm start that cannot work is reported now, not after the model is initialised."""
  ini = config.init
  _check_bool('init.use_ema', ini.use_ema)
  if not _is_int(ini.mdlm_mask_id) or ini.mdlm_mask_id < -1:
    raise ValueError(f'init.mdlm_mask_id={ini.mdlm_mask_id!r} must be -1 (the last row) or a row.')
  if ini.workdir:
    if ini.mdlm_checkpoint:
      raise ValueError('init.workdir and init.mdlm_checkpoint are both set; keep one.')
    if not os.path.isfile(os.path.join(ini.workdir, 'config.json')):
      raise ValueError(f'init.workdir={ini.workdir!r} is not a run directory of this project (no '
                       'config.json); train there first or set it to \'\'.')
  path = ini.mdlm_checkpoint
  if not path:
    return
  if not os.path.isfile(path):
    raise ValueError(f'init.mdlm_checkpoint={path!r} does not exist; convert an MDLM checkpoint '
                     'with python -m hmdlm_jax.convert_mdlm, or set it to \'\' (random init).')
  if not path.endswith(('.npz', '.safetensors', '.ckpt', '.pt', '.pth')):
    raise ValueError(f'init.mdlm_checkpoint={path!r} must be a converted .npz, an MDLM '
                     '.safetensors or a Lightning .ckpt.')


def _derive_round_tokens(config: ml_collections.ConfigDict) -> None:
  """model.hier_round_tokens = loss.beta_rounds > 0 (the head exists only when its loss does)."""
  beta = _check_number('loss.beta_rounds', config.loss.get('beta_rounds', 0.0), lo=0.0)
  given = config.model.get('hier_round_tokens', False)
  if given not in (False, beta > 0):
    raise ValueError(f'model.hier_round_tokens={given!r} is derived from loss.beta_rounds '
                     f'({beta}): leave it False and set loss.beta_rounds.')
  config.model.hier_round_tokens = beta > 0


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` with the derived values computed and the sections validated (idempotent).

  Raises:
    ValueError naming the field and what to do.
  """
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'the config must be an ml_collections.ConfigDict (get_config() of a '
                     f'configs/*.py file), got {type(config).__name__}.')
  config = copy.deepcopy(config)
  with config.unlocked():
    _check_int('model.num_levels', config.model.num_levels, minimum=1)
    config_kinds.derive_model_fields(config)  # HDLM's cluster rows and auxiliary head
    config.model.mask_id = config_kinds.resolve_mask_id(
        config.model.vocab_size, config.model.mask_id, config.model.extra_vocab_rows)
    _resolve_offsets(config)
    _check_int('loss.train_steps_T', config.loss.train_steps_T, minimum=0)
    if config.loss.train_steps_T == 0:  # Algorithm 1 on the sampling grid
      _check_int('sample.num_steps', config.sample.num_steps, minimum=1)
      config.loss.train_steps_T = config.sample.num_steps
    if config.model.num_levels == 1:  # the twin of any setting: no levels, rounds or pass 1
      config.data.hierarchy, config.loss.beta_rounds = 'none', 0.0
    _derive_round_tokens(config)
  config_kinds.check_process(config)
  _check_train(config)
  _check_optim(config)
  _check_eval_sample_data(config)
  _check_init(config)
  ModelConfig.from_section(config.model)  # the views validate their sections
  LossConfig._view(config)  # pylint: disable=protected-access
  SampleConfig._view(config)  # pylint: disable=protected-access
  return config
