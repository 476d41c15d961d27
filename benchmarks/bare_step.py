r"""The bare MDLM training step in plain JAX: the in-repo reference of benchmarks/side_by_side.py.

Written here from the published definition (MDLM, Sahoo et al. 2024; md4, Shi et al. 2024), not
copied from either code base, and independent of the hmdlm_jax package (no Flax, no package
import), so that it stays a fixed yardstick while the package changes:

  network   MDLM's DiT: E[x_t] -> N × adaLN-zero block (LN, modulate, fused qkv, rotary
            rotate-half, softmax attention, out, gate; LN, modulate, MLP GELU(tanh), gate) ->
            adaLN final layer -> logits [B, L, V]; the time embedding (256-dim sinusoid -> MLP ->
            SiLU) fed t = 0 (MDLM's LM1B default: no time conditioning).
  loss      log-linear schedule: mask each position with probability t (t ~ U(t_min, 1),
            antithetic), NLL of the clean token at masked positions with the MASK column removed
            (SUBS), weighted by 1/t (MDLM's loss weight α'/(1 - α) for α = 1 - t), summed and
            divided by the number of positions (token mean over the batch).
  optimiser optax AdamW (lr 3e-4, β 0.9/0.999, wd 0); nothing else: no clipping, EMA, NaN
            guard, donation or dropout, and the NLL is a materialised log-softmax + gather.

`Features` switches on one thing at a time (the bisection of issue 14, item 2):

  clip        optax.clip_by_global_norm(1.0) before AdamW
  ema         EMA of the parameters (decay 0.9999) kept in the state
  nan_guard   the project's guard until 2026-12-05: loss / grad-norm / update-norm
              finiteness, and where(ok, new, old) over params, EMA (if any) and optimiser state
  guard_cond  the project's guard since 2026-12-05: ONE lax.cond around the whole update
              (optimizer, EMA): the skipped branch returns the old state, nothing is selected
              element-wise, and the finiteness test reads the loss and the gradient norm only
              (with nan_guard also set, guard_cond is the one used)
  donate      state donated to the jitted step (in-place updates)
  dropout     dropout 0.1 on the two residual branches of every block (MDLM's placement)
  fused_nll   NLL = logsumexp(logits + MASK bias) - gold logit (the project's token_nll)
  attn        'bqhd' (einsum on [B, L, nh, d], the project's) | 'bhqd' (transpose to heads-major
              first) | 'xla' (jax.nn.dot_product_attention)
  layout      '4d': qkv kernel [H, 3, nh, d] and out kernel [nh, d, H] (the project's) |
              '2d': [H, 3H] and [H, H] plain matmuls (MDLM's / md4's)
  rotary      'half' (rotate-half by concatenation, the project's) | 'none' | 'complex'
              (the same rotation as a [.., d/2, 2] pairwise product, md4/llama style)
  ln          'two_pass' (mean, then mean((x - mean)²): the project's and MDLM's) | 'fast'
              (var = mean(x²) - mean², flax.linen.LayerNorm's default, what md4 runs)
  head_bias   the token head's [V] bias (MDLM's and the project's; md4's head has none: its
              gradient is a reduction over B·L of the [B, L, V] logits gradient)
  fill_lookup embedding lookup with mode='fill' (NaN for out-of-range ids, the project's) instead of
              the default clamped gather
  grad_boundary the residual stream passes an identity whose backward emits g + 0·tanh(g) at every
              block (the project's layers.residual_grad_boundary): stops XLA:CPU from re-deriving
              the residual gradient of all blocks above inside each block's backward

`make(shape_dims, features)` returns (init_state, step, batch) where
step(state, batch, key) -> (state, loss), jitted.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

LN_EPS = 1e-5
T_MIN = 1e-3


@dataclasses.dataclass(frozen=True)
class Dims:
  """Network and batch shape."""
  num_layers: int
  hidden: int
  heads: int
  mlp: int
  cond: int
  vocab: int
  batch: int
  length: int
  mask_id: int = 103


@dataclasses.dataclass(frozen=True)
class Features:
  clip: bool = False
  ema: bool = False
  nan_guard: bool = False
  guard_cond: bool = False
  donate: bool = False
  dropout: float = 0.0
  fused_nll: bool = False
  attn: str = 'bqhd'
  layout: str = '2d'
  rotary: str = 'half'
  fill_lookup: bool = False
  head_bias: bool = True
  ln: str = 'two_pass'
  grad_boundary: bool = False

  @classmethod
  def parse(cls, spec: str) -> 'Features':
    """'clip,ema,dropout=0.1,attn=bhqd' -> Features; 'all' = the project's step's features."""
    kw: dict[str, Any] = {}
    for tok in (t.strip() for t in spec.split(',') if t.strip()):
      if tok == 'all':
        kw.update(clip=True, ema=True, guard_cond=True, donate=True, dropout=0.1,
                  fused_nll=True, layout='4d', fill_lookup=True, grad_boundary=True)
        continue
      key, _, val = tok.partition('=')
      field = {f.name: f for f in dataclasses.fields(cls)}.get(key)
      if field is None:
        raise ValueError(f'bare step feature {key!r}: allowed {[f.name for f in dataclasses.fields(cls)]}')
      if field.type in ('bool', bool):
        kw[key] = val.lower() not in ('0', 'false', 'no') if val else True
      elif field.type in ('float', float):
        kw[key] = float(val) if val else 0.1
      else:
        kw[key] = val
    return cls(**kw)


# ----------------------------------------------------------------------------- parameters


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
  b = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -b, b)


def init_params(key: jax.Array, d: Dims, layout: str) -> dict[str, Any]:
  """torch-default uniform init; adaLN and head zero-initialised (adaLN-zero) except that the
  head gets a small random init so that the logits are not all equal (timing is unaffected)."""
  h, c, m, v = d.hidden, d.cond, d.mlp, d.vocab
  nh, hd = d.heads, d.hidden // d.heads
  keys = iter(jax.random.split(key, 8 + 8 * d.num_layers))
  p: dict[str, Any] = {
      'embed': _uniform(next(keys), (v, h), h),
      't0_w': _uniform(next(keys), (256, c), 256), 't0_b': jnp.zeros((c,)),
      't2_w': _uniform(next(keys), (c, c), c), 't2_b': jnp.zeros((c,)),
      'final_ln': jnp.ones((h,)), 'final_ada_w': jnp.zeros((c, 2 * h)),
      'final_ada_b': jnp.zeros((2 * h,)),
      'head_w': 0.02 * jax.random.normal(next(keys), (h, v)), 'head_b': jnp.zeros((v,)),
      'blocks': [],
  }
  for _ in range(d.num_layers):
    qkv_shape = (h, 3, nh, hd) if layout == '4d' else (h, 3 * h)
    out_shape = (nh, hd, h) if layout == '4d' else (h, h)
    p['blocks'].append({
        'ln1': jnp.ones((h,)), 'ln2': jnp.ones((h,)),
        'ada_w': 0.02 * jax.random.normal(next(keys), (c, 6 * h)), 'ada_b': jnp.zeros((6 * h,)),
        'qkv': _uniform(next(keys), qkv_shape, h), 'out': _uniform(next(keys), out_shape, h),
        'mlp0_w': _uniform(next(keys), (h, m), h), 'mlp0_b': jnp.zeros((m,)),
        'mlp2_w': _uniform(next(keys), (m, h), m), 'mlp2_b': jnp.zeros((h,)),
    })
  return p


# ----------------------------------------------------------------------------- network


def _ln(x: jax.Array, w: jax.Array, kind: str = 'two_pass') -> jax.Array:
  mu = x.mean(-1, keepdims=True)
  if kind == 'fast':
    var = jnp.maximum(jnp.square(x).mean(-1, keepdims=True) - jnp.square(mu), 0.0)
  else:
    var = jnp.square(x - mu).mean(-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + LN_EPS) * w


def _rope(length: int, hd: int) -> tuple[jax.Array, jax.Array]:
  inv = 1.0 / (1e4 ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
  f = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None]
  return jnp.cos(f), jnp.sin(f)  # [L, d/2]


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str) -> jax.Array:
  """x [B, L, nh, d]."""
  if kind == 'none':
    return x
  half = x.shape[-1] // 2
  if kind == 'half':
    c = jnp.concatenate([cos, cos], -1)[None, :, None, :]
    s = jnp.concatenate([sin, sin], -1)[None, :, None, :]
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * c + rot * s
  if kind == 'complex':  # the same rotation, pairs (i, i + d/2) as a trailing axis of 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
  raise ValueError(f'rotary={kind!r}')


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
  """[B, L, nh, d] -> [B, L, nh, d]."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  if kind == 'bqhd':
    s = jnp.einsum('bqhd,bkhd->bhqk', q, k) * scale
    return jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(s, -1), v)
  if kind == 'bhqd':
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
    s = jnp.einsum('bhqd,bhkd->bhqk', q, k) * scale
    return jnp.swapaxes(jnp.einsum('bhqk,bhkd->bhqd', jax.nn.softmax(s, -1), v), 1, 2)
  if kind == 'xla':
    return jax.nn.dot_product_attention(q, k, v, scale=scale)
  raise ValueError(f'attn={kind!r}')


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if rate <= 0.0 or key is None:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0)


