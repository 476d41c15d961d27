"""MDLM's diffusion transformer (DiT) with HMDLM's level table and hierarchy head.

A Flax re-implementation of kuleshov-group/mdlm's `models/dit.py`: adaLN-zero blocks, rotary
positions, a time embedding fed t itself (or 0 with time conditioning off), and adaLN final layers
for the token head (H -> V) and the hierarchy head (H -> K, K > 1 only). Parameter names follow
MDLM's state dict, so MDLM checkpoints convert directly (convert_mdlm.py); `DiT`'s docstring
spells out the architecture and the names. Outputs are raw float32 logits: SUBS and the prior
correction are applied in processes/parameterization.py.

The method, the initialisation and the parameter counts: docs/method.md §4 (§4.1, §4.4, §4.6);
the hierarchy parts (tables, heads contract): models/hierarchy.py; the level pathway: pathway.py.
`model.remat` rematerialises each block in the backward pass (REMAT_POLICIES; docs/method.md §4.6).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import hierarchy
from hmdlm_jax.models import layers
from hmdlm_jax.models import token_head
from hmdlm_jax.models.features import RelationBias
from hmdlm_jax.models.features import Relations

Array = jax.Array


class DDiTBlock(nn.Module):
  """One adaLN-zero transformer block. x [B, L, H] f32, c [B, cond] f32 -> [B, L, H] f32."""
  num_heads: int
  mlp_dim: int
  dropout: float = 0.1
  rotary: bool = True
  dtype: Any = jnp.float32
  relations: Relations | None = None  # a task's relation classes: a learned attention bias

  @nn.compact
  def __call__(self, x: Array, c: Array, rope: tuple[Array, Array] | None,
               train: bool = False) -> Array:
    b, l, h = x.shape
    hd = h // self.num_heads
    x = layers.residual_grad_boundary(x)  # speed only: see its docstring
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
    bias = None
    if self.relations is not None:
      bias = RelationBias(self.num_heads, self.relations, name='relation')(l)
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


# model.remat -> the jax.checkpoint policy of every block (docs/method.md §4.6): what a block's
# forward keeps for the backward pass; the rest is recomputed there. 'none' = no jax.checkpoint
# at all (the program without remat); 'block' = nothing inside a block (only its inputs, the
# residual stream and c, stay live between the passes: least memory, one more forward of the
# blocks); 'dots' = the results of the matmuls without batch dimensions (the Dense projections;
# the attention scores, softmax, norms and GELU are recomputed).
REMAT_POLICIES: dict[str, Any] = {
    'none': None,
    'block': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _remat_block(policy: str) -> type[DDiTBlock]:
  # static_argnums counts self: `train` (argument 4) selects dropout, a Python bool.
  return nn.remat(DDiTBlock, policy=REMAT_POLICIES[policy], static_argnums=(4,))


# One lifted class per policy: the module name is explicit at every use (blocks_{i}, ...), so the
# parameter paths are the same with and without remat and checkpoints load either way.
BLOCK_CLASSES: dict[str, type[DDiTBlock]] = {
    name: DDiTBlock if policy is None else _remat_block(name)
    for name, policy in REMAT_POLICIES.items()}


class DiT(hierarchy.HierarchicalBackbone):
  """MDLM DiT + HMDLM level table / hierarchy head (docs/method.md §4.6).

  Call contract: `hierarchy.HierarchicalBackbone` (tokens [B,L], levels [B,L], t [B], heads,
  token_levels, train) -> {'hier': f32 [B,L,K], 'token': f32 [B,L,V]} (raw logits).

  Architecture:
    x = E_tok[tokens] (+ W_lvl[levels] if K > 1) (+ absolute positions if not rotary)   [B, L, H]
    c = SiLU(sigma_map(t))   sigma_map: 256-dim sinusoid -> Linear -> SiLU -> Linear (cond_dim)
    N × DDiTBlock (adaLN-zero):
      shift1, scale1, gate1, shift2, scale2, gate2 = Linear_{cond->6H}(c)        (zero-init)
      x = x + gate1 · Dropout(W_o · Attn(rotary(W_qkv · modulate(LN(x), shift1, scale1))))
      x = x + gate2 · Dropout(MLP(modulate(LN(x), shift2, scale2)))   MLP: H->M->H, GELU(tanh)
    token head     = adaLN final layer (LN, Linear_{cond->2H}, Linear_{H->V}), all zero-init
    hierarchy head = the same form with H->K (K > 1 only)
  LayerNorms have a weight and no bias; q/k/v and the attention output have no bias; the MLP and
  all adaLN / head Linears have biases; no weight tying (unless `tie_embeddings`); dropout only on
  the two residual branches. Rotary: rotate-half convention, base 1e4, on q and k (positions
  0..L-1). Without time conditioning the embedder is fed t = 0, as MDLM feeds σ = 0
  (diffusion.py `_process_sigma`), so c is a learned constant and the parameter count does not
  depend on the flag.

  Single-pass variant: a separate table W_tok_lvl [(K+1), H] ('token_level_embed'; K levels + an
  h_m row for "level unknown") is indexed by `token_levels` and added to the final hidden state
  before the token head only (it conditions the output on the position's own level, a different
  role from the input table's).

  Parameter names (torch Linear weight [out, in] = our kernel transposed): vocab_embed/embedding,
  sigma_map/mlp_{0,2}, blocks_{i}/{norm1, attn_qkv, attn_out, norm2, mlp_0, mlp_2,
  adaLN_modulation}, output_layer/{norm_final, adaLN_modulation, linear}. attn_qkv's kernel is
  [H, 3, heads, head_dim] (MDLM's 'b s (three h d)' order) and attn_out's [heads, head_dim, H].
  HMDLM adds level_embed/embedding, hier_layer/..., and (single pass) token_level_embed/embedding;
  the optional hierarchy pathway (hierarchy.py) adds hier_blocks_{i}/... (blocks of the trunk's
  form), hier_time_embed/..., hier_level_embed/embedding.

  Precision (model.dtype): parameters, residual stream, LayerNorm statistics, softmax, rotary and
  the time MLP are float32; matmuls run in the compute dtype with float32 accumulation; the logits
  are returned in float32 (layers.py).
  """
  # Fields and their defaults (MDLM's LM1B DiT): hierarchy.HierarchicalBackbone.
  token_embed_name: ClassVar[str] = 'vocab_embed'
  embedding_std: ClassVar[float | None] = None  # MDLM's (torch) defaults
  remat: str = 'none'  # model.remat: a key of REMAT_POLICIES (every block built by `block_class`)

  @property
  def block_class(self) -> type[DDiTBlock]:
    """DDiTBlock, or its jax.checkpoint of policy `remat` (same parameters, same outputs)."""
    if self.remat not in BLOCK_CLASSES:
      raise ValueError(f'model.remat={self.remat!r} is invalid: allowed {tuple(BLOCK_CLASSES)}.')
    return BLOCK_CLASSES[self.remat]

  def trunk(self, x: Array, t: Array, rope: tuple[Array, Array] | None,
            train: bool) -> tuple[Array, Array]:
    """x [B, L, H] -> (x [B, L, H], c [B, cond_dim]) through the adaLN-zero blocks."""
    x = layers.constrain(x, ('batch', 'length', 'embed'))
    c = self.conditioning(t)
    for i in range(self.num_layers):
      x = self.block_class(self.num_heads, self.mlp_dim, self.dropout, rope is not None,
                           self.compute_dtype, self.features.relations,
                           name=f'blocks_{i}')(x, c, rope, train)
    return x, c

  def conditioning(self, t: Array) -> Array:
    """c [B, cond_dim] = SiLU(the embedding of t), or of 0 without time conditioning."""
    # MDLM feeds σ = 0 when time conditioning is off; the embedder exists either way.
    t_in = t if self.time_conditioning else jnp.zeros_like(t)
    # The time MLP is tiny: float32 regardless of the compute dtype (MDLM runs it outside autocast).
    return nn.silu(layers.TimestepEmbedder(self.cond_dim, name='sigma_map')(t_in))

  def make_heads(self, token_table: layers.Embed) -> hierarchy.Heads:
    """Every head is an adaLN final layer (MDLM's DDitFinalLayer) on (x, c): H -> K, H -> V and
    (HDLM's auxiliary head, the authors' form) H -> n."""
    dtype = self.compute_dtype
    hier_layer = layers.AdaLNFinalLayer(self.num_levels, 'levels', dtype, name='hier_layer')
    output_layer = layers.AdaLNFinalLayer(self.vocab_size, 'vocab', dtype, name='output_layer')
    cluster_layer = layers.AdaLNFinalLayer(self.cluster_head, 'clusters', dtype,
                                           name='cluster_layer')

    def token(x: Array, c: Array | None, query: token_head.TokenQuery | None = None) -> Array:
      tied = token_table.embedding if self.tie_embeddings else None
      return output_layer(x, c, tied, query)

    return hierarchy.Heads(hier=hier_layer, token=token, cluster=cluster_layer)

  def block(self, name: str, mlp_dim: int, num_heads: int) -> hierarchy.BlockFn:
    """One adaLN-zero block like the trunk's (identity at init), for the hierarchy trunk."""
    return self.block_class(num_heads, mlp_dim, self.dropout,
                            self.position_embedding == 'rotary', self.compute_dtype,
                            self.features.relations, name=name)
