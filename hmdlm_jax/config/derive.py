"""`resolve`: an experiment's ConfigDict -> the typed, frozen `Config`, derived and validated once.

Each derived value is computed here and nowhere else (docs/design.md lists them): `model.mask_id`
(-1 = the last row before HDLM's cluster rows), the log-linear offsets from `offsets_max`,
`loss.train_steps_T` (0 = the sampling grid), the K = 1 twin's moot hierarchy settings, and the
per-process model fields (config/kinds.py). Every section is validated before anything touches
data or devices: one ValueError naming the field and what to do. No JAX here.
"""

from __future__ import annotations

import copy

import ml_collections

from hmdlm_jax import hub
from hmdlm_jax import storage

from hmdlm_jax.config import kinds as config_kinds
from hmdlm_jax.config import schema
from hmdlm_jax.config import views
from hmdlm_jax.config.checks import check_bool as _check_bool
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number
from hmdlm_jax.config.checks import is_int as _is_int


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
  _check_number('optim.hier_grad_clip', o.hier_grad_clip, lo=0.0)
  _check_number('optim.hier_lr_scale', o.hier_lr_scale, lo=0.0, lo_open=True)
  _check_number('optim.eps', o.eps, lo=0.0, lo_open=True)
  _check_number('optim.decay_floor', o.decay_floor, lo=0.0, hi=1.0, hi_open=False)
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
  _check_adlm_init(config)
  if ini.embedding:  # the embedding alone, or the whole network: one source (warm_start.py)
    for field, other in (('init.mdlm_checkpoint', ini.mdlm_checkpoint),
                         ('init.workdir', ini.workdir)):
      if other:
        raise ValueError(f'init.embedding and {field} are both set; keep one (init.embedding '
                         'starts the input embedding only, the other the whole network).')
    if not str(ini.embedding).endswith('.npz') or not storage.isfile(ini.embedding):
      raise ValueError(f'init.embedding={ini.embedding!r} must be an existing .npz holding the '
                       "embedding table ('vocab_embed/embedding', or its only array), or ''.")
  if ini.workdir:
    if ini.mdlm_checkpoint:
      raise ValueError('init.workdir and init.mdlm_checkpoint are both set; keep one.')
    if not storage.isfile(storage.join(ini.workdir, 'config.json')):
      raise ValueError(f'init.workdir={ini.workdir!r} is not a run directory of this project (no '
                       'config.json); train there first or set it to \'\'.')
  path = ini.mdlm_checkpoint
  if not path or hub.is_ref(path):  # a Hub file is looked up (offline by default) in preflight
    return
  if not storage.isfile(path):
    raise ValueError(f'init.mdlm_checkpoint={path!r} does not exist; convert an MDLM checkpoint '
                     'with python -m hmdlm_jax.convert_mdlm, or set it to \'\' (random init).')
  if not path.endswith(('.npz', '.safetensors', '.ckpt', '.pt', '.pth')):
    raise ValueError(f'init.mdlm_checkpoint={path!r} must be a converted .npz, an MDLM '
                     '.safetensors or a Lightning .ckpt.')


def _check_adlm_init(config: ml_collections.ConfigDict) -> None:
  """`init.adlm_checkpoint`: the ADLM authors' network, for process.kind='adlm' only, the one
  `init` source (docs/method.md §13.4). Its network is the one with a denoiser (the derived
  model.denoiser_layers > 0, config/kinds.py), so an MDLM file cannot start it."""
  ini, path = config.init, config.init.adlm_checkpoint
  has_denoiser = config.model.denoiser_layers > 0
  if has_denoiser and ini.mdlm_checkpoint:
    raise ValueError(f"init.mdlm_checkpoint={ini.mdlm_checkpoint!r} has no ADLM denoiser; with "
                     "process.kind='adlm' start from the authors' checkpoint with "
                     "init.adlm_checkpoint (python -m hmdlm_jax.convert_adlm) or init.workdir.")
  if not path:
    return
  if not has_denoiser:
    raise ValueError(f"init.adlm_checkpoint is an ADLM network (anchor + denoiser): set "
                     f"process.kind='adlm' (got {config.process.kind!r}) or "
                     "init.adlm_checkpoint=''.")
  for field, other in (('init.workdir', ini.workdir), ('init.embedding', ini.embedding)):
    if other:
      raise ValueError(f'init.adlm_checkpoint and {field} are both set; keep one.')
  if not path.endswith('.npz') or not storage.isfile(path):
    raise ValueError(f'init.adlm_checkpoint={path!r} must be an existing .npz: convert the '
                     "authors' checkpoint with python -m hmdlm_jax.convert_adlm --src=FILE.ckpt "
                     "--dst=FILE.npz --use_ema --allow_pickle, or set it to '' (random init).")


def _derive_round_tokens(config: ml_collections.ConfigDict) -> None:
  """model.pathway.round_tokens = loss.beta_rounds > 0 (the head exists only when its loss
  does)."""
  beta = _check_number('loss.beta_rounds', config.loss.beta_rounds, lo=0.0)
  given = config.model.pathway.round_tokens
  if given not in (False, beta > 0):
    raise ValueError(f'model.pathway.round_tokens={given!r} is derived from loss.beta_rounds '
                     f'({beta}): leave it False and set loss.beta_rounds.')
  config.model.pathway.round_tokens = beta > 0


def resolve(config: ml_collections.ConfigDict) -> schema.Config:
  """The typed config of an experiment's ConfigDict, derived and validated (the entry point calls
  this once; everything below it reads the result).

  Raises:
    ValueError naming the field and what to do.
  """
  if isinstance(config, schema.Config):
    raise ValueError('the config is already resolved; hmdlm_jax.config.resolve takes the '
                     'ConfigDict of an experiment file (hmdlm_jax.config.load).')
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
    if _is_int(config.sample.seeds):
      config.sample.seeds = (config.sample.seeds,)
  config_kinds.check_process(config)
  _check_train(config)
  _check_optim(config)
  _check_eval_sample_data(config)
  _check_init(config)
  values = config.to_dict()
  values['model'] = schema.to_dict(schema.ModelConfig.from_section(config.model))
  typed = schema.build(schema.Config, values)
  views.LossConfig.from_config(typed)  # the views validate their sections
  views.SampleConfig.from_config(typed)
  return typed
