"""Process kinds as the config sees them: what each kind derives and checks (one table).

`PROCESS_RULES` is the one place the config branches on `process.kind` (processes/__init__.py builds
the processes themselves): whether the kind takes hierarchy levels, the ids of its noise states
(MASK, or MultiMDM's masks), the model fields it derives (HDLM's cluster rows and auxiliary head,
ADLM's denoiser), its frozen-target rounds and the check of its own config section. A new process
adds one row here (docs/extending.md); nothing else compares the kind's name. No JAX here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import ml_collections

from hmdlm_jax.config import adlm as config_adlm
from hmdlm_jax.config import hdlm as config_hdlm
from hmdlm_jax.config import mgdm as config_mgdm
from hmdlm_jax.config import multimdm as config_multimdm
from hmdlm_jax.config.checks import check_int
from hmdlm_jax.config.checks import is_int


def resolve_mask_id(vocab_size: Any, mask_id: Any, extra_rows: int = 0) -> int:
  """model.mask_id with -1 meaning the last row before the `extra_rows` (HDLM's cluster tokens):
  vocab_size - 1 - extra_rows (the one place this is resolved)."""
  check_int('model.vocab_size', vocab_size, minimum=2)
  resolved = vocab_size - 1 - extra_rows if mask_id == -1 else mask_id
  if not is_int(resolved) or not 0 <= resolved < vocab_size:
    raise ValueError(f'model.mask_id={mask_id!r} must be -1 (= vocab_size - 1 - '
                     f'model.extra_vocab_rows) or in [0, model.vocab_size={vocab_size}).')
  return resolved


def _mask(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The one MASK row: model.mask_id (-1 = the last row before HDLM's cluster rows)."""
  m = config.model
  return (resolve_mask_id(m.vocab_size, m.mask_id, m.extra_vocab_rows),)


@dataclasses.dataclass(frozen=True)
class KindRules:
  """What the config derives and checks for one process kind (`PROCESS_RULES` is the one place the
  config branches on process.kind; processes/__init__.py builds the processes).

  Attributes:
    levels: why the kind needs model.num_levels = 1, or '' if it takes any K.
    noise_ids: the token ids of the noise states (MASK: model.mask_id; MultiMDM: its M masks, the
      last M rows), read from a resolved config or a run's stored config.json.
    derived: the model fields the kind derives (all of `DERIVED_MODEL_FIELDS`, 0 when not listed).
    check: validates the kind's section against the resolved model and data fields.
    steps_per_round: optimiser steps per round of a frozen target (0: the EMA target).
  """
  levels: str = ''
  noise_ids: Callable[[ml_collections.ConfigDict], tuple[int, ...]] = lambda config: _mask(config)
  derived: Callable[[ml_collections.ConfigDict], Mapping[str, int]] = lambda config: {}
  check: Callable[[ml_collections.ConfigDict], None] = lambda config: None
  steps_per_round: Callable[[ml_collections.ConfigDict], int] = lambda config: 0


DERIVED_MODEL_FIELDS = ('extra_vocab_rows', 'cluster_head', 'denoiser_layers')
PROCESS_RULES: dict[str, KindRules] = {
    'hmdlm': KindRules(),
    'mdlm': KindRules(levels='is HMDLM with one level'),
    'hdlm': KindRules(levels='puts its hierarchy on the vocabulary, not on positions',
                      derived=config_hdlm.derived_model_fields, check=config_hdlm.check_section),
    'multimdm': KindRules(levels='has no hierarchy levels', noise_ids=config_multimdm.noise_ids,
                          check=config_multimdm.check_section,
                          steps_per_round=config_multimdm.steps_per_round),
    'adlm': KindRules(levels='has no hierarchy levels (its anchors are a training target)',
                      derived=config_adlm.derived_model_fields, check=config_adlm.check_section),
    'mgdm': KindRules(levels='is MDLM with a reweighted loss', check=config_mgdm.check_section),
}
PROCESS_KINDS = tuple(PROCESS_RULES)


def _rules(config: ml_collections.ConfigDict) -> KindRules:
  kind = config.process.kind
  if kind not in PROCESS_RULES:
    raise ValueError(f'process.kind={kind!r} is not one of {PROCESS_KINDS}.')
  return PROCESS_RULES[kind]


def noise_ids(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The token ids of the process's noise states: (MASK,) or MultiMDM's M masks."""
  return tuple(int(i) for i in _rules(config).noise_ids(config))


def num_noise_rows(config: ml_collections.ConfigDict) -> int:
  """How many noise-state rows the process appends after the words: M (MultiMDM) or 1 (MASK)."""
  return len(noise_ids(config))


def appended_rows(config: ml_collections.ConfigDict) -> int:
  """How many rows the process appends after its noise rows (HDLM's cluster tokens), from its
  own section: a run's stored config.json reads the same."""
  return int(_rules(config).derived(config).get('extra_vocab_rows', 0))


def steps_per_round(config: ml_collections.ConfigDict) -> int:
  """Optimiser steps per round of the process's frozen target, or 0 for the EMA target (a
  MultiMDM distillation with process.multimdm.target='frozen_rounds'; docs/method.md §13.2)."""
  return int(_rules(config).steps_per_round(config))


def derive_model_fields(config: ml_collections.ConfigDict) -> None:
  """Sets the model fields the process derives (in place); a user-set mismatch is an error."""
  values = _rules(config).derived(config)
  for name in DERIVED_MODEL_FIELDS:
    value, given = int(values.get(name, 0)), config.model[name]
    if not is_int(given) or given not in (0, value):
      raise ValueError(f'model.{name}={given!r} is derived from the process ({value} here); '
                       'leave it at 0.')
    config.model[name] = value


def check_process(config: ml_collections.ConfigDict) -> None:
  """Validates process.kind, its levels and its own section (ValueError naming the field)."""
  rules = _rules(config)
  if rules.levels and config.model.num_levels != 1:
    raise ValueError(f'process.kind={config.process.kind!r} {rules.levels}: set '
                     f'model.num_levels=1 (got {config.model.num_levels}).')
  rules.check(config)
