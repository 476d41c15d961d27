"""Fault injection for tests of the train step's NaN guard (`train.debug_nan_steps`).

`with_nan_steps(process, steps)` is the process whose training loss is multiplied by NaN at the
listed (0-based) steps, so that the loss and every gradient of those steps are NaN and the step's
guard skips them (train.make_train_step, docs/design.md "Training"). The run applies it where it
builds the step (`train.train_and_evaluate`); the train step itself knows nothing of it, and a run
without listed steps compiles exactly the program it would without this module.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from hmdlm_jax.processes import base

# The listed steps are compiled into the step as one comparison each; a test needs a few.
MAX_STEPS = 16


def check_steps(steps: Sequence[int]) -> None:
  """ValueError when `train.debug_nan_steps` lists more than MAX_STEPS steps."""
  if len(steps) > MAX_STEPS:
    raise ValueError(f'train.debug_nan_steps holds {len(steps)} steps; at most {MAX_STEPS} are '
                     'allowed.')


def poison(step: jax.Array | None, steps: tuple[int, ...]) -> jax.Array:
  """float32 []: NaN when `step` (int32 [], traced) is one of `steps`, else 1.0.

  Python comparisons of the traced step, no array of the steps: nothing is put on a device.
  """
  if step is None or not steps:
    return jnp.float32(1.0)
  hit = functools.reduce(jnp.logical_or, [step == s for s in steps])
  return jnp.where(hit, jnp.float32(jnp.nan), jnp.float32(1.0))


@dataclasses.dataclass(frozen=True)
class NaNAtSteps:
  """`process` with a training loss that is NaN at `steps` (`poison`); everything else (the
  process's properties, batch preparation, bounds, sampling) is the wrapped process's own."""
  process: base.Process
  steps: tuple[int, ...]

  def __getattr__(self, name: str) -> Any:
    if name in ('process', 'steps'):  # not yet set (copy / unpickling): no recursion
      raise AttributeError(name)
    return getattr(self.process, name)

  def for_devices(self, num_devices: int) -> NaNAtSteps:
    return dataclasses.replace(self, process=self.process.for_devices(num_devices))

  def loss(self, apply_fn: base.ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: base.ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The process's loss times `poison(step)`: its gradients are NaN at a listed step too."""
    loss, aux = self.process.loss(apply_fn, batch, key, step=step,
                                  target_apply_fn=target_apply_fn)
    return loss * poison(step, self.steps), aux


def with_nan_steps(process: base.Process, steps: Sequence[int]) -> base.Process:
  """The process the train step runs for `train.debug_nan_steps = steps`: `process` itself when
  no step is listed, else `NaNAtSteps` (checked by `check_steps`)."""
  check_steps(steps)
  if not steps:
    return process
  return NaNAtSteps(process, tuple(int(s) for s in steps))  # type: ignore[return-value]
