"""Generic building blocks of the DiT and GPT-2 backbones (docs/method.md §4).

Precision policy (both backbones): parameters are float32; matrix products run in the configured
compute dtype (`'float32'` or `'bfloat16'`) and accumulate in float32
(`preferred_element_type=float32`); LayerNorm statistics, the attention softmax, the rotary rotation
and the residual stream stay float32; the heads return float32 logits.

Every parameter carries logical axis names (`nn.with_logical_partitioning`); the names used are
'vocab', 'embed', 'mlp', 'heads', 'kv', 'qkv', 'levels', 'cond', 'norm' (and None for a few small
axes). `hmdlm_jax.sharding.LOGICAL_RULES` maps them to mesh axes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.models import token_head

Array = jax.Array
Init = Callable[..., Array]
LogicalNames = tuple[str | None, ...]

COMPUTE_DTYPES: dict[str, Any] = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
LN_EPS = 1e-5  # torch's F.layer_norm default, used by MDLM and GPT-2


# ----------------------------------------------------------------------------- initialisers


def torch_linear_init(fan_in: int) -> Init:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch's nn.Linear default for weight and bias.

  (kaiming_uniform with a=sqrt(5) gives gain sqrt(1/3), bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in).)
  MDLM trains with torch's defaults, so we use the same distributions.
  """
  bound = 1.0 / math.sqrt(fan_in)

  def init(key: Array, shape: Sequence[int], dtype: Any = jnp.float32) -> Array:
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def normal_init(std: float) -> Init:
  return nn.initializers.normal(stddev=std)


zeros_init: Init = nn.initializers.zeros
ones_init: Init = nn.initializers.ones


def lookup(table: Array, ids: Array) -> Array:
  """table[ids] along axis 0; out-of-range ids give NaN rows (loud, not clamped as jnp indexing is).

  Args: table [N, H]; ids int [...]. Returns [..., H] in the table's dtype.
  """
  return jnp.take(table, ids, axis=0, mode='fill', fill_value=jnp.nan)


# ----------------------------------------------------------------------------- dense / norm


class Dense(nn.Module):
  """y = x · W (+ b), contracting the last `n_in` axes of x with the first `n_in` axes of W.

  Kernel shape `x.shape[-n_in:] + features`, named by `names` (len n_in + len(features)); the bias
  is named by the last len(features) names. Inputs and kernel are cast to `dtype`, the product is
  accumulated in float32, the bias added in float32, and the result cast to `out_dtype`
  (default: `dtype`).
  """
  features: tuple[int, ...]
  names: LogicalNames
  n_in: int = 1
  use_bias: bool = True
  kernel_init: Init | None = None  # None = torch_linear_init(fan_in)
  bias_init: Init | None = None  # None = torch_linear_init(fan_in)
  dtype: Any = jnp.float32
  out_dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    in_shape = tuple(x.shape[-self.n_in:])
    kernel, bias = _linear_params(self, in_shape)
    y = jax.lax.dot_general(
        x.astype(self.dtype), kernel.astype(self.dtype),
        ((tuple(range(x.ndim - self.n_in, x.ndim)), tuple(range(self.n_in))), ((), ())),
        preferred_element_type=jnp.float32)
    if bias is not None:
      y = y + bias
    return y.astype(self.out_dtype or self.dtype)


def _linear_params(module: Any, in_shape: tuple[int, ...]) -> tuple[Array, Array | None]:
  """The float32 'kernel' (in_shape + features) and 'bias' of a Dense-like `module`."""
  fan_in = int(np.prod(in_shape))
  if len(module.names) != len(in_shape) + len(module.features):
    raise ValueError(f'{module.name}: {len(module.names)} axis names for a kernel of rank '
                     f'{len(in_shape) + len(module.features)}')
  k_init = module.kernel_init or torch_linear_init(fan_in)
  kernel = module.param('kernel', nn.with_logical_partitioning(k_init, module.names),
                        in_shape + tuple(module.features), jnp.float32)
  if not module.use_bias:
    return kernel, None
  b_init = module.bias_init or torch_linear_init(fan_in)
  bias = module.param('bias', nn.with_logical_partitioning(b_init, module.names[len(in_shape):]),
                      tuple(module.features), jnp.float32)
  return kernel, bias


