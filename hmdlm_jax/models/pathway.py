"""The level pathway beside a backbone: everything the 'hier' heads read (docs/method.md §4.7).

  hx, hc = the trunk's output x and c (source 'features', the paper), or the embedded input
           before the trunk (source 'input': a level network of its own beside the trunk)
  hx, hc = stop_gradient(hx, hc)                      if stop_gradient
  hx += W_hin[levels] (+ W_hcand · f(givens))         if input_embed: its own input-state table and
                                                      the task's input features (models/features.py)
  hx += Linear(SiLU(embedding of t))                  if time_conditioning (zero-init Linear)
  hx = (hier_blocks_0 .. hier_blocks_{N-1})^R (hx)    N = layers blocks of the backbone's kind, R =
                                                      repeats, at `width` between two projections
  'hier' = the backbone's level head (hx, hc), or readout 'rounds': stick-breaking over R = K-1
  'hier_round_tokens' = Linear(LN(hx_r)), r = 1..R    with round_tokens (loss.beta_rounds > 0)
Every part starts as the identity. `Pathway` shares its backbone's scope (nn.share_scope), so its
parameters are the backbone's top-level 'hier_*' ones; `settings(cfg)` reads model.hier_*.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.config import ModelConfig
from hmdlm_jax.models import layers
from hmdlm_jax.models.features import InputFeatures
from hmdlm_jax.models.features import feature_projection

Array = jax.Array
Rope = tuple[Array, Array] | None
# Top-level parameter names used only by the level pathway start with this prefix (the level head
# 'hier_layer' / 'hier_head', the blocks 'hier_blocks_i', 'hier_time_*', 'hier_level_embed', the
# round readout and token head 'hier_round_*'); optim.py clips their gradient as a group of its own.
HIER_PREFIX = 'hier_'
# block(x [B, L, H], c [B, C] | None, rope, train) -> [B, L, H]: one backbone block.
BlockFn = Callable[[Array, Array | None, Rope, bool], Array]
# A backbone's `block(name, mlp_dim, num_heads)`: one block of its kind, named `name`.
BlockFactory = Callable[[str, int, int], BlockFn]
# The backbone's level head: (hx [B, L, H], hc [B, C] | None) -> float32 logits [B, L, K].
LevelHead = Callable[[Array, Array | None], Array]


@dataclasses.dataclass(frozen=True)
class PathwaySettings:
  """The pathway's settings (model.pathway, model.hier_stop_gradient); all off: the paper's head
  on the trunk's output."""
  source: str = 'features'  # 'features' (the trunk's output) | 'input' (the embedded input)
  stop_gradient: bool = False  # the pathway reads detached backbone features
  input_embed: bool = False  # its own input-state table (and the task's input features)
  time_conditioning: bool = False  # its own embedding of t
  layers: int = 0  # N blocks of the backbone's kind before the level head
  repeats: int = 1  # R applications of those N blocks (weight-tied recurrence when R > 1)
  width: int = 0  # width of its blocks (0 = hidden_size); projections in and out
  num_heads: int = 0  # attention heads of its blocks (0 = the backbone's)
  readout: str = 'head'  # 'head' (the backbone's level head) | 'rounds' (`_round_readout`)
  round_tokens: bool = False  # a token head on each repeat's features (the per-round loss)

  @property
  def reads_trunk(self) -> bool:
    """Whether the pathway reads the trunk's output (else the embedded input beside it)."""
    return self.source == 'features'


def settings(cfg: ModelConfig) -> PathwaySettings:
  """The pathway's settings of a validated `model` section."""
  p = cfg.pathway
  return PathwaySettings(
      source=p.source, stop_gradient=cfg.hier_stop_gradient, input_embed=p.input_embed,
      time_conditioning=p.time_conditioning, layers=p.layers, repeats=p.repeats, width=p.width,
      num_heads=p.num_heads, readout=p.readout, round_tokens=p.round_tokens)