@jax.custom_vjp
def _grad_boundary(x: jax.Array) -> jax.Array:
  return x


def _grad_boundary_bwd(_: None, g: jax.Array) -> tuple[jax.Array]:
  return (g + 0.0 * jnp.tanh(g),)  # the tanh makes XLA compute g once, not per consumer


_grad_boundary.defvjp(lambda x: (x, None), _grad_boundary_bwd)


def forward(p: dict[str, Any], xt: jax.Array, d: Dims, f: Features,
            key: jax.Array | None) -> jax.Array:
  """xt [B, L] int -> logits [B, L, V] float32."""
  b, l = xt.shape
  h, nh = d.hidden, d.heads
  hd = h // nh
  x = jnp.take(p['embed'], xt, axis=0, **({'mode': 'fill', 'fill_value': jnp.nan}
                                          if f.fill_lookup else {}))
  half = 128
  freqs = jnp.exp(-math.log(1e4) * jnp.arange(half, dtype=jnp.float32) / half)
  args = jnp.zeros((b, 1)) * freqs[None]  # t = 0: no time conditioning (MDLM's LM1B default)
  temb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)
  c = jax.nn.silu(temb @ p['t0_w'] + p['t0_b']) @ p['t2_w'] + p['t2_b']
  c = jax.nn.silu(c)
  cos, sin = _rope(l, hd)
  for i, blk in enumerate(p['blocks']):
    if f.grad_boundary:
      x = _grad_boundary(x)
    mod = c @ blk['ada_w'] + blk['ada_b']
    sh1, sc1, g1, sh2, sc2, g2 = (a[:, None, :] for a in jnp.split(mod, 6, -1))
    y = _ln(x, blk['ln1'], f.ln) * (1 + sc1) + sh1
    if f.layout == '4d':
      qkv = jnp.einsum('blh,htnd->bltnd', y, blk['qkv'])
    else:
      qkv = (y @ blk['qkv']).reshape(b, l, 3, nh, hd)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = _rotate(q, cos, sin, f.rotary), _rotate(k, cos, sin, f.rotary)
    a = _attention(q, k, v, f.attn)
    if f.layout == '4d':
      a = jnp.einsum('blnd,ndh->blh', a, blk['out'])
    else:
      a = a.reshape(b, l, h) @ blk['out']
    ka = kb = None
    if key is not None:
      ka, kb = jax.random.split(jax.random.fold_in(key, i))
    x = x + g1 * _dropout(a, f.dropout, ka)
    y = _ln(x, blk['ln2'], f.ln) * (1 + sc2) + sh2
    y = jax.nn.gelu(y @ blk['mlp0_w'] + blk['mlp0_b'], approximate=True)
    y = y @ blk['mlp2_w'] + blk['mlp2_b']
    x = x + g2 * _dropout(y, f.dropout, kb)
  mod = c @ p['final_ada_w'] + p['final_ada_b']
  sh, sc = (a[:, None, :] for a in jnp.split(mod, 2, -1))
  z = _ln(x, p['final_ln'], f.ln) * (1 + sc) + sh
  logits = z @ p['head_w']
  return logits + p['head_b'] if f.head_bias else logits


