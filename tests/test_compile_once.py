"""The real train step compiles exactly once over 20 steps of fresh batches (in-process, XLA events).

Complements tests/test_train.py::test_train_step_compiles_once (which reads the jit cache size after
the 150-step reference run of `python -m hmdlm_jax.main`): here every XLA compilation of the process
is counted through JAX's backend-compile event while the benchmark harness (benchmarks/train_step.py)
drives `train.make_train_step`, so a recompilation of anything, not only of the step, fails, and
the timed steps of the benchmarks are known to measure no compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import compile_count
from benchmarks import train_step as ts
from hmdlm_jax import config as config_lib
from hmdlm_jax import sharding as shd

NUM_STEPS = 20


def test_counter_sees_every_compilation():
  counter = compile_count.compile_counter()
  n0 = len(counter.events)
  f = jax.jit(lambda x: x * 2 + 1)
  f(jnp.ones((3,), jnp.float32))
  f(jnp.ones((3,), jnp.float32))  # cached: no compilation
  f(jnp.ones((4,), jnp.float32))  # new shape: a second compilation
  names = [n for n, _ in counter.events[n0:]]
  assert sum('<lambda>' in n for n in names) == 2, names


def test_train_step_compiles_once_over_20_steps():
  from hmdlm_jax.configs import tiny_test  # pylint: disable=g-import-not-at-top
  config = tiny_test.get_config()
  config.train.num_steps = NUM_STEPS
  config = config_lib.resolve(config)
  step, state, _ = ts.real_step(config)  # the package's step, built as the benchmarks build it
  mesh = shd.make_mesh(config.mesh)
  counter = compile_count.compile_counter()
  n0 = len(counter.events)
  after_first = None
  losses = []
  for i in range(NUM_STEPS):
    # A fresh host batch every step (new values, same shapes), as the data pipeline delivers.
    batch = shd.make_global_batch(ts.synthetic_batch(config, seed=i), mesh)
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
    if i == 0:
      after_first = len(counter.events)
  names = [n for n, _ in counter.events[n0:]]
  assert sum('step_fn' in n for n in names) == 1, names
  assert len(counter.events) == after_first, f'compiled after step 1: {names}'
  assert step.jitted._cache_size() == 1  # pylint: disable=protected-access
  assert int(state.step) == NUM_STEPS
  assert np.all(np.isfinite(losses))
