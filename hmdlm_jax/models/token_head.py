"""The token output projection: dense logits, or the SUBS NLL at the selected rows only.

A masked-diffusion loss reads the token head at masked positions only (carry-over unmasking: a
revealed position's distribution is fixed), about half of them at t ~ U(0, 1). At a text
vocabulary the projection H -> V and its [B·L, V] softmax dominate a small model's step, so
computing them for every position wastes about half of it. `selected_nll` sorts the rows
(selected first), cuts them into `NUM_CHUNKS` chunks and runs the projection, log-softmax and gold
pick chunk by chunk under `lax.cond`, skipping every chunk that holds no selected row. Its custom
VJP keeps only the per-row log-normaliser, recomputes a chunk's logits in the backward pass (no
[B·L, V] residual) and takes the bias gradient as a matrix-vector product, which XLA:CPU runs far
faster than a column reduction of [B·L, V]. Measured figures: docs/method.md §4.3.

The sort crosses the whole batch, so the selected path is for a one-device mesh (the train step
refuses it on more: `loss.token_rows`); on a mesh the loss reads the dense logits instead.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

Array = jax.Array
# Chunks of the sorted rows: the cost is ceil(selected / chunk) chunks, the overhead a scan of
# NUM_CHUNKS conds. 8 was the fastest of 4, 8, 16 at the benchmark shapes (docs/method.md §4.3).
NUM_CHUNKS = 8


class Projection(NamedTuple):
  """The output Linear: kernel [H, V] (or [V, H] when `vocab_major`, a tied embedding table) and an
  optional bias [V]; float32 parameters, multiplied in the model's compute dtype."""
  kernel: Array
  bias: Array | None
  vocab_major: bool = False


class TokenQuery(NamedTuple):
  """What `selected_nll` scores: targets int [B, L], rows bool [B, L] (the positions a loss reads)
  and `exclude`, a column given zero probability (SUBS: the MASK id) or None."""
  targets: Array
  rows: Array
  exclude: int | None


def _project(z: Array, kernel: Array, bias: Array | None, vocab_major: bool, dtype: Any) -> Array:
  """z [N, H] -> float32 logits [N, V] (bias added in float32, as layers.Dense does)."""
  contract = (z.ndim - 1,), (1,) if vocab_major else (0,)
  y = jax.lax.dot_general(z.astype(dtype), kernel.astype(dtype), (contract, ((), ())),
                          preferred_element_type=jnp.float32)
  return y if bias is None else y + bias


def logits(z: Array, proj: Projection, dtype: Any) -> Array:
  """The dense token logits: z [B, L, H] -> float32 [B, L, V]."""
  return _project(z, proj.kernel, proj.bias, proj.vocab_major, dtype)