def mdlm_loss(p: dict[str, Any], tokens: jax.Array, key: jax.Array, d: Dims,
              f: Features) -> jax.Array:
  """MDLM's continuous-time NELBO (log-linear schedule), one sample of t per example."""
  k_t, k_m, k_d = jax.random.split(key, 3)
  b, l = tokens.shape
  u = (jnp.arange(b) + jax.random.uniform(k_t, (b,))) / b  # antithetic
  t = T_MIN + (1 - T_MIN) * u
  masked = jax.random.uniform(k_m, (b, l)) < t[:, None]
  xt = jnp.where(masked, d.mask_id, tokens)
  logits = forward(p, xt, d, f, k_d if f.dropout > 0 else None)
  mask_col = jnp.arange(d.vocab) == d.mask_id
  if f.fused_nll:
    lse = jax.nn.logsumexp(logits + jnp.where(mask_col, -jnp.inf, 0.0), -1)
    nll = lse - jnp.take_along_axis(logits, tokens[..., None], -1)[..., 0]
  else:
    logp = jax.nn.log_softmax(jnp.where(mask_col, -jnp.inf, logits), -1)
    nll = -jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  per = jnp.where(masked, nll, 0.0) / t[:, None]
  return per.sum() / (b * l)


# ----------------------------------------------------------------------------- step


