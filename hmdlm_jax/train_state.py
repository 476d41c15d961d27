"""The train state: `TrainState`, its shardings, its sharded init and its restore for evaluation.

`jax.eval_shape` of the init gives the state's shapes -> logical axis names give its shardings ->
`jax.jit(init, out_shardings=...)` materialises it already sharded (nanodo's habit). Parameters,
optimiser state and EMA are float32. `train.py` re-exports its public names (`train.TrainState`, ...);
the step and the loop that change the state are there (docs/design.md "Training").
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax import sharding as shd
from hmdlm_jax import warm_start

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """Everything a step changes; saved whole in every checkpoint.

  step:          int32 [] — batches consumed (applied + skipped updates).
  params:        float32 parameter tree.
  ema_params:    EMA of params (optim.ema_update), same tree.
  opt_state:     optax state (its count = applied updates; drives the lr schedule).
  rng:           uint32 [2] — base key; the key of step n is fold_in(rng, n) (never changes).
  bad_steps:     int32 [] — consecutive non-finite steps (0 after a good one).
  skipped_steps: int32 [] — total non-finite (skipped) steps.
  """
  step: jax.Array
  params: PyTree
  ema_params: PyTree
  opt_state: PyTree
  rng: jax.Array
  bad_steps: jax.Array
  skipped_steps: jax.Array


def _init_state(config: config_lib.Config, model: nn.Module,
                optimizer: optax.GradientTransformation) -> TrainState:
  """The initial state from config.seed (traced under jit / eval_shape)."""
  root = jax.random.PRNGKey(int(config.seed))
  params = models.init_params(model, jax.random.fold_in(root, 0), int(config.model.seq_len))
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      ema_params=jax.tree.map(jnp.copy, params), opt_state=optimizer.init(params),
      rng=jax.random.fold_in(root, 1), bad_steps=jnp.zeros((), jnp.int32),
      skipped_steps=jnp.zeros((), jnp.int32))


def state_shardings(config: config_lib.Config, model: nn.Module, mesh: jax.sharding.Mesh,
                    optimizer: optax.GradientTransformation | None = None
                    ) -> tuple[TrainState, TrainState]:
  """(abstract state with shardings attached, sharding tree) for `TrainState`.

  Parameters (and EMA, Adam moments) follow the models' logical axis names mapped by
  sharding.LOGICAL_RULES; counters and keys are replicated.
  """
  optimizer = optimizer or optim.for_run(config)
  seq_len = int(config.model.seq_len)
  abstract = jax.eval_shape(lambda: _init_state(config, model, optimizer))
  abs_params = models.abstract_params(model, seq_len)
  p_sh = shd.param_shardings(models.logical_specs(model, seq_len), abs_params, mesh)
  rep = shd.replicated(mesh)
  sh = TrainState(
      step=rep, params=p_sh, ema_params=p_sh,
      opt_state=shd.shardings_like_params(abstract.opt_state, p_sh, abs_params, mesh),
      rng=rep, bad_steps=rep, skipped_steps=rep)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, sh)
  return abstract, sh


def create_train_state(config: config_lib.Config, mesh: jax.sharding.Mesh,
                       model: nn.Module) -> tuple[TrainState, TrainState]:
  """Initial TrainState of `model` (the task's: tasks.build_model), created directly in its
  shardings (eval_shape -> shardings -> jit).

  Returns:
    (state, sharding tree).
  """
  optimizer = optim.for_run(config)
  _, sh = state_shardings(config, model, mesh, optimizer)
  with shd.mesh_context(mesh):
    state = jax.jit(lambda: _init_state(config, model, optimizer), out_shardings=sh)()
  if warm_start.requested(config):  # init.workdir / init.mdlm_checkpoint (docs/method.md §13.2)
    state = warm_start.apply(config, state, sh, model)
  return state, sh


def restore_for_eval(config: config_lib.Config, workdir: str, step: int | None = None,
                     *, model: nn.Module) -> tuple[TrainState, int]:
  """(TrainState, step) of checkpoint `step` (default latest) of DIR, for evaluation/sampling.

  `model`: the run's network (tasks.build_model). Restores on the config's mesh (`config.mesh`,
  all devices); nothing in DIR is written. With `step` None the latest step is re-selected when a
  training run still writing DIR deletes the one chosen (checkpoint.Checkpointer.read_latest).
  """
  mesh = shd.make_mesh(config.mesh)
  abstract, _ = state_shardings(config, model, mesh)
  ckpt = ckpt_lib.Checkpointer(workdir, config.train, read_only=True)
  try:
    state, meta = ckpt.restore(abstract, None, step)
  finally:
    ckpt.close()
  return state, int(meta['step'])

