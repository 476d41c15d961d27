"""Candidate optimisations of the train step as monkeypatches, measured before adoption.

`python -m benchmarks.train_step --patch=NAME` and `python -m benchmarks.profile --patch=NAME`
apply PATCHES[NAME] while the step is built, so a change's effect on speed (and, with
`train_step.patch_check`, its exactness) can be measured before the owner of the patched module
takes it in.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from hmdlm_jax.processes import parameterization


def _subs_token_nll(token_logits: jax.Array, tokens: jax.Array, *, mask_id: int) -> jax.Array:
  """The pre-`token_nll` path ("before"): the SUBS log-softmax [B, L, V] materialised, then the
  gold entry gathered. xt is all-MASK here (the loss reads masked positions only), so XLA folds
  the carry-over select away; the old step also built that select, so this is a lower bound on
  the old cost."""
  xt = jnp.full(tokens.shape, mask_id, jnp.int32)
  logf = parameterization.token_log_probs(token_logits, xt, mask_id=mask_id)
  return -jnp.take_along_axis(logf, tokens[..., None], axis=-1)[..., 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _vjp_token_nll(token_logits: jax.Array, tokens: jax.Array, mask_id: int) -> jax.Array:
  """`parameterization.token_nll` with a hand-written backward pass (d nll / d logits =
  (softmax over non-MASK columns − onehot(gold)) · g, recomputed from the logits)."""
  return _nll_fwd(token_logits, tokens, mask_id)[0]


def _nll_fwd(token_logits: jax.Array, tokens: jax.Array, mask_id: int
             ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
  logits = token_logits.astype(jnp.float32)
  is_mask = jnp.arange(logits.shape[-1]) == mask_id  # [V]
  top = jnp.max(jnp.where(is_mask, -jnp.inf, logits), axis=-1, keepdims=True)  # [B, L, 1]
  total = jnp.sum(jnp.where(is_mask, 0.0, jnp.exp(logits - top)), axis=-1)  # [B, L]
  lse = top[..., 0] + jnp.log(total)
  gold = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
  return lse - gold, (token_logits, tokens, lse)


def _nll_bwd(mask_id: int, res: tuple[jax.Array, jax.Array, jax.Array], g: jax.Array
             ) -> tuple[jax.Array, None]:
  token_logits, tokens, lse = res
  logits = token_logits.astype(jnp.float32)
  cols = jnp.arange(logits.shape[-1])
  p = jnp.where(cols == mask_id, 0.0, jnp.exp(logits - lse[..., None]))
  d = (p - (cols == tokens[..., None]).astype(jnp.float32)) * g[..., None]
  return d.astype(token_logits.dtype), None


_vjp_token_nll.defvjp(_nll_fwd, _nll_bwd)


@contextlib.contextmanager
def _patch_token_nll(nll: Callable[..., jax.Array]) -> Iterator[None]:
  """Replaces `parameterization.token_nll` (what every loss calls) while active."""
  real = parameterization.token_nll
  parameterization.token_nll = nll  # type: ignore[assignment]
  try:
    yield
  finally:
    parameterization.token_nll = real


@contextlib.contextmanager
def _patch_rbg_prng() -> Iterator[None]:
  """jax_default_prng_impl='rbg': XLA's RngBitGenerator instead of threefry for every key made
  while active (dropout masks and the corruption draws are then much cheaper on CPU; the random
  streams differ from threefry's). Enter it before the train state is created."""
  old = jax.config.jax_default_prng_impl
  jax.config.update('jax_default_prng_impl', 'rbg')
  try:
    yield
  finally:
    jax.config.update('jax_default_prng_impl', old)


@contextlib.contextmanager
def _patch_block_barrier() -> Iterator[None]:
  """An optimisation barrier on the residual stream wherever the models call `layers.constrain`
  (after each residual add of every block and after the input embedding).

  Why: XLA:CPU's loop fusion duplicates the element-wise chain of the residual-stream gradient
  into every consumer, so the backward fusion of block i recomputes the chain of all blocks above
  it (quadratic in depth; the "Dropout/div" transposed copies of the profile). A barrier's
  transpose is a barrier on the cotangent, so the gradient is materialised once per block.
  Values are unchanged (the barrier is the identity). Measured: no effect on XLA:CPU, whose
  pipeline expands (removes) optimisation barriers before fusion; kept as the record of a tried
  fix (it may matter on other backends).
  """
  from hmdlm_jax.models import layers  # pylint: disable=g-import-not-at-top
  real = layers.constrain

  def constrain(x: jax.Array, names: Any) -> jax.Array:
    return jax.lax.optimization_barrier(real(x, names))

  layers.constrain = constrain
  try:
    yield
  finally:
    layers.constrain = real


PATCHES: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    'block_barrier': _patch_block_barrier,
    'subs_nll': lambda: _patch_token_nll(_subs_token_nll),
    'fused_nll_vjp': lambda: _patch_token_nll(
        lambda logits, tokens, *, mask_id: _vjp_token_nll(logits, tokens, mask_id)),
    'rbg_prng': _patch_rbg_prng,
}
