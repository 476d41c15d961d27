"""Evaluation batches: contract checks, padding rows marked invalid, fixed shapes, rebatching.

Evaluators compile one program per batch shape, so every batch they run has the first batch's row
count: a shorter batch is padded by repeating its first row (finite values everywhere) and the
padded rows are marked invalid, never counted. A pipeline marks its own padding rows with a
per-row validity field (`VALID_FIELDS`, data/pipeline.py).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

import numpy as np

from hmdlm_jax.processes import base as process_base

Batch = Mapping[str, np.ndarray]
# Per-row validity of a padded eval batch ([B], > 0 = real row), checked in this order.
VALID_FIELDS = ('weight', 'valid')


def row_validity(batch: Batch, where: str = 'batch') -> np.ndarray:
  """bool [B]: the batch's per-row validity field if present, else all True."""
  b = np.asarray(batch['tokens']).shape[0]
  for name in VALID_FIELDS:
    if name in batch:
      v = np.asarray(batch[name]) > 0
      if v.shape != (b,):
        raise ValueError(f'{where}: field {name!r} must have shape [B]=({b},), got {v.shape}')
      return v
  return np.ones((b,), bool)


def check_batch(batch: Batch, where: str) -> None:
  """ValueError naming `where` unless the batch holds the contract fields, all [B, L]."""
  for name in process_base.BATCH_KEYS:
    if name not in batch:
      raise ValueError(f'{where}: batch has no field {name!r} (fields: {sorted(batch)}); the '
                       'pipeline must provide tokens, levels, given, loss_mask (design.md)')
  shape = np.asarray(batch['tokens']).shape
  if len(shape) != 2:
    raise ValueError(f'{where}: tokens must be [B, L], got shape {shape}')
  for name in process_base.BATCH_KEYS[1:]:
    if np.asarray(batch[name]).shape != shape:
      raise ValueError(f'{where}: {name} has shape {np.asarray(batch[name]).shape}, tokens {shape}')


def _pad(core: dict[str, np.ndarray], valid: np.ndarray, pad: int
         ) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """`pad` copies of the first row appended, marked invalid."""
  core = {k: np.concatenate([v, np.repeat(v[:1], pad, axis=0)]) for k, v in core.items()}
  return core, np.concatenate([valid, np.zeros((pad,), bool)])


def fixed_batches(batches: Iterable[Batch], *, max_examples: int | None = None,
                  what: str = 'batches') -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """Yields (contract fields with the first batch's row count, valid bool [B]).

  Rows beyond the first `max_examples` valid ones are marked invalid; batches without a valid row
  are skipped, and iteration stops once `max_examples` rows were yielded.
  """
  size = None
  seen = 0
  for j, batch in enumerate(batches):
    if max_examples is not None and seen >= max_examples:
      return
    check_batch(batch, f'{what}[{j}]')
    valid = row_validity(batch, f'{what}[{j}]')
    core = {k: np.asarray(batch[k]) for k in process_base.BATCH_KEYS}
    b = core['tokens'].shape[0]
    if size is None:
      size = b
    if b > size:
      raise ValueError(f'{what}[{j}] has {b} rows, more than the first batch ({size}); batches '
                       'must not grow (pad the last one, or use a fixed eval_batch_size)')
    if b < size:
      core, valid = _pad(core, valid, size - b)
    if max_examples is not None:
      valid = valid & (np.cumsum(valid) <= max_examples - seen)
    seen += int(valid.sum())
    if valid.any():
      yield core, valid


def rebatch(batches: Iterable[Batch], size: int
            ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """The valid rows of `batches` regrouped into batches of exactly `size` rows (last padded)."""
  buf: dict[str, list[np.ndarray]] = {}
  count = 0
  for j, batch in enumerate(batches):
    check_batch(batch, f'prompts[{j}]')
    valid = row_validity(batch, f'prompts[{j}]')
    for k in process_base.BATCH_KEYS:
      buf.setdefault(k, []).append(np.asarray(batch[k])[valid])
    count += int(valid.sum())
    while count >= size:
      core = {k: np.concatenate(v) for k, v in buf.items()}
      yield {k: v[:size] for k, v in core.items()}, np.ones(size, bool)
      buf = {k: [v[size:]] for k, v in core.items()}
      count -= size
  if count:
    core = {k: np.concatenate(v) for k, v in buf.items()}
    yield _pad(core, np.ones(count, bool), size - count)
