"""Fault injection for the NaN guard (hmdlm_jax/faults.py, `train.debug_nan_steps`).

The wrapped process's training loss is NaN exactly at the listed steps and bit-identical to the
process's own elsewhere; every other part of the process (what the train step and the loop read)
is the wrapped one's; no listed step leaves the process itself (an ordinary run compiles the same
program). The guard's behaviour on such steps in a real run: tests/test_train.py
(`test_nan_steps_are_skipped_and_run_stops`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import faults
from hmdlm_jax.processes import adlm
from hmdlm_jax.processes import multimdm
from hmdlm_jax.processes import multimdm_distill
from hmdlm_jax.processes import schedules

V, M, L = 5, 2, 6


def _apply_fn(tokens, levels, t, *, heads, **kwargs):
  """A fixed network: logits that depend on the input tokens and time (finite loss)."""
  del levels, kwargs
  table = jnp.sin(jnp.arange((V + M) * (V + M), dtype=jnp.float32)).reshape(V + M, V + M)
  return {h: table[tokens] * (1.0 + t[:, None, None]) for h in heads}


def _batch() -> dict[str, jax.Array]:
  tokens = jnp.asarray(np.arange(2 * L).reshape(2, L) % V, jnp.int32)
  return {'tokens': tokens, 'levels': jnp.zeros_like(tokens),
          'given': jnp.zeros(tokens.shape, bool), 'loss_mask': jnp.ones(tokens.shape, bool)}


def test_the_loss_is_nan_exactly_at_the_listed_steps():
  process = multimdm.make(V, M)
  wrapped = faults.with_nan_steps(process, [3, 5])
  key = jax.random.key(0)
  loss_at = jax.jit(lambda p, step: p.loss(_apply_fn, _batch(), key, step=step),
                    static_argnums=0)
  for step in range(7):
    want, want_aux = loss_at(process, jnp.int32(step))
    got, got_aux = loss_at(wrapped, jnp.int32(step))
    assert np.isfinite(float(want))
    if step in (3, 5):
      assert np.isnan(float(got)), step
    else:
      assert float(got) == float(want), step  # bit-identical off the listed steps
    assert {k: float(v) for k, v in got_aux.items()} == {k: float(v) for k, v in want_aux.items()}
  # The gradient is NaN at a listed step too (what the guard reads).
  grad = jax.grad(lambda s: wrapped.loss(lambda *a, **k: {h: s * v for h, v in _apply_fn(
      *a, **k).items()}, _batch(), key, step=jnp.int32(3))[0])(jnp.float32(1.0))
  assert np.isnan(float(grad))
  # Outside training (no step) the loss is the process's own.
  assert float(wrapped.loss(_apply_fn, _batch(), key)[0]) == float(
      process.loss(_apply_fn, _batch(), key)[0])


def test_no_listed_step_leaves_the_process_itself():
  process = multimdm.make(V, M)
  assert faults.with_nan_steps(process, ()) is process
  assert faults.with_nan_steps(process, [0]) is not process


def test_the_wrapper_is_the_process_everywhere_else():
  distill = multimdm_distill.make(V, M, distill=True)
  wrapped = faults.with_nan_steps(distill, [1])
  assert wrapped.uses_target and wrapped.heads == distill.heads
  assert wrapped.extra_batch_keys == distill.extra_batch_keys
  params, ema = {'w': jnp.zeros(3)}, {'w': jnp.ones(3)}
  assert wrapped.target_params(params, ema, ()) is distill.target_params(params, ema, ())
  anchored = faults.with_nan_steps(adlm.make(schedules.Schedule('loglinear', (0.0,)), mask_id=V), [1])
  assert dict(anchored.extra_batch_keys) == {'anchors': jnp.bool_}
  # The mesh's settings resolve on the wrapped process; the result is still wrapped.
  on_mesh = wrapped.for_devices(4)
  assert isinstance(on_mesh, faults.NaNAtSteps) and on_mesh.steps == (1,)
  assert on_mesh.process == distill.for_devices(4)
  assert hash(wrapped) == hash(faults.with_nan_steps(distill, [1]))  # a static jit argument


def test_too_many_steps_is_one_error_naming_the_field():
  faults.check_steps(range(faults.MAX_STEPS))
  with pytest.raises(ValueError, match=r'train\.debug_nan_steps holds 17 steps; at most 16'):
    faults.with_nan_steps(multimdm.make(V, M), range(faults.MAX_STEPS + 1))