def selected_nll(z: Array, proj: Projection, query: TokenQuery, dtype: Any) -> Array:
  """-log softmax(logits without column `exclude`)[target] at the selected rows, 0 elsewhere.

  z [B, L, H], query.targets / rows [B, L] -> float32 [B, L]. Equals
  `where(rows, parameterization.token_nll(logits(z, proj), targets, mask_id=exclude), 0)` up to
  float rounding, value and gradient (tests/test_token_head.py); unselected rows cost nothing.
  """
  chex.assert_rank(z, 3)
  chex.assert_shape([query.targets, query.rows], z.shape[:2])
  b, l, h = z.shape
  n = b * l
  chunk = -(-n // NUM_CHUNKS)
  nll = _rows_nll(z.reshape(n, h), proj.kernel, proj.bias, query.targets.reshape(n),
                  query.rows.reshape(n), query.exclude, chunk, jnp.dtype(dtype).name,
                  proj.vocab_major)
  return nll.reshape(b, l)


def _chunked(a: Array, order: Array, chunk: int) -> Array:
  """a [N, ...] in `order`, zero-padded to whole chunks -> [N / chunk, chunk, ...]."""
  a = a[order]
  pad = (-a.shape[0]) % chunk
  a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
  return a.reshape((-1, chunk) + a.shape[1:])


def _unchunked(a: Array, order: Array, n: int) -> Array:
  """Inverse of `_chunked`: [N / chunk, chunk, ...] -> [N, ...] in the original row order."""
  a = a.reshape((-1,) + a.shape[2:])[:n]
  return jnp.zeros_like(a).at[order].set(a)


def _masked_logits(zc: Array, kernel: Array, bias: Array | None, exclude: int | None,
                   vocab_major: bool, dtype: Any) -> Array:
  y = _project(zc, kernel, bias, vocab_major, dtype)
  if exclude is None:
    return y
  # Additive 0 / -inf column bias as in parameterization.token_nll: exp(-inf) = 0 in the backward.
  return y + jnp.where(jnp.arange(y.shape[-1]) == exclude, -jnp.inf, 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _rows_nll(z: Array, kernel: Array, bias: Array | None, targets: Array, rows: Array,
              exclude: int | None, chunk: int, dtype: str, vocab_major: bool) -> Array:
  return _rows_nll_fwd(z, kernel, bias, targets, rows, exclude, chunk, dtype, vocab_major)[0]


def _rows_nll_fwd(z, kernel, bias, targets, rows, exclude, chunk, dtype, vocab_major):
  n = z.shape[0]
  order = jnp.argsort(~rows, stable=True)  # selected rows first
  n_sel = rows.sum()
  zs, ts = _chunked(z, order, chunk), _chunked(targets, order, chunk)

  def body(_, inp):
    j, zc, tc = inp

    def compute(zc, tc):
      y = _masked_logits(zc, kernel, bias, exclude, vocab_major, dtype)
      lse = jax.nn.logsumexp(y, axis=-1)
      return lse - jnp.take_along_axis(y, tc[:, None], axis=-1)[:, 0], lse

    zero = jnp.zeros((chunk,), jnp.float32)
    return None, jax.lax.cond(j * chunk < n_sel, compute, lambda *_: (zero, zero), zc, tc)

  _, (nll, lse) = jax.lax.scan(body, None, (jnp.arange(zs.shape[0]), zs, ts))
  out = jnp.where(rows, _unchunked(nll, order, n), 0.0)
  return out, (z, kernel, bias, targets, rows, order, n_sel, lse)


def _rows_nll_bwd(exclude, chunk, dtype, vocab_major, res, g):
  z, kernel, bias, targets, rows, order, n_sel, lse = res
  n, vocab = z.shape[0], kernel.shape[0 if vocab_major else 1]
  zs, ts = _chunked(z, order, chunk), _chunked(targets, order, chunk)
  gs = _chunked(jnp.where(rows, g, 0.0), order, chunk)

  def body(carry, inp):
    j, zc, tc, gc, lc = inp

    def compute(carry):
      dk, db = carry
      y = _masked_logits(zc, kernel, bias, exclude, vocab_major, dtype)
      # d nll / d logits = softmax - onehot(target), times the row's cotangent.
      p = (jnp.exp(y - lc[:, None]) - (jnp.arange(vocab) == tc[:, None])) * gc[:, None]
      pd = p.astype(dtype)
      dz = jax.lax.dot_general(pd, kernel.astype(dtype), (((1,), (0 if vocab_major else 1,)),
                                                          ((), ())),
                               preferred_element_type=jnp.float32)
      if vocab_major:  # [V, H] += pᵀ z
        dk = dk + jax.lax.dot_general(pd, zc.astype(dtype), (((0,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)
      else:  # [H, V] += zᵀ p
        dk = dk + jax.lax.dot_general(zc.astype(dtype), pd, (((0,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)
      if db is not None:  # a product, not a column reduction (module docstring)
        db = db + jnp.dot(jnp.ones((chunk,), jnp.float32), p)
      return (dk, db), dz.astype(z.dtype)

    def skip(carry):
      return carry, jnp.zeros((chunk, z.shape[1]), z.dtype)

    return jax.lax.cond(j * chunk < n_sel, compute, skip, carry)

  init = (jnp.zeros(kernel.shape, jnp.float32), None if bias is None else jnp.zeros_like(bias))
  (dk, db), dzs = jax.lax.scan(body, init, (jnp.arange(zs.shape[0]), zs, ts, gs, lse))
  return _unchunked(dzs, order, n), dk.astype(kernel.dtype), db, None, None


_rows_nll.defvjp(_rows_nll_fwd, _rows_nll_bwd)