class LinearWeights(nn.Module):
  """A Linear H -> V whose caller applies it: `token_head.Projection` (kernel [H, V], bias [V]).

  Same parameters as `Dense((out_features,), names)` (names, shapes, inits), so checkpoints do not
  see the difference; the token heads use it to compute either the dense logits or the loss at
  selected rows only (models/token_head.py).
  """
  features: tuple[int, ...]
  names: LogicalNames
  use_bias: bool = True
  kernel_init: Init | None = None
  bias_init: Init | None = None

  @nn.compact
  def __call__(self, in_features: int) -> token_head.Projection:
    return token_head.Projection(*_linear_params(self, (in_features,)))


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with float32 statistics; weight always, bias optional.

  MDLM's DiT uses weight only (no bias); GPT-2 uses both. Returns float32 [..., H].
  """
  use_bias: bool = False
  eps: float = LN_EPS

  @nn.compact
  def __call__(self, x: Array) -> Array:
    h = x.shape[-1]
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + self.eps)
    weight = self.param('weight', nn.with_logical_partitioning(ones_init, ('norm',)), (h,),
                        jnp.float32)
    y = y * weight
    if self.use_bias:
      bias = self.param('bias', nn.with_logical_partitioning(zeros_init, ('norm',)), (h,),
                        jnp.float32)
      y = y + bias
    return y


class Embed(nn.Module):
  """A learned table [num, features] looked up by integer ids (out-of-range ids -> NaN rows)."""
  num: int
  features: int
  names: LogicalNames
  embedding_init: Init | None = None  # None = U(±1/sqrt(features)) (MDLM's kaiming_uniform)

  def setup(self) -> None:
    init = self.embedding_init or torch_linear_init(self.features)
    self.embedding = self.param('embedding', nn.with_logical_partitioning(init, self.names),
                                (self.num, self.features), jnp.float32)

  def __call__(self, ids: Array) -> Array:
    """ids int [...] -> float32 [..., features]."""
    return lookup(self.embedding, ids)


# ----------------------------------------------------------------------------- positions


def rotary_cos_sin(seq_len: int, head_dim: int, base: float = 1e4) -> tuple[Array, Array]:
  """cos, sin [L, head_dim] float32 for the rotate-half convention (GPT-NeoX / MDLM / flash-attn
  non-interleaved): θ_{l,i} = l · base^{-2i/d} for i < d/2, repeated for the second half."""
  if head_dim % 2:
    raise ValueError(f'rotary embeddings need an even head dimension, got {head_dim}')
  inv_freq = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # [L, d/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [L, d]
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: Array) -> Array:
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: Array, cos: Array, sin: Array) -> Array:
  """x [B, L, nh, d], cos/sin [L, d] -> float32 [B, L, nh, d]: x·cos + rotate_half(x)·sin."""
  chex.assert_rank(x, 4)
  chex.assert_equal_shape([cos, sin])
  x = x.astype(jnp.float32)
  return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def check_position_length(length: int, seq_len: int) -> None:
  """Inputs longer than the absolute position tables are an error, not a silent truncation."""
  if length > seq_len:
    raise ValueError(f'input length {length} exceeds model.seq_len={seq_len}')


class LearnedPositionEmbedding(nn.Module):
  """Absolute position table [seq_len, H] added to the input ('learned'; GPT-2's `wpe`)."""
  seq_len: int
  features: int
  embedding_init: Init | None = None

  @nn.compact
  def __call__(self, length: int) -> Array:
    """Returns float32 [length, H]: the table's first `length` rows."""
    check_position_length(length, self.seq_len)
    table = Embed(self.seq_len, self.features, (None, 'embed'), self.embedding_init,
                  name='pos_embed')
    return table(jnp.arange(length))


# ----------------------------------------------------------------------------- attention / time


def attention(q: Array, k: Array, v: Array, dtype: Any, bias: Array | None = None) -> Array:
  """Bidirectional softmax attention (no mask: MDLM attends over padding too).

  q, k, v [B, L, nh, d] -> [B, L, nh, d] in `dtype`; scores and softmax in float32.
  bias: optional float32 [nh, L, L] added to the scores.
  """
  chex.assert_equal_shape([q, k, v])
  scale = 1.0 / math.sqrt(q.shape[-1])
  scores = jnp.einsum('bqhd,bkhd->bhqk', q.astype(dtype), k.astype(dtype),
                      preferred_element_type=jnp.float32) * scale
  if bias is not None:
    scores = scores + bias[None]
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum('bhqk,bkhd->bqhd', probs.astype(dtype), v.astype(dtype),
                   preferred_element_type=jnp.float32)
  return out.astype(dtype)


def timestep_embedding(t: Array, dim: int, max_period: float = 1e4) -> Array:
  """Sinusoid [cos(t·f_i), sin(t·f_i)], f_i = max_period^{-i/(dim/2)} (GLIDE / DiT / MDLM order).

  t [B] -> float32 [B, dim].
  """
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = t.astype(jnp.float32)[:, None] * freqs[None, :]
  emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
  if dim % 2:
    emb = jnp.concatenate([emb, jnp.zeros_like(emb[:, :1])], axis=-1)
  return emb


class TimestepEmbedder(nn.Module):
  """MDLM's `sigma_map`: 256-dim sinusoid -> Linear -> SiLU -> Linear (width cond_dim).

  t [B] -> float32 [B, cond_dim] (before the outer SiLU, which the backbone applies).
  """
  cond_dim: int
  frequency_dim: int = 256
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, t: Array) -> Array:
    x = timestep_embedding(t, self.frequency_dim)
    x = Dense((self.cond_dim,), (None, 'cond'), dtype=self.dtype, out_dtype=jnp.float32,
              name='mlp_0')(x)
    x = nn.silu(x)
    return Dense((self.cond_dim,), (None, 'cond'), dtype=self.dtype, out_dtype=jnp.float32,
                 name='mlp_2')(x)


