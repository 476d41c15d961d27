"""Optimiser (docs/method.md §9): AdamW, linear warm-up then constant or cosine, clipping, EMA.

Clipping: one global-norm clip over all parameters (`optim.grad_clip`), or, with
`optim.hier_grad_clip > 0`, one clip per group: the hierarchy-only parameters ('hier_*',
`models.hierarchy.is_hierarchy_param`) to `hier_grad_clip` and the rest to `grad_clip`
(`clip_by_group_global_norm`), so a large level-head gradient cannot shrink the backbone's step.
`optim.hier_lr_scale` multiplies the hierarchy-only parameters' learning rate (`scale_by_group`
after AdamW): on configs/sudoku_learned_hierarchy.py no level-loss gradient reaches the token
network, so the pathway can learn faster without touching the backbone's step.

Gradient accumulation is not an optax wrapper here: `train.py` splits the batch into micro-batches
inside one jitted step (`lax.scan`) and hands the averaged gradient to this optimiser, so one
optimiser update = one global batch whatever `train.grad_accum` is. A distillation target frozen
per round (`frozen_target`, docs/method.md §13.2) lives in the optimiser state of the runs using it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from hmdlm_jax.config import kinds as config_kinds
from hmdlm_jax.models import hierarchy

DECAYS = ('constant', 'cosine')
GROUPS = ('backbone', 'hier')  # parameter groups of `param_groups`


def make_lr_schedule(optim_cfg: Any, num_steps: int) -> optax.Schedule:
  """Learning rate at optimiser update n: linear 0 -> lr over `warmup_steps`, then constant, or
  cosine from lr to `decay_floor` · lr at `num_steps` (docs/method.md §9: 2,500 warm-up steps then
  constant on LM1B; HDLM's OWT runs: 10k warm-up, cosine to 0.1 · lr)."""
  lr = float(optim_cfg.lr)
  warmup = int(optim_cfg.warmup_steps)
  if optim_cfg.decay == 'constant':
    after = optax.constant_schedule(lr)
  else:
    after = optax.cosine_decay_schedule(lr, decay_steps=max(int(num_steps) - warmup, 1),
                                        alpha=float(optim_cfg.decay_floor))
  if warmup == 0:
    return after
  warm = optax.linear_schedule(0.0, lr, transition_steps=warmup)
  return optax.join_schedules([warm, after], boundaries=[warmup])


def _decay_mask(params: Any) -> Any:
  """Weight decay only on arrays with ndim >= 2 (kernels, embedding tables), not on biases or
  norm scales, as is usual for AdamW on transformers (docs/method.md §9: weight_decay = 0 on LM1B)."""
  return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def param_groups(tree: Any) -> Any:
  """The group of every leaf of a parameter-shaped tree: 'hier' under a top-level 'hier_*' name
  (models/hierarchy.py `is_hierarchy_param`), 'backbone' elsewhere (level table included)."""
  if not isinstance(tree, Mapping):
    raise ValueError('param_groups expects the parameter dict (top-level names -> subtrees).')
  return {name: jax.tree.map(lambda _, g=('hier' if hierarchy.is_hierarchy_param(name)
                                          else 'backbone'): g, sub)
          for name, sub in tree.items()}


def _norms_by_label(tree: Any, labels: Any) -> dict[str, jax.Array]:
  """{label: global L2 norm of the leaves with that label} ([] float32 each)."""
  sq: dict[str, jax.Array] = {}
  for x, lab in zip(jax.tree.leaves(tree), jax.tree.leaves(labels)):
    sq[lab] = sq.get(lab, 0.0) + jnp.sum(jnp.square(jnp.asarray(x, jnp.float32)))
  return {lab: jnp.sqrt(v) for lab, v in sq.items()}


def group_norms(tree: Any) -> dict[str, jax.Array]:
  """Global L2 norm of each group of `param_groups` ([] float32; 0 for an empty group)."""
  norms = _norms_by_label(tree, param_groups(tree))
  return {g: norms.get(g, jnp.zeros((), jnp.float32)) for g in GROUPS}


def grad_metrics(optim_cfg: Any, grads: Any) -> dict[str, jax.Array]:
  """What the train step logs of a gradient, float32 [] each: 'grad_norm' (global, before
  clipping; the step's guard reads it) and, with optim.hier_grad_clip > 0 only (the default log
  is unchanged), 'hier_grad_norm', the norm of the 'hier' group (`group_norms`)."""
  out = {'grad_norm': optax.global_norm(grads)}
  if float(optim_cfg.hier_grad_clip) > 0:
    out['hier_grad_norm'] = group_norms(grads)['hier']
  return out


def clip_by_group_global_norm(max_norms: Mapping[str, float],
                              groups: Callable[[Any], Any] = param_groups
                              ) -> optax.GradientTransformation:
  """Clip each group of leaves to its own global norm: u_g <- u_g · min(1, max_g / ||u_g||).

  max_norms: {group: limit}; a limit of 0, or a group not named, leaves that group unclipped.
  groups(updates) -> the same tree with a group name per leaf (default `param_groups`).
  """

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    del params
    labels = groups(updates)
    norms = _norms_by_label(updates, labels)
    scale = {g: jnp.minimum(1.0, float(m) / jnp.maximum(norms[g], 1e-30))
             for g, m in max_norms.items() if g in norms and float(m) > 0}
    new = jax.tree.map(lambda u, g: (u * scale[g]).astype(u.dtype) if g in scale else u,
                       updates, labels)
    return new, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_group(factors: Mapping[str, float],
                   groups: Callable[[Any], Any] = param_groups) -> optax.GradientTransformation:
  """Multiply each group's updates by its factor: u_g <- f_g · u_g (after AdamW: a per-group
  learning-rate multiplier, weight decay included). A group not named keeps its updates."""

  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    del params
    new = jax.tree.map(lambda u, g: (u * float(factors[g])).astype(u.dtype) if g in factors else u,
                       updates, groups(updates))
    return new, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class FrozenTargetState(NamedTuple):
  """The frozen-round target: `params` = the parameters at the start of round `round`.

  count: int32 [] updates applied so far; round: int32 [] (-1 before the first update).
  """
  count: jax.Array
  round: jax.Array
  params: Any


def _round_of(state: FrozenTargetState, params: Any, steps_per_round: int
              ) -> tuple[jax.Array, Any]:
  """(round of the next update, its target): `params` at a round's first update, else held."""
  r = jnp.floor_divide(state.count, steps_per_round).astype(jnp.int32)
  fresh = r != state.round
  return r, jax.tree.map(lambda p, t: jnp.where(fresh, p, t), params, state.params)


def frozen_target(steps_per_round: int) -> optax.GradientTransformation:
  """Identity on the updates; its state holds the target of the round (`FrozenTargetState`).

  At update n (0-based) of round r = n // steps_per_round, the target is the parameters the
  update receives (before it) when n is the round's first update, else the stored copy.
  """
  if steps_per_round < 1:
    raise ValueError(f'steps_per_round={steps_per_round} must be >= 1.')

  def init(params: Any) -> FrozenTargetState:
    return FrozenTargetState(jnp.zeros((), jnp.int32), jnp.full((), -1, jnp.int32),
                             jax.tree.map(jnp.copy, params))

  def update(updates: Any, state: FrozenTargetState, params: Any = None
             ) -> tuple[Any, FrozenTargetState]:
    r, target = _round_of(state, params, steps_per_round)
    return updates, FrozenTargetState(state.count + 1, r, target)

  return optax.GradientTransformation(init, update)


def round_target(opt_state: Any, params: Any, steps_per_round: int) -> Any:
  """The target the next update's loss reads (the same tree `frozen_target` then stores)."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
      s, FrozenTargetState)) if isinstance(s, FrozenTargetState)]
  if len(found) != 1:
    raise ValueError('the optimiser state holds no frozen target; build it with '
                     'make_optimizer(..., target_every=steps_per_round).')
  return _round_of(found[0], params, steps_per_round)[1]


def make_optimizer(optim_cfg: Any, num_steps: int, target_every: int = 0
                   ) -> optax.GradientTransformation:
  """clip -> AdamW(lr schedule, b1, b2, eps, weight_decay) (-> scale_by_group)
  (-> frozen_target(target_every) when target_every > 0).

  clip: clip_by_global_norm(grad_clip) over all parameters, or, with optim.hier_grad_clip > 0,
  `clip_by_group_global_norm` with grad_clip for the backbone group and hier_grad_clip for the
  hierarchy-only parameters (module docstring).

  `inject_hyperparams` exposes the current learning rate in the optimiser state (`hyperparams`)
  so the step can log exactly the lr it applied (the backbone's; the hierarchy group's is
  optim.hier_lr_scale times it).
  """
  schedule = make_lr_schedule(optim_cfg, num_steps)
  clip = float(optim_cfg.grad_clip)

  @optax.inject_hyperparams
  def adamw(learning_rate: Any) -> optax.GradientTransformation:
    return optax.adamw(learning_rate, b1=float(optim_cfg.b1), b2=float(optim_cfg.b2),
                       eps=float(optim_cfg.eps),
                       weight_decay=float(optim_cfg.weight_decay), mask=_decay_mask)

  hier_clip = float(optim_cfg.hier_grad_clip)
  parts = []
  if hier_clip > 0.0:
    parts.append(clip_by_group_global_norm({'backbone': clip, 'hier': hier_clip}))
  elif clip > 0.0:
    parts.append(optax.clip_by_global_norm(clip))
  parts.append(adamw(learning_rate=schedule))
  hier_lr_scale = float(optim_cfg.hier_lr_scale)
  if hier_lr_scale != 1.0:
    parts.append(scale_by_group({'hier': hier_lr_scale}))
  if target_every > 0:
    parts.append(frozen_target(int(target_every)))
  return optax.chain(*parts)


def for_run(config: Any) -> optax.GradientTransformation:
  """The run's optimiser: `make_optimizer` with the frozen target of a MultiMDM distillation
  with process.multimdm.target='frozen_rounds' (docs/method.md §13.2)."""
  return make_optimizer(config.optim, int(config.train.num_steps),
                        config_kinds.steps_per_round(config))


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
  if bool(optim_cfg.ema_warmup):
    n = jnp.asarray(num_updates, jnp.float32)
    decay = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
  return decay


def ema_update(ema_params: Any, params: Any, decay: jax.Array) -> Any:
  """ema <- decay * ema + (1 - decay) * params, leafwise in float32."""
  return jax.tree.map(lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype),
                      ema_params, params)
