"""MDLM's diffusion transformer (DiT) with HMDLM's level table and hierarchy head (SPEC 4).

Architecture (kuleshov-group/mdlm `models/dit.py`, re-implemented in Flax):
  x = E_tok[tokens] (+ W_lvl[levels] if K > 1) (+ absolute positions if not rotary)     [B, L, H]
  c = SiLU(sigma_map(t))   sigma_map: 256-dim sinusoid -> Linear -> SiLU -> Linear (cond_dim)
  N × DDiTBlock (adaLN-zero):
    shift1, scale1, gate1, shift2, scale2, gate2 = Linear_{cond->6H}(c)        (zero-init)
    x = x + gate1 · Dropout(W_o · Attn(rotary(W_qkv · modulate(LN(x), shift1, scale1))))
    x = x + gate2 · Dropout(MLP(modulate(LN(x), shift2, scale2)))   MLP: H->M->H, GELU(tanh)
  token head     = adaLN final layer (LN, Linear_{cond->2H}, Linear_{H->V}), all zero-init
  hierarchy head = the same form with H->K (K > 1 only; SPEC 4, paper section 5.1)
LayerNorms have a weight and no bias; q/k/v and the attention output have no bias; the MLP and all
adaLN / head Linears have biases; no weight tying (unless `tie_embeddings`); dropout only on the two
residual branches. Rotary: rotate-half convention, base 1e4, on q and k (positions 0..L-1).

Time conditioning: MDLM's default is off, and then MDLM still builds `sigma_map` and feeds it σ = 0
(diffusion.py `_process_sigma`), so the conditioning vector c is a learned constant. We do the same
(t is replaced by zeros), which keeps the parameter count independent of the flag. With
conditioning on we feed t ∈ [0, 1] itself (MDLM feeds σ(t) = -log α(t), which has no single value
when every level has its own schedule).

Parameter count (checked in tests/test_models.py by a hand-written formula). Per block, with width
H, conditioning width C and MLP width M:
  2H (two LayerNorm weights) + 3H² (qkv) + H² (out) + (HM + M + MH + H) (MLP) + (6HC + 6H) (adaLN)
MDLM LM1B (H=768, C=128, M=3072, 12 blocks): 7,677,696 per block, 92,132,352 for the blocks;
time embedder 256·C + C + C² + C = 49,408; final layer H + (2HC + 2H) = 198,912 + (HV + V);
token embedding VH. Total = 92,380,672 + 1537·V.
MDLM uses bert-base-uncased's own [MASK] (id 103) as the mask token, so V = 30,522 (no extra row):
  92,380,672 + 1537 · 30,522 = 139,292,986 exactly (vocab_size=30522, mask_id=103).
  (V = 30,523, i.e. an appended MASK row, would give 139,294,523.)
HMDLM K=2 adds the level table (K+1)·H = 2,304 and the hierarchy head H + (2HC + 2H) + (HK + K)
= 200,450: 202,754 in all (≈ 0.2M, paper section 5.1).
Sudoku "25M" (H=384, 6 heads, C=128, M=1536, 12 blocks): 2,069,376 per block, total
24,981,376 + 769·V: 24,989,066 for V = 10 (digits 1–9 + MASK) or 24,989,835 for V = 11 (0–9 +
MASK) ≈ 24.99M. K=6 adds 7·384 + 384 + (2·384·128 + 768) + (384·6 + 6) = 104,454 (≈104K, 25.09M).

Single-pass variant (SPEC 4): a separate learned table W_tok_lvl [(K+1), H] ('token_level_embed';
K levels + an h_m row for "level unknown") is indexed by `token_levels` and added to the final
hidden state before the token head only; the hierarchy head sees the plain hidden state. It is
separate from the input level table because it plays a different role (conditioning the output on
the position's own level, not describing the input state).

Parameter names follow MDLM's state dict (torch Linear weight [out, in] = our kernel transposed):
vocab_embed/embedding, sigma_map/mlp_{0,2}, blocks_{i}/{norm1, attn_qkv, attn_out, norm2, mlp_0,
mlp_2, adaLN_modulation}, output_layer/{norm_final, adaLN_modulation, linear}. attn_qkv's kernel is
[H, 3, heads, head_dim] (MDLM's 'b s (three h d)' order) and attn_out's [heads, head_dim, H].
HMDLM adds level_embed/embedding, hier_layer/..., and (single pass) token_level_embed/embedding.
The input level table is zero-initialised (the paper does not say): the network starts exactly as
its MDLM twin and learns to use the levels. Measured on the Sudoku demo: with a random table (the
scale of the token embedding) added to every input, training sat on its chance-level plateau for
hundreds of steps longer.

Precision (model.dtype): parameters, residual stream, LayerNorm statistics, softmax, rotary and the
time MLP are float32; matmuls run in the compute dtype with float32 accumulation; the logits are
returned in float32 (layers.py).

The SUBS parameterisation and the hierarchy prior correction are NOT applied here
(hmdlm_jax/parameterization.py does both); outputs are raw float32 logits.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers

Array = jax.Array


class DDiTBlock(nn.Module):
  """One adaLN-zero transformer block. x [B, L, H] f32, c [B, cond] f32 -> [B, L, H] f32."""
  num_heads: int
  mlp_dim: int
  dropout: float = 0.1
  rotary: bool = True
  dtype: Any = jnp.float32
  relation_bias: bool = False  # Sudoku relation attention bias (position_embedding='sudoku_rel')

  @nn.compact
  def __call__(self, x: Array, c: Array, rope: tuple[Array, Array] | None,
               train: bool = False) -> Array:
    b, l, h = x.shape
    hd = h // self.num_heads
    mod = layers.Dense((6 * h,), ('cond', 'embed'), kernel_init=layers.zeros_init,
                       bias_init=layers.zeros_init, dtype=self.dtype, out_dtype=jnp.float32,
                       name='adaLN_modulation')(c)  # adaLN-zero
    shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(mod, 6, axis=-1)

    # Attention branch.
    y = layers.modulate(layers.LayerNorm(name='norm1')(x), shift1, scale1)
    qkv = layers.Dense((3, self.num_heads, hd), ('embed', 'qkv', 'heads', 'kv'), use_bias=False,
                       dtype=self.dtype, name='attn_qkv')(y)  # [B, L, 3, nh, hd]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    if self.rotary:
      q = layers.apply_rotary(q, *rope)
      k = layers.apply_rotary(k, *rope)
    bias = layers.SudokuRelationBias(self.num_heads, name='relation')() if self.relation_bias \
        else None
    y = layers.attention(q, k, v, self.dtype, bias)
    y = layers.Dense((h,), ('heads', 'kv', 'embed'), n_in=2, use_bias=False, dtype=self.dtype,
                     out_dtype=jnp.float32, name='attn_out')(y)
    y = nn.Dropout(self.dropout, deterministic=not train)(y)
    x = x + gate1[:, None, :] * y
    x = layers.constrain(x, ('batch', 'length', 'embed'))

    # MLP branch.
    y = layers.modulate(layers.LayerNorm(name='norm2')(x), shift2, scale2)
    y = layers.Dense((self.mlp_dim,), ('embed', 'mlp'), dtype=self.dtype, name='mlp_0')(y)
    y = nn.gelu(y, approximate=True)
    y = layers.Dense((h,), ('mlp', 'embed'), dtype=self.dtype, out_dtype=jnp.float32,
                     name='mlp_2')(y)
    y = nn.Dropout(self.dropout, deterministic=not train)(y)
    x = x + gate2[:, None, :] * y
    return layers.constrain(x, ('batch', 'length', 'embed'))


class DiT(nn.Module):
  """MDLM DiT + HMDLM level table / hierarchy head; see the module docstring.

  __call__(tokens [B,L] int, levels [B,L] int in 0..K (K = h_m), t [B] float,
           heads=('hier','token'), token_levels [B,L] | None, train) -> dict:
    'hier'  -> float32 [B, L, K] raw hierarchy logits (K = 1: zeros, log-prob 0 of the one level)
    'token' -> float32 [B, L, V] raw token logits (no SUBS)
  Only the requested heads are computed. train=True applies dropout (rng stream 'dropout').
  """
  vocab_size: int
  num_levels: int
  num_layers: int = 12
  hidden_size: int = 768
  num_heads: int = 12
  mlp_dim: int = 3072
  cond_dim: int = 128
  dropout: float = 0.1
  time_conditioning: bool = False
  single_pass: bool = False
  position_embedding: str = 'rotary'  # 'rotary' | 'learned' | 'sudoku' | 'sudoku_rel'
  seq_len: int = 128
  tie_embeddings: bool = False
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
    out: dict[str, Array] = {}
    if k == 1 and 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, 1), jnp.float32)  # one level: log g = 0 exactly
      if heads == ('hier',):
        return out

    vocab_embed = layers.Embed(self.vocab_size, self.hidden_size, ('vocab', 'embed'),
                               name='vocab_embed')
    x = vocab_embed(tokens)
    if k > 1:  # (K+1) × H table, last row = h_m (paper section 4.3.2)
      # Zero-init: the network starts as MDLM's and learns to use the levels (docstring).
      x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'), layers.zeros_init,
                           name='level_embed')(levels)
    if self.position_embedding != 'rotary':
      x = x + layers.PositionEmbedding(self.position_embedding, self.seq_len, self.hidden_size,
                                       name='position')(l)[None]
    x = layers.constrain(x, ('batch', 'length', 'embed'))

    # MDLM feeds σ = 0 when time conditioning is off; the embedder exists either way.
    t_in = t if self.time_conditioning else jnp.zeros_like(t)
    # The time MLP is tiny: float32 regardless of the compute dtype (MDLM runs it outside autocast).
    c = nn.silu(layers.TimestepEmbedder(self.cond_dim, name='sigma_map')(t_in))

    rotary = self.position_embedding == 'rotary'
    hd = self.hidden_size // self.num_heads
    rope = layers.rotary_cos_sin(l, hd) if rotary else None
    for i in range(self.num_layers):
      x = DDiTBlock(self.num_heads, self.mlp_dim, self.dropout, rotary, dtype,
                    self.position_embedding == 'sudoku_rel', name=f'blocks_{i}')(x, c, rope, train)

    if 'hier' in heads and k > 1:
      # hier_stop_gradient: L_hier and L_cons train the head only (and pass 1 needs no backward
      # through the backbone); the backbone learns from the token loss alone.
      hx, hc = (jax.lax.stop_gradient(x), jax.lax.stop_gradient(c)) if self.hier_stop_gradient \
          else (x, c)
      out['hier'] = layers.AdaLNFinalLayer(k, 'levels', dtype, name='hier_layer')(hx, hc)
    if 'token' in heads:
      if self.single_pass and k > 1:
        x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'),
                             name='token_level_embed')(token_levels)
      tied = vocab_embed.embedding if self.tie_embeddings else None
      out['token'] = layers.AdaLNFinalLayer(self.vocab_size, 'vocab', dtype,
                                            name='output_layer')(x, c, tied)
    return out
