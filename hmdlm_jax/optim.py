"""Optimiser (docs/method.md §9): AdamW, linear warm-up then constant or cosine, global-norm clipping, EMA.

Gradient accumulation is not an optax wrapper here: `train.py` splits the batch into micro-batches
inside one jitted step (`lax.scan`) and hands the averaged gradient to this optimiser, so one
optimiser update = one global batch whatever `train.grad_accum` is.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

DECAYS = ('constant', 'cosine')


def validate_optim_config(optim_cfg: Any) -> None:
  """Raises ValueError naming the `optim.*` field that is out of range."""
  o = optim_cfg
  if not float(o.lr) > 0.0:
    raise ValueError(f'optim.lr={o.lr} must be > 0.')
  if int(o.warmup_steps) < 0:
    raise ValueError(f'optim.warmup_steps={o.warmup_steps} must be >= 0.')
  if o.decay not in DECAYS:
    raise ValueError(f'optim.decay={o.decay!r} is not one of {DECAYS}.')
  for name in ('b1', 'b2'):
    v = float(getattr(o, name))
    if not 0.0 <= v < 1.0:
      raise ValueError(f'optim.{name}={v} must lie in [0, 1).')
  if float(o.weight_decay) < 0.0:
    raise ValueError(f'optim.weight_decay={o.weight_decay} must be >= 0.')
  if float(o.grad_clip) < 0.0:
    raise ValueError(f'optim.grad_clip={o.grad_clip} must be >= 0 (0 = no clipping).')
  if not 0.0 <= float(o.ema_decay) < 1.0:
    raise ValueError(f'optim.ema_decay={o.ema_decay} must lie in [0, 1).')


def make_lr_schedule(optim_cfg: Any, num_steps: int) -> optax.Schedule:
  """Learning rate at optimiser update n: linear 0 -> lr over `warmup_steps`, then constant, or
  cosine from lr to 0 at `num_steps` (docs/method.md §9: 2,500 warm-up steps then constant on LM1B)."""
  validate_optim_config(optim_cfg)
  lr = float(optim_cfg.lr)
  warmup = int(optim_cfg.warmup_steps)
  if optim_cfg.decay == 'constant':
    after = optax.constant_schedule(lr)
  else:
    after = optax.cosine_decay_schedule(lr, decay_steps=max(int(num_steps) - warmup, 1))
  if warmup == 0:
    return after
  warm = optax.linear_schedule(0.0, lr, transition_steps=warmup)
  return optax.join_schedules([warm, after], boundaries=[warmup])


def _decay_mask(params: Any) -> Any:
  """Weight decay only on arrays with ndim >= 2 (kernels, embedding tables), not on biases or
  norm scales, as is usual for AdamW on transformers (docs/method.md §9 uses weight_decay = 0 anyway)."""
  return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(optim_cfg: Any, num_steps: int) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(lr schedule, b1, b2, weight_decay).

  `inject_hyperparams` exposes the current learning rate in the optimiser state (`hyperparams`)
  so the step can log exactly the lr it applied.
  """
  schedule = make_lr_schedule(optim_cfg, num_steps)
  clip = float(optim_cfg.grad_clip)

  @optax.inject_hyperparams
  def adamw(learning_rate: Any) -> optax.GradientTransformation:
    return optax.adamw(learning_rate, b1=float(optim_cfg.b1), b2=float(optim_cfg.b2),
                       weight_decay=float(optim_cfg.weight_decay), mask=_decay_mask)

  parts = []
  if clip > 0.0:
    parts.append(optax.clip_by_global_norm(clip))
  parts.append(adamw(learning_rate=schedule))
  return optax.chain(*parts)


def current_lr(opt_state: Any) -> jax.Array:
  """The learning rate the last `update` used (from `inject_hyperparams`' state)."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: hasattr(s, 'hyperparams'))
           if hasattr(s, 'hyperparams')]
  if not found:
    raise ValueError('optimiser state has no injected hyperparams; build it with make_optimizer.')
  return jnp.asarray(found[0].hyperparams['learning_rate'], jnp.float32)


def ema_decay_at(optim_cfg: Any, num_updates: jax.Array) -> jax.Array:
  """EMA decay for the update number `num_updates` (0-based count of applied updates).

  Fixed `ema_decay` (MDLM's EMA), or with `optim.ema_warmup` the usual ramp
  min(decay, (1 + n) / (10 + n)) so that short runs are not dominated by the initial weights.
  """
  decay = jnp.float32(optim_cfg.ema_decay)
  if bool(optim_cfg.get('ema_warmup', False)):
    n = jnp.asarray(num_updates, jnp.float32)
    decay = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
  return decay


def ema_update(ema_params: Any, params: Any, decay: jax.Array) -> Any:
  """ema <- decay * ema + (1 - decay) * params, leafwise in float32."""
  return jax.tree.map(lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype),
                      ema_params, params)