class Pathway(nn.Module):
  """The level pathway of the module docstring, built inside a backbone's compact `__call__`.

  __call__(hx [B, L, H], hc [B, C] | None, tokens, levels [B, L], t [B], rope, train,
           features [B, L, F] | None (the input's, when it computed them), heads, level_head)
  -> {'hier': float32 [B, L, K]} and, when requested, {'hier_round_tokens': [B, L, R, V]}.
  The backbone's fields it needs are its own (`block` is the backbone's hook).
  """
  settings: PathwaySettings
  block: BlockFactory
  vocab_size: int
  num_levels: int
  num_input_states: int  # rows of its input-state table: K levels, h_m (and h_g)
  given_state: bool  # given positions read h_g = K+1: its input features see them alone
  mask_id: int  # shown at every other position when the input features see the givens alone
  hidden_size: int
  mlp_dim: int
  num_heads: int
  cond_dim: int
  dtype: Any  # compute dtype of the matrix products
  inputs: InputFeatures | None = None

  @nn.compact
  def __call__(self, hx: Array, hc: Array | None, tokens: Array, levels: Array, t: Array,
               rope: Rope, train: bool, features: Array | None, heads: tuple[str, ...],
               level_head: LevelHead) -> dict[str, Array]:
    if self.settings.stop_gradient:
      # L_hier and L_cons then train the pathway only (and pass 1 needs no backward through the
      # backbone); the backbone learns from the token loss alone.
      hx, hc = jax.lax.stop_gradient(hx), jax.lax.stop_gradient(hc)
    hx = self._input_view(hx, tokens, levels, t, features)
    hx, per_round = self._blocks(hx, hc, rope, train)
    if self.settings.readout != 'rounds':
      return {'hier': level_head(hx, hc)}
    normed = self._round_features(per_round)
    out = {}
    if 'hier' in heads:
      out['hier'] = self._round_readout(normed)
    if 'hier_round_tokens' in heads:
      out['hier_round_tokens'] = self._round_tokens(normed)
    return out

  def _input_view(self, hx: Array, tokens: Array, levels: Array, t: Array,
                  features: Array | None) -> Array:
    """hx [B, L, H] plus the pathway's own view of the input states, input features and time."""
    if self.settings.input_embed:
      hx = hx + layers.Embed(self.num_input_states, self.hidden_size, ('levels', 'embed'),
                             layers.zeros_init, name=f'{HIER_PREFIX}level_embed')(levels)
      if self.inputs is not None and self.inputs.pathway:
        # The features of the givens alone when it knows them (the labeller computes the levels
        # from them); else the input's, computed there when the trunk reads them too.
        if self.given_state:
          if self.mask_id < 0:  # models.build_model passes the config's resolved mask_id
            raise ValueError('the pathway shows the non-given positions as MASK: build the '
                             'model with models.build_model (mask_id >= 0).')
          features = self.inputs.fn(jnp.where(levels == self.num_levels + 1, tokens,
                                              self.mask_id))
        elif features is None:
          features = self.inputs.fn(tokens)
        hx = hx + feature_projection(self.hidden_size, self.dtype,
                                     f'{HIER_PREFIX}candidate_proj')(features)
    if self.settings.time_conditioning:  # zero-init projection of its own time embedding
      ct = nn.silu(layers.TimestepEmbedder(self.cond_dim, name=f'{HIER_PREFIX}time_embed')(t))
      hx = hx + layers.Dense((self.hidden_size,), ('cond', 'embed'), kernel_init=layers.zeros_init,
                             bias_init=layers.zeros_init, dtype=self.dtype,
                             out_dtype=jnp.float32, name=f'{HIER_PREFIX}time_proj')(ct)[:, None, :]
    return hx

  def _blocks(self, hx: Array, hc: Array | None, rope: Rope, train: bool
              ) -> tuple[Array, list[Array]]:
    """(hx after R repeats of the N blocks [B, L, H], [the blocks' output after each repeat])."""
    s = self.settings
    if not s.layers:
      return hx, []
    width = s.width or self.hidden_size
    mlp_dim = self.mlp_dim * width // self.hidden_size
    # Fewer heads cost the same matmul FLOPs but fewer [B, heads, L, L] softmax elements, which
    # dominate a narrow pathway's time on CPU (docs/method.md §4.7).
    heads = s.num_heads or self.num_heads
    blocks = [self.block(f'{HIER_PREFIX}blocks_{i}', mlp_dim, heads) for i in range(s.layers)]
    z = hx
    if width != self.hidden_size:  # a narrower (cheaper) trunk between two projections
      z = layers.Dense((width,), ('embed', None), dtype=self.dtype, out_dtype=jnp.float32,
                       name=f'{HIER_PREFIX}in_proj')(hx)
    if rope is not None and width // heads != self.hidden_size // self.num_heads:
      rope = layers.rotary_cos_sin(hx.shape[1], width // heads)
    per_round = []
    for _ in range(s.repeats):
      for block in blocks:
        z = block(z, hc, rope, train)
      per_round.append(z)
    if width != self.hidden_size:  # residual, zero-init: the identity at init
      z = hx + layers.Dense((self.hidden_size,), (None, 'embed'), kernel_init=layers.zeros_init,
                            bias_init=layers.zeros_init, dtype=self.dtype,
                            out_dtype=jnp.float32, name=f'{HIER_PREFIX}out_proj')(z)
    return z, per_round

  def _round_features(self, per_round: list[Array]) -> list[Array]:
    """LN(hx_r) [B, L, H'] of each repeat r, one LayerNorm shared by the rounds (what the round
    readout and the per-round token head read)."""
    norm = layers.LayerNorm(name=f'{HIER_PREFIX}round_norm')
    return [norm(h) for h in per_round]

  def _round_tokens(self, normed: list[Array]) -> Array:
    """Token logits [B, L, R, V] of each round, one zero-init Linear shared by the rounds.

    Trained by the per-round token loss (processes/level_objectives.py `round_token_loss`): round
    r learns the tokens of the positions whose level the first r rounds decide, so each repeat is
    told what its round of propagation should know (docs/method.md §5.1).
    """
    head = layers.Dense((self.vocab_size,), ('embed', 'vocab'), kernel_init=layers.zeros_init,
                        bias_init=layers.zeros_init, dtype=self.dtype,
                        out_dtype=jnp.float32, name=f'{HIER_PREFIX}round_token_head')
    return jnp.stack([head(h) for h in normed], axis=2)

  def _round_readout(self, normed: list[Array]) -> Array:
    """readout='rounds': level log-probabilities [B, L, K] by stick-breaking over the rounds.

    Repeat r = 1..K-1 of the blocks reads a hazard p_r = σ(s_r), s_r = Linear(LN(hx_r)) (one
    readout shared by the rounds; `normed` = the LN(hx_r) of `_round_features`): the
    probability that the position is decided in round r if it was not before. Level K-r (higher
    = earlier) has probability p_r Π_{j<r} (1 − p_j) and level 0 the rest, Π_{j<K} (1 − p_j).
    The log-probabilities are valid logits for the head's log-softmax and prior correction.
    This mirrors a labeller whose levels are rounds of propagation (a grid's, docs/method.md
    §6): the level loss reaches each round's readout directly. The readout bias starts at −2
    (hazard 0.12 per round, near the grid labeller's ~0.13).
    """
    readout = layers.Dense((1,), ('embed', None), kernel_init=layers.zeros_init,
                           bias_init=nn.initializers.constant(-2.0), dtype=self.dtype,
                           out_dtype=jnp.float32, name=f'{HIER_PREFIX}round_readout')
    s = jnp.concatenate([readout(h) for h in normed], axis=-1)  # [B, L, K-1]
    log_p, log_q = jax.nn.log_sigmoid(s), jax.nn.log_sigmoid(-s)
    survive = jnp.cumsum(log_q, axis=-1) - log_q  # Σ_{j<r} log(1 − p_j)
    decided = log_p + survive  # round r -> level K - r
    level0 = jnp.sum(log_q, axis=-1, keepdims=True)
    return jnp.concatenate([level0, decided[..., ::-1]], axis=-1)  # levels 0, 1, .., K-1
