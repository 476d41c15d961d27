"""Gradient accumulation inside one jitted step: a global batch in strided micro-batches.

`train.make_train_step` splits the batch here (a `lax.scan`) and hands the token-weighted gradient
to the optimiser, so one optimiser update = one global batch whatever `train.grad_accum` is.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

PyTree = Any


def _microbatches(batch: Mapping[str, jax.Array], accum: int) -> dict[str, jax.Array]:
  """[B, ...] -> [accum, B/accum, ...], micro-batch j = rows j, j+accum, j+2·accum, ...

  Strided (not contiguous) so that every micro-batch keeps rows from every device's shard.
  """
  def split(x: jax.Array) -> jax.Array:
    b = x.shape[0]
    return x.reshape((b // accum, accum) + x.shape[1:]).swapaxes(0, 1)
  return {k: split(v) for k, v in batch.items()}


def value_and_grad(grad_fn: Callable[..., Any], params: PyTree,
                              batch: Mapping[str, jax.Array], key: jax.Array, accum: int,
                              *extra: Any) -> tuple[jax.Array, dict[str, jax.Array], PyTree]:
  """Loss, metrics and gradient of one global batch, in `accum` micro-batches (`lax.scan`).

  Args:
    grad_fn: `jax.value_and_grad(loss_fn, has_aux=True)` with loss_fn(params, batch, key, *extra)
      -> (loss, metrics); the loss is a mean over loss tokens (`batch['loss_mask']`).
    params: parameter tree.
    batch: dict of [B, ...] arrays including loss_mask [B, L].
    key: PRNG key; micro-batch j uses split(key, accum)[j] (accum = 1: `key` itself).
    accum: number of micro-batches (divides B); micro-batch j = rows j, j+accum, ...
    *extra: passed through to loss_fn.
  Returns:
    (loss, metrics, grads). Micro-batch j is weighted by its share of loss tokens, so for a loss
    that is a token-weighted mean over the batch (every process's loss) the result is the
    full-batch value and gradient; metrics are averaged the same way except num_loss_tokens
    (summed) and finite (minimum).
  """
  if accum == 1:
    (loss, aux), grads = grad_fn(params, batch, key, *extra)
    return loss, dict(aux, loss=loss), grads
  micro = _microbatches(batch, accum)
  n_tok = micro['loss_mask'].sum(axis=(1, 2)).astype(jnp.float32)  # [A]
  weights = n_tok / jnp.maximum(n_tok.sum(), 1.0)
  keys = jax.random.split(key, accum)

  def body(acc: PyTree, xs: Any) -> tuple[PyTree, Any]:
    mb, k, w = xs
    (l, aux), g = grad_fn(params, mb, k, *extra)
    acc = jax.tree.map(lambda a, b: a + w * b.astype(a.dtype), acc, g)
    return acc, (l, aux)

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, (ls, auxs) = jax.lax.scan(body, zeros, (micro, keys, weights))
  loss = (weights * ls).sum()
  aux = {k: (weights * v).sum() for k, v in auxs.items()}
  aux['loss'] = loss
  if 'num_loss_tokens' in auxs:
    aux['num_loss_tokens'] = auxs['num_loss_tokens'].sum()
  if 'finite' in auxs:
    aux['finite'] = auxs['finite'].min()
  return loss, aux, grads
