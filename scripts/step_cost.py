"""Matmul FLOPs of one training step (loss + gradient) of configs/sudoku.py with overrides.

Used to turn a wall budget into step budgets that do not depend on how loaded the machine is:
  python -m scripts.step_cost --set model.num_levels=1 --set model.hier_layers=1 ...
prints the FLOPs per step and the ratio to the default demo's step.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from benchmarks import flops
from configs import sudoku as sudoku_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import processes
from scripts.probe_levels import _override


def step_flops(config) -> int:
  config = config_lib.resolve(config)
  model = models.build_model(config.model)
  process = processes.build(config)
  params = models.abstract_params(model, 81)
  b = config.data.batch_size
  batch = {'tokens': jnp.zeros((b, 81), jnp.int32), 'levels': jnp.zeros((b, 81), jnp.int32),
           'given': jnp.zeros((b, 81), bool), 'loss_mask': jnp.ones((b, 81), bool)}

  def loss(p):
    return process.loss(models.make_apply_fn(model, p, train=False), batch, jax.random.key(0))[0]

  params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
  return flops.jaxpr_matmul_flops(jax.value_and_grad(loss), params)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument('--set', action='append', default=[])
  args = ap.parse_args()
  base = step_flops(sudoku_config.get_config())
  mine = step_flops(_override(sudoku_config.get_config(), args.set))
  print(f'{mine / 1e9:.2f} GFLOP per step; {mine / base:.3f} x the default demo '
        f'({base / 1e9:.2f} GFLOP)')


if __name__ == '__main__':
  main()
