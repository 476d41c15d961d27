"""Model construction, apply_fn, parameter counts and logical specs (docs/method.md §4).

Public API:
  build_model(cfg_model, features=None) -> nn.Module   by cfg.model.backbone; the task's features
  make_apply_fn(model, params, *, train, rng)    -> apply_fn of docs/design.md
  init_params(model, rng, seq_len) -> params     plain arrays (logical-axis boxes removed)
  logical_specs(model, seq_len) -> PartitionSpec tree of logical axis names (same tree as params)
  count_params(params) -> int;  param_count_breakdown(cfg_model, features) -> dict;  *_report
The validated, hashable view of the `model` section is `hmdlm_jax.config.ModelConfig`.

The models return raw float32 logits; SUBS and the hierarchy prior correction live in
hmdlm_jax/processes/parameterization.py. The parts shared by both backbones are in hierarchy.py,
the level pathway in pathway.py; exact parameter counts are explained in dit.py and gpt2.py. The
logical -> mesh axis rules live in hmdlm_jax/sharding.py (LOGICAL_RULES).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import ModelConfig
from hmdlm_jax.models import hierarchy
from hmdlm_jax.models import pathway
from hmdlm_jax.models import token_head
from hmdlm_jax.models.anchor import DENOISER_PREFIX
from hmdlm_jax.models.dit import DiT
from hmdlm_jax.models.features import ModelFeatures
from hmdlm_jax.models.gpt2 import GPT2

Array = jax.Array
Params = Any
ApplyFn = Callable[..., dict[str, Array]]

BACKBONES: dict[str, type[hierarchy.HierarchicalBackbone]] = {'dit': DiT, 'gpt2': GPT2}


# The position embeddings the backbones build themselves; any other is a task's (features.py).
OWN_POSITIONS = ('rotary', 'learned')


def build_model(cfg_model: Any, features: ModelFeatures | None = None) -> nn.Module:
  """`cfg.model` -> the Flax module of `cfg.model.backbone` (registry BACKBONES).

  features: what the task adds (models/features.py; None: nothing). A run builds its model
  through its task, `hmdlm_jax.tasks.build_model(config)`, which passes the task's.
  """
  cfg = ModelConfig.from_section(cfg_model)
  features = ModelFeatures() if features is None else features
  if cfg.position_embedding not in OWN_POSITIONS and features.positions is None:
    raise ValueError(f'model.position_embedding={cfg.position_embedding!r} is a task\'s: build '
                     "the model with the task's features (hmdlm_jax.tasks.build_model(config)).")
  if features.relations is not None and cfg.backbone != 'dit':
    raise ValueError(f"model.backbone={cfg.backbone!r}: the task's relation attention bias "
                     "needs model.backbone='dit'.")
  return BACKBONES[cfg.backbone](
      vocab_size=cfg.vocab_size, num_levels=cfg.num_levels, num_layers=cfg.num_layers,
      hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, mlp_dim=cfg.mlp_dim,
      cond_dim=cfg.cond_dim, dropout=cfg.dropout, time_conditioning=cfg.time_conditioning,
      single_pass=cfg.variant == 'single_pass', position_embedding=cfg.position_embedding,
      seq_len=cfg.seq_len, tie_embeddings=cfg.tie_embeddings, dtype=cfg.dtype,
      given_state=cfg.given_state, cluster_head=cfg.cluster_head, mask_id=cfg.mask_id,
      pathway=pathway.settings(cfg), denoiser_layers=cfg.denoiser_layers, features=features,
      **({'remat': cfg.remat} if cfg.backbone == 'dit' else {}))  # model.remat: DiT only


def heads_salt(heads: tuple[str, ...]) -> int:
  """A process-independent integer for a heads tuple (Python's hash() of str is salted).

  'token_nll' salts as 'token' (it is the token head read at selected rows), so both readings of
  one call draw the same dropout mask.
  """
  names = ('token' if h == 'token_nll' else h for h in heads)
  return zlib.crc32(','.join(names).encode()) & 0x7FFFFFFF


def make_apply_fn(model: nn.Module, params: Params, *, train: bool,
                  rng: Array | None = None) -> ApplyFn:
  """The denoiser callable of docs/design.md, closed over `params` (traceable, jit-able).

  apply_fn(tokens [B,L], levels [B,L], t [B], *, heads, token_levels=None, token_query=None)
  -> dict
  train=True applies dropout; its key is fold_in(rng, crc32(heads)), so pass 1 (heads=('hier',))
  and pass 2 (heads=('token',)) draw different masks from one step key. Calls with the same heads
  in one step share a mask (a call counter is not expressible inside a traced function). To
  differentiate, build the closure inside the loss function from the params being differentiated.
  """
  if train and rng is None and model.dropout > 0:
    raise ValueError('make_apply_fn(train=True) needs rng (a PRNG key) for dropout '
                     f'(model.dropout={model.dropout})')

  def apply_fn(tokens: Array, levels: Array, t: Array, *, heads: tuple[str, ...],
               token_levels: Array | None = None,
               token_query: token_head.TokenQuery | None = None) -> dict[str, Array]:
    heads = hierarchy.check_heads(heads)
    rngs = None
    if train and rng is not None:
      rngs = {'dropout': jax.random.fold_in(rng, heads_salt(heads))}
    return model.apply({'params': params}, tokens, levels, t, heads=heads,
                       token_levels=token_levels, train=train, rngs=rngs,
                       token_query=token_query)

  return apply_fn


def _init_variables(model: nn.Module, rng: Array, seq_len: int) -> Any:
  """Boxed variables of `model` for inputs [1, seq_len], every head built."""
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  token_levels = tokens if model.single_pass and model.num_levels > 1 else None
  return model.init({'params': rng}, tokens, tokens, jnp.ones((1,), jnp.float32),
                    heads=model.available_heads, token_levels=token_levels, train=False)


def init_params(model: nn.Module, rng: Array, seq_len: int) -> Params:
  """Initialised parameters (the 'params' collection) as plain float32 arrays."""
  variables = jax.jit(lambda r: _init_variables(model, r, seq_len))(rng)
  return nn.meta.unbox(variables['params'])


def abstract_params(model: nn.Module, seq_len: int) -> Params:
  """ShapeDtypeStruct tree of the parameters (jax.eval_shape: nothing is allocated)."""
  boxed = jax.eval_shape(lambda r: _init_variables(model, r, seq_len), jax.random.key(0))
  return nn.meta.unbox(boxed['params'])


def logical_specs(model: nn.Module, seq_len: int) -> Any:
  """PartitionSpec tree of logical axis names, same structure as `init_params`' result.

  `sharding.param_shardings` maps them to mesh shardings (sharding.LOGICAL_RULES).
  """
  boxed = jax.eval_shape(lambda r: _init_variables(model, r, seq_len), jax.random.key(0))
  return nn.get_partition_spec(boxed['params'])


def count_params(params: Params) -> int:
  """Number of scalars in a parameter tree (arrays, ShapeDtypeStructs or logical boxes)."""
  leaves = jax.tree_util.tree_leaves(nn.meta.unbox(params))
  return int(sum(int(np.prod(x.shape)) for x in leaves))


# Top-level parameter names -> report group.
_GROUPS: dict[str, str] = {
    'vocab_embed': 'token embedding', 'wte': 'token embedding',
    'position': 'position embedding', 'candidate_proj': 'input features',
    'sigma_map': 'time embedding', 'time_proj': 'time embedding',
    'ln_f': 'final norm', 'output_layer': 'token head', 'lm_head': 'token head',
    'level_embed': 'level table', 'token_level_embed': 'token-level table',
    'hier_layer': 'hierarchy head', 'hier_head': 'hierarchy head',
    'cluster_layer': 'cluster head', 'cluster_head': 'cluster head',
}
# The parts beyond the MDLM backbone ('hmdlm extras'; HDLM's auxiliary cluster head counts too).
# ADLM's denoiser counts as well (docs/method.md §13.4).
_HMDLM_GROUPS = ('level table', 'token-level table', 'hierarchy trunk', 'hierarchy head',
                 'cluster head', 'adlm denoiser')
_GROUP_ORDER = ('token embedding', 'position embedding', 'input features', 'time embedding',
                'transformer blocks', 'final norm', 'token head') + _HMDLM_GROUPS


def _group(name: str) -> str:
  if name.startswith('blocks_') or name.startswith('h_'):
    return 'transformer blocks'
  if name.startswith(DENOISER_PREFIX):
    return 'adlm denoiser'
  if hierarchy.is_hierarchy_param(name) and name not in _GROUPS:
    return 'hierarchy trunk'  # hier_blocks_i, hier_time_*, hier_level_embed, hier_candidate_proj
  if name not in _GROUPS:
    raise KeyError(f'parameter {name!r} has no report group')
  return _GROUPS[name]


def param_count_breakdown(cfg_model: Any, features: ModelFeatures | None = None
                          ) -> dict[str, int]:
  """{group: count} plus 'mdlm backbone' (all but the HMDLM parts), 'hmdlm extras' and 'total'
  of the model `build_model(cfg_model, features)`."""
  cfg = ModelConfig.from_section(cfg_model)
  params = abstract_params(build_model(cfg, features), cfg.seq_len)
  by_group: dict[str, int] = {}
  for name, sub in params.items():
    g = _group(name)
    by_group[g] = by_group.get(g, 0) + count_params(sub)
  order = list(dict.fromkeys(_GROUP_ORDER))
  out = {g: by_group[g] for g in order if g in by_group}
  extras = sum(v for g, v in out.items() if g in _HMDLM_GROUPS)
  total = sum(out.values())
  out.update({'mdlm backbone': total - extras, 'hmdlm extras': extras, 'total': total})
  return out


def param_count_report(cfg_model: Any, features: ModelFeatures | None = None) -> str:
  """Human-readable parameter breakdown (no allocation: jax.eval_shape)."""
  cfg = ModelConfig.from_section(cfg_model)
  counts = param_count_breakdown(cfg, features)
  lines = [f'{cfg.backbone}: K={cfg.num_levels} V={cfg.vocab_size} H={cfg.hidden_size} '
           f'layers={cfg.num_layers} heads={cfg.num_heads} mlp={cfg.mlp_dim} '
           f'variant={cfg.variant} positions={cfg.position_embedding}']
  for g, v in counts.items():
    if g in ('mdlm backbone', 'hmdlm extras', 'total'):
      continue
    lines.append(f'  {g:<22s}{v:>14,d}')
  lines.append(f"  {'= backbone (MDLM part)':<22s}{counts['mdlm backbone']:>14,d}")
  lines.append(f"  {'+ beyond MDLM':<22s}{counts['hmdlm extras']:>14,d}")
  lines.append(f"  {'total':<22s}{counts['total']:>14,d}")
  return '\n'.join(lines)


__all__ = [
    'BACKBONES', 'DiT', 'GPT2', 'ModelFeatures', 'abstract_params', 'build_model', 'count_params',
    'heads_salt',
    'init_params', 'logical_specs', 'make_apply_fn', 'param_count_breakdown',
    'param_count_report',
]
