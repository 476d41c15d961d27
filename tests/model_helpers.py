"""Helpers of the model tests (tests/test_models*.py): a tiny model config, perturbed parameters
and a jitted apply_fn cached per (model, heads), so a file compiles a few dozen small programs.

adaLN-zero: every DiT block's modulation Linear and both heads' output Linears start at zero, so
at initialisation the logits are exactly 0; tests that need informative outputs or gradients use
`random_params` (the init plus N(0, 0.1²) noise).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.tasks import sudoku_model

B, L, V = 2, 8, 11


def set_pathway(section, over: dict) -> None:
  """Moves the `hier_<field>=v` entries of `over` (shorthand of the tests) into
  `section.pathway.<field>` of a `model` ConfigDict section."""
  for f in dataclasses.fields(config_lib.schema.PathwayConfig):
    if f'hier_{f.name}' in over:
      section.pathway[f.name] = over.pop(f'hier_{f.name}')


def model_cfg(**over):
  """A tiny model config section (configs/base.py schema); `hier_<field>=v` is shorthand for
  model.pathway.<field> = v (the level pathway's section)."""
  c = get_base_config().model
  c.update(dict(num_levels=3, vocab_size=V, seq_len=L, num_layers=1, hidden_size=16, num_heads=2,
                mlp_dim=32, cond_dim=8, dropout=0.1))
  set_pathway(c, over)
  c.update(over)
  return c


def build(cfg):
  """models.build_model with the features the Sudoku task gives this `model` section (none unless
  it asks for grid positions or candidates), as tasks.build_model builds a Sudoku run's."""
  return models.build_model(cfg, sudoku_model.model_features(cfg))


def random_params(model, seq_len, seed, scale=0.1):
  """Parameters of the real shapes (eval_shape, nothing compiled) with random values: the init
  (adaLN-zero) plus N(0, scale²) noise, i.e. LayerNorm weights 1 + noise, everything else noise.
  numpy draws keep the 2-core test machine from compiling one random kernel per shape."""
  r = np.random.default_rng(seed)
  abstract = models.abstract_params(model, seq_len)

  def draw(path, x):
    base = 1.0 if jax.tree_util.keystr(path).endswith("['weight']") else 0.0
    return jnp.asarray(base + scale * r.normal(size=x.shape), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, abstract)


@functools.lru_cache(maxsize=None)
def _setup_cached(items):
  over = dict(items)
  seed = over.pop('_seed')
  cfg = model_cfg(**over)
  model = build(cfg)
  return cfg, model, random_params(model, cfg.seq_len, seed)


def setup(seed=0, **over):
  return _setup_cached(tuple(sorted(over.items())) + (('_seed', seed),))


@functools.lru_cache(maxsize=None)
def _jitted_apply(model, heads, train):
  def f(params, tokens, levels, t, token_levels, rng):
    return models.make_apply_fn(model, params, train=train, rng=rng)(
        tokens, levels, t, heads=heads, token_levels=token_levels)
  return jax.jit(f)


def fwd(model, params, tokens, levels, t, heads=('hier', 'token'), token_levels=None,
         train=False, rng=None):
  """The apply_fn of make_apply_fn, jitted once per (model, heads, train); numpy outputs (eager
  jnp ops on the results would compile one kernel per shape)."""
  out = _jitted_apply(model, tuple(heads), train)(params, tokens, levels, t, token_levels, rng)
  return jax.device_get(out)


def inputs(seed=0, k=3, length=L):
  r = np.random.default_rng(seed)
  tokens = jnp.asarray(r.integers(0, V, (B, length)), jnp.int32)
  levels = jnp.asarray(r.integers(0, k + 1, (B, length)), jnp.int32)
  t = jnp.asarray(r.uniform(0.05, 1.0, (B,)), jnp.float32)
  return tokens, levels, t
