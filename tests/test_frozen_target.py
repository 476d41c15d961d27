"""MultiMDM distillation's target θ̄ frozen per round (docs/method.md §13.2; optim.frozen_target,
read through `Process.target_params`).

A few real train steps of a tiny MultiMDM distillation: with process.multimdm.target=
'frozen_rounds' the target the loss reads is the student's parameters at the round's first step,
bit for bit, and does not move within the round; the per-step EMA target is the default. The
rounds must divide train.num_steps (one error naming the field).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.config_helpers import resolved

from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import sharding as shd
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.configs import multimdm_sudoku

STEPS, ROUNDS = 6, 3


def _config(**changes):
  tiny = {'model.num_layers': 1, 'model.hidden_size': 32, 'model.num_heads': 2,
          'model.mlp_dim': 64, 'model.cond_dim': 16, 'model.dropout': 0.0,
          'data.batch_size': 4, 'train.num_steps': STEPS, 'optim.lr': 1e-2}
  tiny.update(changes)
  return resolved(multimdm_sudoku.get_config('distill'), **tiny)


def _leaves(tree) -> list[np.ndarray]:
  return [np.array(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _run(cfg, num_steps: int, check_loss_at: tuple[int, ...] = ()):
  """[(params before step n, target read at step n, EMA before step n)] for n < num_steps.

  At the steps `check_loss_at` the step's logged loss must equal the process's loss recomputed
  with that target (so the train step really feeds it to the loss).
  """
  mesh = shd.make_mesh(cfg.mesh, jax.devices()[:1])
  model = tasks.build_model(cfg)
  state, sh = train.create_train_state(cfg, mesh, model)
  process = processes.build(cfg).for_devices(1)
  step = train.make_train_step(cfg, model, process, mesh, sh)
  rng = np.random.default_rng(0)
  out = []
  for n in range(num_steps):
    params = jax.device_get(state.params)
    # The θ̄ the step hands the loss (Process.target_params; the round's copy lives in the
    # optimiser state, optim.frozen_target).
    target = jax.device_get(process.target_params(state.params, state.ema_params,
                                                  state.opt_state))
    out.append((_leaves(params), _leaves(target), _leaves(state.ema_params)))
    shape = (4, 81)
    batch = {'tokens': jnp.asarray(rng.integers(0, 9, shape), jnp.int32),
             'levels': jnp.zeros(shape, jnp.int32), 'given': jnp.zeros(shape, bool),
             'loss_mask': jnp.ones(shape, bool)}
    loss_key = jax.random.split(jax.random.fold_in(state.rng, n))[0]
    state, m = step(state, shd.make_global_batch(batch, mesh))
    assert float(m['update_ok']) == 1.0
    if n in check_loss_at:
      want, _ = process.loss(models.make_apply_fn(model, params, train=False), batch, loss_key,
                             step=jnp.int32(n),
                             target_apply_fn=models.make_apply_fn(model, target, train=False))
      np.testing.assert_allclose(float(m['loss']), float(want), rtol=1e-5)
  return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_frozen_target_is_the_student_at_each_round_start():
  cfg = _config(**{'process.multimdm.target': 'frozen_rounds',
                   'process.multimdm.rounds': ROUNDS})
  per_round = STEPS // ROUNDS
  run = _run(cfg, STEPS, check_loss_at=(1, 2))
  for n, (params, target, _) in enumerate(run):
    start = n - n % per_round
    assert _same(target, run[start][0]), f'step {n}: target is not the params of step {start}'
    if n % per_round:
      assert not _same(params, target), f'step {n}: the student did not move (test is blind)'
  # Held within a round, replaced at the next one.
  assert _same(run[1][1], run[0][1]) and not _same(run[2][1], run[1][1])


def test_ema_target_is_the_default_and_moves_every_step():
  cfg = _config()
  assert cfg.process.multimdm.target == 'ema'
  run = _run(cfg, 3)
  decay = float(cfg.optim.ema_decay)
  for n in (1, 2):
    params, target, ema = run[n]
    assert _same(target, ema)
    # ema_n = d · ema_{n-1} + (1 - d) · params_n (params after update n-1 = before step n).
    want = [decay * e + (1 - decay) * p for e, p in zip(run[n - 1][2], params)]
    for w, got in zip(want, ema):
      np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('changes, match', [
    ({'process.multimdm.target': 'frozen_rounds', 'process.multimdm.rounds': 4},
     r'process\.multimdm\.rounds=4 must divide train\.num_steps=6.*rounds=3'),
    ({'process.multimdm.target': 'frozen_rounds', 'process.multimdm.distill': False},
     r"process\.multimdm\.target='frozen_rounds' is the target of a distillation"),
    ({'process.multimdm.target': 'frozen'}, r"process\.multimdm\.target='frozen' is not one of"),
])
def test_rounds_config_errors_name_the_field(changes, match):
  with pytest.raises(ValueError, match=match):
    _config(**changes)
