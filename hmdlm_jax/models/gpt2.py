"""The compact backbone of the paper's grid models: a bidirectional GPT-2-style transformer.

Pre-LN blocks without a causal mask, a final LayerNorm shared by both heads, the token head tied
to the input embedding, and a plain Linear hierarchy head on that LayerNorm (no conditioning
vector to modulate with); positions learned (absolute, or a task's: models/features.py) or rotary,
time conditioning optional. `GPT2`'s docstring spells out the architecture and its options.

The method and the parameter counts: docs/method.md §4.6 (b), paper App. F; the hierarchy parts:
models/hierarchy.py.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import hierarchy
from hmdlm_jax.models import layers
from hmdlm_jax.models import token_head

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
    x = layers.residual_grad_boundary(x)  # speed only: see its docstring
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


class GPT2(hierarchy.HierarchicalBackbone):
  """Bidirectional GPT-2 backbone with level table and hierarchy head (docs/method.md §4.6 (b)).

  Call contract: `hierarchy.HierarchicalBackbone` (tokens [B,L], levels [B,L], t [B], heads,
  token_levels, train) -> {'hier': f32 [B,L,K], 'token': f32 [B,L,V]} (raw logits).

  Architecture:
    x = Dropout(wte[tokens] (+ W_lvl[levels] if K > 1) + positions (+ time_proj(c) if time-cond.))
    N × pre-LN block:  x = x + Dropout(W_o · Attn(W_qkv · LN_1(x)))        (no causal mask)
                       x = x + Dropout(MLP(LN_2(x)))                     MLP: H->M->H, GELU(tanh)
    z = LN_f(x);  token logits = LN_f(x [+ W_tok_lvl[token_levels]]) · wteᵀ  (tied, no bias)
                  hierarchy logits = Linear_{H->K}(z)                     (K > 1 only)
  LayerNorms have weight and bias; every Linear has a bias (GPT-2). Dropout is applied to the
  input embedding and the two residual branches (not to attention probabilities). The hierarchy
  head `hier_head` = Linear(LN_f(x)) has the token head's form (LN_f then a linear map), with no
  adaLN.

  Positions: 'learned' (GPT-2's absolute table [seq_len, H]), a task's (models/features.py: e.g.
  a grid's learned row / column / box tables) or 'rotary' (rotate-half on q, k; no absolute
  table); a task's relation bias needs the DiT. Time conditioning (optional, default off like MDLM): c = SiLU(sigma_map(t)) as in the
  DiT, and `time_proj` (Linear cond -> H, zero-init so switching it on starts from the
  unconditioned model) adds c's projection to every input position; built only when switched on.
  Single-pass variant: `token_level_embed` [(K+1), H] added to the hidden state before LN_f on the
  token path only (as in the DiT). `tie_embeddings=False` gives a separate `lm_head` (H -> V, no
  bias).

  Initialisation follows GPT-2: N(0, 0.02) for kernels and tables, N(0, 0.02/√(2N)) for the two
  residual output projections, zero biases, LayerNorm weight 1 / bias 0.
  """
  # The paper's "6M" grid model; the other fields and defaults: HierarchicalBackbone.
  num_layers: int = 3
  hidden_size: int = 384
  mlp_dim: int = 1536
  position_embedding: str = 'learned'  # 'learned' | 'rotary' | a task's (features.positions)
  seq_len: int = 81
  tie_embeddings: bool = True

  token_embed_name: ClassVar[str] = 'wte'
  embedding_std: ClassVar[float | None] = INIT_STD

  def trunk(self, x: Array, t: Array, rope: tuple[Array, Array] | None,
            train: bool) -> tuple[Array, None]:
    """x [B, L, H] -> (x [B, L, H], None): the heads take no conditioning vector."""
    if self.time_conditioning:
      c = nn.silu(layers.TimestepEmbedder(self.cond_dim, name='sigma_map')(t))  # float32
      x = x + layers.Dense((self.hidden_size,), ('cond', 'embed'), kernel_init=layers.zeros_init,
                           bias_init=layers.zeros_init, dtype=self.compute_dtype,
                           out_dtype=jnp.float32, name='time_proj')(c)[:, None, :]
    x = nn.Dropout(self.dropout, deterministic=not train)(x)
    x = layers.constrain(x, ('batch', 'length', 'embed'))
    for i in range(self.num_layers):
      x = GPT2Block(self.num_heads, self.mlp_dim, self.num_layers, self.dropout, rope is not None,
                    self.compute_dtype, name=f'h_{i}')(x, rope, train)
    return x, None

  def make_heads(self, token_table: layers.Embed) -> hierarchy.Heads:
    """Every head reads the one final LayerNorm `ln_f`: Linear H -> K, wteᵀ (or `lm_head`), and
    HDLM's auxiliary Linear H -> n."""
    dtype = self.compute_dtype
    ln_f = layers.LayerNorm(use_bias=True, name='ln_f')
    hier_head = layers.Dense((self.num_levels,), ('embed', 'levels'),
                             kernel_init=self.embedding_init, bias_init=layers.zeros_init,
                             dtype=dtype, out_dtype=jnp.float32, name='hier_head')
    cluster_head = layers.Dense((self.cluster_head,), ('embed', 'clusters'),
                                kernel_init=self.embedding_init, bias_init=layers.zeros_init,
                                dtype=dtype, out_dtype=jnp.float32, name='cluster_head')
    lm_head = None
    if not self.tie_embeddings:
      lm_head = layers.LinearWeights((self.vocab_size,), ('embed', 'vocab'), use_bias=False,
                                     kernel_init=self.embedding_init, name='lm_head')

    def hier(x: Array, c: Array | None) -> Array:
      del c  # no conditioning vector
      return hier_head(ln_f(x))

    def token(x: Array, c: Array | None, query: token_head.TokenQuery | None = None) -> Array:
      del c
      z = ln_f(x)
      proj = (token_head.Projection(token_table.embedding, None, vocab_major=True)
              if lm_head is None else lm_head(z.shape[-1]))
      if query is not None:
        return token_head.selected_nll(z, proj, query, dtype)
      return token_head.logits(z, proj, dtype)

    def cluster(x: Array, c: Array | None) -> Array:
      del c
      return cluster_head(ln_f(x))

    return hierarchy.Heads(hier=hier, token=token, cluster=cluster)

  def block(self, name: str, mlp_dim: int, num_heads: int) -> hierarchy.BlockFn:
    """One pre-LN block like the trunk's, for the hierarchy trunk (it reads no c)."""
    blk = GPT2Block(num_heads, mlp_dim, self.num_layers, self.dropout,
                    self.position_embedding == 'rotary', self.compute_dtype, name=name)
    return lambda x, c, rope, train: blk(x, rope, train)
