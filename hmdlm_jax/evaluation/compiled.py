"""A denoiser kept apart from its parameters, and the evaluation programs compiled for it.

Evaluators (perplexity, sampling, Sudoku solving) take an `apply_fn` (the denoiser contract of
docs/design.md). Given a `Bound` -- a `Network` and its parameters -- they jit their program with
the parameters as a traced argument and keep it on the `Network`, so one compilation serves every
checkpoint and every evaluation of a training run. The caller owns the `Network` (one per run or
training loop; evaluation/run.py); nothing is cached at module level. Any other apply_fn works too
and is compiled per evaluator call.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Hashable

import flax.linen as nn
import jax

from hmdlm_jax import models

ApplyFn = Callable[..., dict]


class Network:
  """`builder(params) -> apply_fn` and the programs compiled on it, keyed by what they close over.

  Attributes:
    builder: params -> apply_fn (traceable: the params may be tracers).
  """

  def __init__(self, builder: Callable[[Any], ApplyFn]) -> None:
    self.builder = builder
    self._programs: dict[Hashable, Callable[..., Any]] = {}

  def bind(self, params: Any) -> Bound:
    return Bound(self, params)

  def program(self, key: Hashable, make: Callable[[ApplyFn], Callable[..., Any]]
              ) -> Callable[..., Any]:
    """`jax.jit(lambda params, *args: make(builder(params))(*args))`, made once per `key`."""
    fn = self._programs.get(key)
    if fn is None:
      builder = self.builder
      fn = self._programs[key] = jax.jit(lambda params, *args: make(builder(params))(*args))
    return fn


@dataclasses.dataclass(frozen=True, eq=False)
class Bound:
  """A `Network` with its parameters; itself a valid apply_fn."""
  network: Network
  params: Any = dataclasses.field(repr=False)

  def __call__(self, tokens: jax.Array, levels: jax.Array, t: jax.Array, **kwargs: Any) -> dict:
    return self.network.builder(self.params)(tokens, levels, t, **kwargs)


def flax_network(model: nn.Module) -> Network:
  """The `Network` of a Flax denoiser in inference mode (no dropout)."""
  return Network(functools.partial(_inference_apply_fn, model))


def _inference_apply_fn(model: nn.Module, params: Any) -> ApplyFn:
  return models.make_apply_fn(model, params, train=False)


def jit_apply(apply_fn: ApplyFn, make: Callable[[ApplyFn], Callable[..., Any]],
              key: Hashable) -> Callable[..., Any]:
  """`jax.jit(make(apply_fn))`; compiled once per network and `key` when apply_fn is a `Bound`.

  `key` must identify everything `make` closes over besides the network (process, configs,
  shapes); its parts must be hashable.
  """
  if isinstance(apply_fn, Bound):
    return functools.partial(apply_fn.network.program(key, make), apply_fn.params)
  return jax.jit(make(apply_fn))