def modulate(x: Array, shift: Array, scale: Array) -> Array:
  """adaLN: x [B, L, H] · (1 + scale[B, H]) + shift[B, H]."""
  return x * (1.0 + scale[:, None, :]) + shift[:, None, :]


class AdaLNFinalLayer(nn.Module):
  """MDLM's DDitFinalLayer: shift, scale = Linear(c) (zero-init); y = Linear(modulate(LN(x))).

  The output Linear is zero-initialised too (adaLN-zero), so every head starts at logits 0.
  `tied_embedding` (optional [V, H] table): use it as the output weight (y = z·Eᵀ + b) instead of
  an own kernel. x [B, L, H], c [B, cond] -> float32 logits [B, L, out_features]; with a `query`
  (token head only) the NLL [B, L] at the query's rows instead (token_head.selected_nll).
  """
  out_features: int
  out_name: str  # logical name of the output axis: 'vocab', 'levels' or 'clusters'
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, c: Array, tied_embedding: Array | None = None,
               query: token_head.TokenQuery | None = None) -> Array:
    h = x.shape[-1]
    mod = Dense((2 * h,), ('cond', 'embed'), kernel_init=zeros_init, bias_init=zeros_init,
                dtype=self.dtype, out_dtype=jnp.float32, name='adaLN_modulation')(c)
    shift, scale = jnp.split(mod, 2, axis=-1)
    z = modulate(LayerNorm(name='norm_final')(x), shift, scale)
    if tied_embedding is None:
      proj = LinearWeights((self.out_features,), ('embed', self.out_name),
                           kernel_init=zeros_init, bias_init=zeros_init, name='linear')(h)
    else:
      bias = self.param('bias', nn.with_logical_partitioning(zeros_init, (self.out_name,)),
                        (self.out_features,), jnp.float32)
      proj = token_head.Projection(tied_embedding, bias, vocab_major=True)
    if query is not None:
      return token_head.selected_nll(z, proj, query, self.dtype)
    return token_head.logits(z, proj, self.dtype)


def constrain(x: Array, names: LogicalNames) -> Array:
  """Logical sharding constraint on an activation (no-op unless logical axis rules are set)."""
  return nn.with_logical_constraint(x, names)


@jax.custom_vjp
def residual_grad_boundary(x: Array) -> Array:
  """Identity on the residual stream [B, L, H]; its backward keeps the cotangent in one buffer.

  The cotangent leaves as g + 0·tanh(g), equal to g bit for bit (tanh is finite for every input,
  NaN stays NaN; subnormals flush to zero as in any XLA:CPU arithmetic). The tanh makes the
  producer "expensive" to XLA, which therefore computes it once instead of duplicating it into
  each consumer. Without it XLA:CPU re-derives the residual gradient of every block above inside
  each block's transposed weight-gradient copy: quadratic in depth, a marked slowdown of the
  12 x 768 DiT's step (benchmarks/README.md, "the quadratic backward").
  `optimization_barrier` does not help: XLA:CPU expands it before fusion.
  """
  return x


def _boundary_fwd(x: Array) -> tuple[Array, None]:
  return x, None


def _boundary_bwd(_: None, g: Array) -> tuple[Array]:
  return (g + 0.0 * jnp.tanh(g),)


residual_grad_boundary.defvjp(_boundary_fwd, _boundary_bwd)
