"""The hierarchy parts of every backbone, written once (docs/method.md §4, paper section 4.3).

`HierarchicalBackbone` is the call contract shared by the DiT and GPT-2 backbones:

  x = E_tok[tokens] (+ W_lvl[levels] if K > 1) (+ absolute positions unless rotary)     [B, L, H]
  x, c = trunk(x, t)                               backbone-specific: time conditioning, blocks
  'hier'  = hier_head(x, c)            x, c stop-gradient'ed if hier_stop_gradient; K = 1: zeros
  'token' = token_head(x (+ W_tok_lvl[token_levels] if single pass and K > 1), c)

A backbone subclasses it and supplies `trunk` (everything between the input embedding and the
final hidden state) and `make_heads` (the forms of its two output heads); the input level table
('level_embed', zero-init), the K = 1 shortcut, the stop-gradient of the hierarchy head's inputs,
the single-pass token-level table ('token_level_embed') and the choice of which heads run live
here. Every submodule is created inside the backbone's own compact `__call__` (the hooks run in
its scope), so the parameter tree stays flat: level_embed/embedding, token_level_embed/embedding,
position/..., next to the backbone's own top-level names.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers
from hmdlm_jax.models import sudoku_positions

Array = jax.Array
# head(x [B, L, H], c [B, C] | None) -> float32 logits [B, L, K] or [B, L, V].
HeadFn = Callable[[Array, Array | None], Array]

HEADS = ('hier', 'token')


class Heads(NamedTuple):
  """A backbone's two output heads, built once per call by `make_heads`."""
  hier: HeadFn  # -> [B, L, K] raw hierarchy logits
  token: HeadFn  # -> [B, L, V] raw token logits


# ----------------------------------------------------------------------------- call-site checks


def check_heads(heads: Sequence[str]) -> tuple[str, ...]:
  """Validate the requested heads (a static Python tuple, non-empty, from HEADS, no repeats)."""
  heads = tuple(heads)
  if not heads or any(h not in HEADS for h in heads) or len(set(heads)) != len(heads):
    raise ValueError(f'heads={heads!r}: must be a non-empty tuple of distinct names from {HEADS}')
  return heads


def check_inputs(tokens: Array, levels: Array, t: Array, token_levels: Array | None, *,
                 single_pass: bool, num_levels: int, heads: tuple[str, ...]) -> None:
  """Shapes and dtypes of the apply_fn inputs (docs/design.md): tokens, levels [B, L] int; t [B].

  token_levels [B, L] int: required by the single-pass token head when K > 1 (for K = 1 the level
  carries no information and it may be omitted); rejected by the two-pass model.
  """
  chex.assert_rank(tokens, 2)
  chex.assert_equal_shape([tokens, levels])
  chex.assert_shape(t, (tokens.shape[0],))
  chex.assert_type([tokens, levels], int)
  if token_levels is not None:
    if not single_pass:
      raise ValueError("token_levels is only used by model.variant='single_pass'; the two-pass "
                       'model takes the levels through the `levels` input (pass 2)')
    chex.assert_equal_shape([tokens, token_levels])
    chex.assert_type(token_levels, int)
  elif single_pass and num_levels > 1 and 'token' in heads:
    raise ValueError("model.variant='single_pass': the token head needs token_levels [B, L] "
                     "(each position's own level, docs/method.md §4)")


# ----------------------------------------------------------------------------- the backbone