def make(d: Dims, f: Features, seed: int = 0
         ) -> tuple[dict[str, Any], Callable[..., Any], dict[str, jax.Array]]:
  """(state, jitted step(state, batch, key) -> (state, loss), batch)."""
  tx = optax.adamw(3e-4, b1=0.9, b2=0.999, weight_decay=0.0)
  if f.clip:
    tx = optax.chain(optax.clip_by_global_norm(1.0), tx)
  params = jax.jit(lambda k: init_params(k, d, f.layout))(jax.random.PRNGKey(seed))
  state: dict[str, Any] = {'params': params, 'opt': tx.init(params)}
  if f.ema:
    state['ema'] = jax.tree.map(jnp.copy, params)
  rng = np.random.default_rng(seed)
  tok = rng.integers(0, d.vocab - 1, (d.batch, d.length)).astype(np.int32)
  tok = np.where(tok >= d.mask_id, tok + 1, tok).astype(np.int32)
  batch = {'tokens': jnp.asarray(tok)}

  def step(state: dict[str, Any], batch: dict[str, jax.Array], key: jax.Array
           ) -> tuple[dict[str, Any], jax.Array]:
    loss, grads = jax.value_and_grad(mdlm_loss)(state['params'], batch['tokens'], key, d, f)

    def apply(st: dict[str, Any]) -> tuple[dict[str, Any], Any]:
      """AdamW (+ EMA) on the state st: (new state, the update)."""
      updates, new_opt = tx.update(grads, st['opt'], st['params'])
      out = {'params': optax.apply_updates(st['params'], updates), 'opt': new_opt}
      if f.ema:
        out['ema'] = jax.tree.map(lambda e, q: 0.9999 * e + (1 - 0.9999) * q, st['ema'],
                                  out['params'])
      return out, updates

    if f.guard_cond:
      ok = jnp.isfinite(loss) & jnp.isfinite(optax.global_norm(grads))
      return jax.lax.cond(ok, lambda st: apply(st)[0], lambda st: st, state), loss
    new, updates = apply(state)
    if f.nan_guard:
      ok = (jnp.isfinite(loss) & jnp.isfinite(optax.global_norm(grads))
            & jnp.isfinite(optax.global_norm(updates)))
      new = jax.tree.map(lambda a, o: jnp.where(ok, a, o), new, state)
    return new, loss

  return state, jax.jit(step, donate_argnums=(0,) if f.donate else ()), batch


def step_flops(d: Dims) -> float:
  """Matmul FLOPs of one training step (forward + backward = 3 × forward), per the formula of
  benchmarks/flops.py (token-wise blocks, attention, head; the tiny time MLP / adaLN omitted)."""
  h, m, l = d.hidden, d.mlp, d.length
  per_tok = 2 * (d.num_layers * (4 * h * h + 2 * h * m) + h * d.vocab) + d.num_layers * 4 * l * h
  return 3.0 * d.batch * l * per_tok
