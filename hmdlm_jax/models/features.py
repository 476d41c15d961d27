"""What a task hands the model besides its tokens: positions, relations, input features.

The backbones know rotary and learned positions only. A task whose inputs have structure of their
own (a grid's rows, columns and boxes; hmdlm_jax/tasks/) gives `models.build_model(cfg_model,
features)` a `ModelFeatures`; every part is optional and None is the generic model:
  positions  a module factory (seq_len, H, embedding_init, name=) whose module maps the length L
             to float32 [L, H], added to the embedded input (named 'position'; in place of
             `model.position_embedding`'s table, which must then be none of 'rotary', 'learned');
  relations  `Relations`: a class per pair of positions; every DiT attention layer adds a learned
             per-head bias of each class to its scores (`RelationBias`, 'blocks_i/relation');
  inputs     `InputFeatures`: float features of the tokens, added through zero-init Linears to the
             trunk's input and / or the level pathway's own view of it (models/pathway.py).
Every field is a function, class or number, so a backbone holding one stays hashable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.models import layers

Array = jax.Array
# positions(seq_len, H, embedding_init, name=...) -> a module: length L -> float32 [L, H].
PositionFactory = Callable[..., nn.Module]


@dataclasses.dataclass(frozen=True)
class Relations:
  """classes(L) -> int [L, L]: the relation class of each pair of positions, in 0..num_classes-1."""
  classes: Callable[[int], np.ndarray]
  num_classes: int


@dataclasses.dataclass(frozen=True)
class InputFeatures:
  """fn(tokens int [B, L]) -> float32 [B, L, F]: features of the tokens as given, MASK counting as
  unknown. `trunk`: added to the trunk's input ('candidate_proj'); `pathway`: to the level
  pathway's own input view ('hier_candidate_proj', with model.pathway.input_embed), computed there
  from the given positions alone when model.given_state marks them (docs/method.md §4.7)."""
  fn: Callable[[Array], Array]
  trunk: bool = True
  pathway: bool = True


@dataclasses.dataclass(frozen=True)
class ModelFeatures:
  """A task's features of the model (module docstring); all None: the generic model."""
  positions: PositionFactory | None = None
  relations: Relations | None = None
  inputs: InputFeatures | None = None


class RelationBias(nn.Module):
  """Learned per-head attention bias of each relation class: scores[h, i, j] += table[rel(i, j), h].
  Zero-init, so training starts from plain attention. Returns float32 [nh, L, L]."""
  num_heads: int
  relations: Relations

  @nn.compact
  def __call__(self, length: int) -> Array:
    table = self.param('relation_bias',
                       nn.with_logical_partitioning(layers.zeros_init, (None, 'heads')),
                       (self.relations.num_classes, self.num_heads), jnp.float32)
    return jnp.transpose(table[jnp.asarray(self.relations.classes(length))], (2, 0, 1))


def feature_projection(hidden_size: int, dtype: Any, name: str) -> layers.Dense:
  """Zero-init Linear of the input features [B, L, F] -> float32 [B, L, H] (the network starts as
  it would without them)."""
  return layers.Dense((hidden_size,), (None, 'embed'), kernel_init=layers.zeros_init,
                      bias_init=layers.zeros_init, dtype=dtype, out_dtype=jnp.float32, name=name)