class HierarchicalBackbone(nn.Module):
  """Input tables, level head and token head around a backbone-specific trunk.

  __call__(tokens [B,L] int, levels [B,L] int in 0..K (K = h_m), t [B] float,
           heads=('hier','token'), token_levels [B,L] | None, train) -> dict:
    'hier'  -> float32 [B, L, K] raw hierarchy logits (K = 1: zeros, log-prob 0 of the one level)
    'token' -> float32 [B, L, V] raw token logits (no SUBS)
  Only the requested heads are computed. train=True applies dropout (rng stream 'dropout').
  Subclasses set the defaults of the fields, `token_embed_name`, `embedding_std`, and implement
  `trunk` and `make_heads`.
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

  # Parameter name of the input token table ('vocab_embed' in MDLM's DiT, 'wte' in GPT-2).
  token_embed_name: ClassVar[str] = 'vocab_embed'
  # Std of the N(0, std²) init of the token, position and token-level tables; None = the
  # layers.Embed default (torch's, as in MDLM).
  embedding_std: ClassVar[float | None] = None

  def trunk(self, x: Array, t: Array, rope: tuple[Array, Array] | None,
            train: bool) -> tuple[Array, Array | None]:
    """Embedded input x [B, L, H] -> (final hidden state [B, L, H], conditioning c [B, C] | None).

    rope: rotary cos, sin [L, head_dim] when position_embedding='rotary', else None.
    """
    raise NotImplementedError

  def make_heads(self, token_table: layers.Embed) -> Heads:
    """The two output heads; `token_table` is the input token table (for tied output weights)."""
    raise NotImplementedError

  @nn.compact
  def __call__(self, tokens: Array, levels: Array, t: Array,
               heads: tuple[str, ...] = HEADS, token_levels: Array | None = None,
               train: bool = False) -> dict[str, Array]:
    heads = check_heads(heads)
    check_inputs(tokens, levels, t, token_levels, single_pass=self.single_pass,
                 num_levels=self.num_levels, heads=heads)
    b, l = tokens.shape
    k = self.num_levels
    out: dict[str, Array] = {}
    if k == 1 and 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, 1), jnp.float32)  # one level: log g = 0 exactly
      if heads == ('hier',):
        return out

    token_table = layers.Embed(self.vocab_size, self.hidden_size, ('vocab', 'embed'),
                               self.embedding_init, name=self.token_embed_name)
    x = token_table(tokens)
    if k > 1:  # (K+1) × H table, last row = h_m (paper section 4.3.2)
      # Zero-init: the network starts as its MDLM twin and learns to use the levels (dit.py).
      x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'), layers.zeros_init,
                           name='level_embed')(levels)
    rope = None
    if self.position_embedding == 'rotary':  # applied to q, k inside the trunk's attention
      rope = layers.rotary_cos_sin(l, self.hidden_size // self.num_heads)
    else:
      x = x + self._positions(l)[None]
    x, c = self.trunk(x, t, rope, train)

    head = self.make_heads(token_table)
    if 'hier' in heads and k > 1:
      hx, hc = x, c
      if self.hier_stop_gradient:
        # L_hier and L_cons then train the head only (and pass 1 needs no backward through the
        # backbone); the backbone learns from the token loss alone.
        hx, hc = jax.lax.stop_gradient(x), jax.lax.stop_gradient(c)
      out['hier'] = head.hier(hx, hc)
    if 'token' in heads:
      if self.single_pass and k > 1:
        # Single pass: the token head is told each position's own level; the hierarchy head
        # sees the plain hidden state (docs/method.md §4).
        x = x + layers.Embed(k + 1, self.hidden_size, ('levels', 'embed'), self.embedding_init,
                             name='token_level_embed')(token_levels)
      out['token'] = head.token(x, c)
    return out

  def _positions(self, length: int) -> Array:
    """The absolute position embedding 'position' -> float32 [length, H]."""
    if self.position_embedding in sudoku_positions.SUDOKU_KINDS:
      return sudoku_positions.SudokuPositionEmbedding(
          self.seq_len, self.hidden_size, self.embedding_init, self.position_embedding,
          name='position')(length)
    if self.position_embedding == 'learned':
      return layers.LearnedPositionEmbedding(self.seq_len, self.hidden_size,
                                             self.embedding_init, name='position')(length)
    raise ValueError(f'unknown position embedding kind {self.position_embedding!r}; allowed '
                     "'learned', 'sudoku', 'sudoku_rel' (or 'rotary', applied in attention)")

  @property
  def embedding_init(self) -> layers.Init | None:
    """Init of the token, position and token-level tables (`embedding_std`)."""
    return None if self.embedding_std is None else layers.normal_init(self.embedding_std)

  @property
  def compute_dtype(self) -> Any:
    """The jnp dtype of the matrix products (model.dtype)."""
    return layers.COMPUTE_DTYPES[self.dtype]
