"""Validation of the hierarchy pathway's `model` fields (docs/method.md §4.7).

`check_pathway(values)` reads the raw `model` section values (a dict of field -> value, as
config.ModelConfig.from_section collects them) and raises one ValueError naming the field and
what to set. Kept apart from config.py, which holds every other section's checks.
"""

from __future__ import annotations

from typing import Any

from hmdlm_jax.config.checks import check_int

HIER_READOUTS = ('head', 'rounds')
HIER_SOURCES = ('features', 'input')


def check_pathway(values: dict[str, Any]) -> None:
  """Raises ValueError for an invalid or inconsistent hierarchy-pathway setting."""
  check_int('model.hier_layers', values['hier_layers'], minimum=0)
  check_int('model.hier_repeats', values['hier_repeats'], minimum=1)
  check_int('model.hier_width', values['hier_width'], minimum=0)
  check_int('model.hier_num_heads', values['hier_num_heads'], minimum=0)
  width = values['hier_width'] or values['hidden_size']
  heads = values['hier_num_heads'] or values['num_heads']
  own = values['hier_width'] or values['hier_num_heads']  # else the trunk's, checked with it
  if own and width % heads:
    raise ValueError(f"model.hier_width={values['hier_width']} (0 = hidden_size = "
                     f"{values['hidden_size']}) must be divisible by the pathway's heads, "
                     f"model.hier_num_heads={values['hier_num_heads']} (0 = num_heads = "
                     f"{values['num_heads']}).")
  if own and values['position_embedding'] == 'rotary' and (width // heads) % 2:
    raise ValueError(f'model.hier_num_heads={heads}: rotary embeddings need an even head '
                     f'dimension in the hierarchy pathway (width {width} / {heads} heads).')
  if values['hier_repeats'] > 1 and values['hier_layers'] == 0:
    raise ValueError(f"model.hier_repeats={values['hier_repeats']} repeats the hierarchy trunk, "
                     'which has no blocks: set model.hier_layers >= 1 (or hier_repeats=1).')
  if values['hier_readout'] not in HIER_READOUTS:
    raise ValueError(f"model.hier_readout={values['hier_readout']!r} is not one of "
                     f'{HIER_READOUTS}.')
  if values['hier_readout'] == 'rounds' and values['num_levels'] > 1 and (
      values['hier_layers'] == 0 or values['hier_repeats'] != values['num_levels'] - 1):
    raise ValueError("model.hier_readout='rounds' reads one hazard per round: it needs "
                     'model.hier_layers >= 1 and model.hier_repeats = model.num_levels - 1 = '
                     f"{values['num_levels'] - 1} (got {values['hier_layers']}, "
                     f"{values['hier_repeats']}).")
  if values['hier_source'] not in HIER_SOURCES:
    raise ValueError(f"model.hier_source={values['hier_source']!r} is not one of "
                     f'{HIER_SOURCES}.')
  if values['hier_round_tokens'] and (values['hier_readout'] != 'rounds'
                                      or values['num_levels'] == 1):
    raise ValueError('loss.beta_rounds > 0 (model.hier_round_tokens) reads the token of each '
                     "round: it needs model.hier_readout='rounds' and model.num_levels > 1 "
                     f"(got {values['hier_readout']!r}, {values['num_levels']}).")
