"""ADLM's denoiser ψ beside a backbone whose trunk is the anchor network φ (docs/method.md
§13.4).

  'anchor' = y_φ(z_t): the backbone's own token head on its trunk, raw logits [B, L, V]
  h = W_in · y_φ(z_t) + b              a dense V -> H map of the RAW anchor logits (no softmax)
  c = SiLU(its own embedding of t)     (t = 0 without time conditioning, as the trunk's)
  h = denoiser_blocks_0 .. _{N-1}(h)   N blocks of the backbone's kind (rotary positions)
  'token' = an adaLN final layer (h, c) -> [B, L, V]: x_ψ(y_φ(z_t)), the clean-token logits
The denoiser sees z_t only through y_φ(z_t); it shares no parameter with φ. `Denoiser` shares its
backbone's scope (nn.share_scope), so its parameters are the top-level 'denoiser_*' ones.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers
from hmdlm_jax.models import token_head
from hmdlm_jax.models.pathway import BlockFactory

Array = jax.Array
Rope = tuple[Array, Array] | None
# Top-level parameter names of the denoiser start with this prefix (models/__init__.py groups them).
DENOISER_PREFIX = 'denoiser_'


class Denoiser(nn.Module):
  """x_ψ of the module docstring, built inside a backbone's compact `__call__`.

  __call__(anchor_logits float32 [B, L, V], t [B], rope, train, query=None)
  -> float32 token logits [B, L, V]; with a `token_head.TokenQuery` the NLL [B, L] at its rows.
  """
  num_layers: int
  block: BlockFactory
  vocab_size: int
  hidden_size: int
  mlp_dim: int
  num_heads: int
  cond_dim: int
  time_conditioning: bool
  dtype: Any  # compute dtype of the matrix products

  @nn.compact
  def __call__(self, anchor_logits: Array, t: Array, rope: Rope, train: bool,
               query: token_head.TokenQuery | None = None) -> Array:
    # The projection runs in float32 whatever the compute dtype: its input is unbounded raw
    # logits (the authors run it outside autocast; docs/method.md §13.4).
    h = layers.Dense((self.hidden_size,), ('vocab', 'embed'), dtype=jnp.float32,
                     out_dtype=jnp.float32, name=f'{DENOISER_PREFIX}in')(anchor_logits)
    t_in = t if self.time_conditioning else jnp.zeros_like(t)
    c = nn.silu(layers.TimestepEmbedder(self.cond_dim, name=f'{DENOISER_PREFIX}sigma_map')(t_in))
    h = layers.constrain(h, ('batch', 'length', 'embed'))
    for i in range(self.num_layers):
      h = self.block(f'{DENOISER_PREFIX}blocks_{i}', self.mlp_dim, self.num_heads)(h, c, rope,
                                                                                  train)
    head = layers.AdaLNFinalLayer(self.vocab_size, 'vocab', self.dtype,
                                  name=f'{DENOISER_PREFIX}output_layer')
    return head(h, c, None, query)
