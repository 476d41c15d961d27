"""The compact Sudoku backbone: a bidirectional GPT-2-style transformer (SPEC 4 (b), paper App. F).

  x = Dropout(wte[tokens] (+ W_lvl[levels] if K > 1) + positions (+ time_proj(c) if time-cond.))
  N × pre-LN block:  x = x + Dropout(W_o · Attn(W_qkv · LN_1(x)))        (no causal mask)
                     x = x + Dropout(MLP(LN_2(x)))                     MLP: H->M->H, GELU(tanh)
  z = LN_f(x);  token logits = LN_f(x [+ W_tok_lvl[token_levels]]) · wteᵀ  (tied, no bias)
                hierarchy logits = Linear_{H->K}(z)                     (K > 1 only)
LayerNorms have weight and bias; every Linear has a bias (GPT-2). Dropout is applied to the input
embedding and the two residual branches (not to attention probabilities).

Heads: the paper's ≈5K extra parameters for K = 6 (App. F) fit a plain Linear on the shared final
LayerNorm: level table 7·384 = 2,688 plus 384·6 + 6 = 2,310 gives 4,998. So the hierarchy head
here is `hier_head` = Linear(LN_f(x)), the same form as the token head (LN_f then a linear map),
with no adaLN (this backbone has no conditioning vector to modulate with).

Positions: 'learned' (GPT-2's absolute table [seq_len, H], the SPEC's choice), 'sudoku' (learned
row / column / 3×3-box tables, 3 × [9, H]) or 'rotary' (rotate-half on q, k; no absolute table).
Time conditioning (optional, default off like MDLM): c = SiLU(sigma_map(t)) as in the DiT, and
`time_proj` (Linear cond -> H, zero-init so switching it on starts from the unconditioned model)
adds c's projection to every input position. Built only when switched on.
Single-pass variant: `token_level_embed` [(K+1), H] added to the hidden state before LN_f on the
token path only (as in the DiT).
`tie_embeddings=False` gives a separate `lm_head` (H -> V, no bias); the SPEC's "6M" model ties.

Parameter count (tied, learned positions, width H, MLP M, N blocks, V tokens, L positions):
  per block 4H (two LayerNorms) + (3H² + 3H) + (H² + H) + (HM + M + MH + H);
  total N·block + L·H + 2H + V·H.  H=384, M=1536, N=3, L=81: 1,774,464 per block,
  5,355,264 + 384·V: 5,359,104 for V = 10, 5,367,168 for the paper's 31-symbol vocabulary (the paper
  reports 5.5M, the "6M" model). K = 6 adds 4,998.
Initialisation follows GPT-2: N(0, 0.02) for kernels and tables, N(0, 0.02/√(2N)) for the two
residual output projections, zero biases, LayerNorm weight 1 / bias 0.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers

Array = jax.Array
INIT_STD = 0.02


class GPT2Block(nn.Module):
  """Pre-LN bidirectional block. x [B, L, H] f32 -> [B, L, H] f32."""
  num_heads: int
  mlp_dim: int
  num_layers: int
  dropout: float = 0.1
  rotary: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, rope: tuple[Array, Array] | None, train: bool = False) -> Array:
    h = x.shape[-1]
    hd = h // self.num_heads
    w_init = layers.normal_init(INIT_STD)
    proj_init = layers.normal_init(INIT_STD / math.sqrt(2 * self.num_layers))  # GPT-2 scaling

    y = layers.LayerNorm(use_bias=True, name='ln_1')(x)
    qkv = layers.Dense((3, self.num_heads, hd), ('embed', 'qkv', 'heads', 'kv'),
                       kernel_init=w_init, bias_init=layers.zeros_init, dtype=self.dtype,
                       name='attn_qkv')(y)  # [B, L, 3, nh, hd]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if self.rotary:
      q = layers.apply_rotary(q, *rope)
      k = layers.apply_rotary(k, *rope)
    y = layers.attention(q, k, v, self.dtype)
    y = layers.Dense((h,), ('heads', 'kv', 'embed'), n_in=2, kernel_init=proj_init,
                     bias_init=layers.zeros_init, dtype=self.dtype, out_dtype=jnp.float32,
                     name='attn_out')(y)
    x = x + nn.Dropout(self.dropout, deterministic=not train)(y)
    x = layers.constrain(x, ('batch', 'length', 'embed'))

    y = layers.LayerNorm(use_bias=True, name='ln_2')(x)
    y = layers.Dense((self.mlp_dim,), ('embed', 'mlp'), kernel_init=w_init,
                     bias_init=layers.zeros_init, dtype=self.dtype, name='mlp_0')(y)
    y = nn.gelu(y, approximate=True)
    y = layers.Dense((h,), ('mlp', 'embed'), kernel_init=proj_init, bias_init=layers.zeros_init,
                     dtype=self.dtype, out_dtype=jnp.float32, name='mlp_2')(y)
    x = x + nn.Dropout(self.dropout, deterministic=not train)(y)
    return layers.constrain(x, ('batch', 'length', 'embed'))


class GPT2(nn.Module):
  """Bidirectional GPT-2 backbone with level table and hierarchy head; see the module docstring.

  Same call contract as `DiT`: (tokens [B,L], levels [B,L], t [B], heads, token_levels, train)
  -> {'hier': f32 [B,L,K], 'token': f32 [B,L,V]} (raw logits, requested heads only).
  """
  vocab_size: int
  num_levels: int
  num_layers: int = 3
  hidden_size: int = 384
  num_heads: int = 12
  mlp_dim: int = 1536
  cond_dim: int = 128
  dropout: float = 0.1
  time_conditioning: bool = False
  single_pass: bool = False
  position_embedding: str = 'learned'  # 'learned' | 'sudoku' | 'rotary'
  seq_len: int = 81
  tie_embeddings: bool = True
  dtype: str = 'float32'
  hier_stop_gradient: bool = False  # the hierarchy head reads detached backbone features

  @nn.compact
  def __call__(self, tokens: Array, levels: Array, t: Array,
               heads: tuple[str, ...] = layers.HEADS, token_levels: Array | None = None,
               train: bool = False) -> dict[str, Array]:
    heads = layers.check_heads(heads)
    layers.check_inputs(tokens, levels, t, token_levels, single_pass=self.single_pass,
                        num_levels=self.num_levels, heads=heads)
    dtype = layers.COMPUTE_DTYPES[self.dtype]
    b, l = tokens.shape
    k = self.num_levels
    emb_init = layers.normal_init(INIT_STD)
    out: dict[str, Array] = {}
    if k == 1 and 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, 1), jnp.float32)  # one level: log g = 0 exactly
      if heads == ('hier',):
        return out

    wte = layers.Embed(self.vocab_size, self.hidden_size, ('vocab', 'embed'), emb_init,
                       name='wte')
    x = wte(tokens)
    if k > 1:
      # Zero-init like the DiT's: the network starts as its MDLM twin.
      x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'), layers.zeros_init,
                           name='level_embed')(levels)
    if self.position_embedding != 'rotary':
      x = x + layers.PositionEmbedding(self.position_embedding, self.seq_len, self.hidden_size,
                                       emb_init, name='position')(l)[None]
    if self.time_conditioning:
      c = nn.silu(layers.TimestepEmbedder(self.cond_dim, name='sigma_map')(t))  # float32
      x = x + layers.Dense((self.hidden_size,), ('cond', 'embed'), kernel_init=layers.zeros_init,
                           bias_init=layers.zeros_init, dtype=dtype, out_dtype=jnp.float32,
                           name='time_proj')(c)[:, None, :]
    x = nn.Dropout(self.dropout, deterministic=not train)(x)
    x = layers.constrain(x, ('batch', 'length', 'embed'))

    rotary = self.position_embedding == 'rotary'
    rope = layers.rotary_cos_sin(l, self.hidden_size // self.num_heads) if rotary else None
    for i in range(self.num_layers):
      x = GPT2Block(self.num_heads, self.mlp_dim, self.num_layers, self.dropout, rotary, dtype,
                    name=f'h_{i}')(x, rope, train)

    ln_f = layers.LayerNorm(use_bias=True, name='ln_f')
    if 'hier' in heads and k > 1:
      out['hier'] = layers.Dense((k,), ('embed', 'levels'), kernel_init=emb_init,
                                 bias_init=layers.zeros_init, dtype=dtype,
                                 out_dtype=jnp.float32, name='hier_head')(
                                     ln_f(jax.lax.stop_gradient(x) if self.hier_stop_gradient
                                          else x))
    if 'token' in heads:
      if self.single_pass and k > 1:
        x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'), emb_init,
                             name='token_level_embed')(token_levels)
      z = ln_f(x)
      if self.tie_embeddings:
        out['token'] = wte.attend(z, dtype)
      else:
        out['token'] = layers.Dense((self.vocab_size,), ('embed', 'vocab'), use_bias=False,
                                    kernel_init=emb_init, dtype=dtype, out_dtype=jnp.float32,
                                    name='lm_head')(z)
    return out
