"""Warm starts across processes: MDLM -> MultiMDM (continual adaptation), MultiMDM -> distillation.

MultiMDM's Section 3.2 keeps the backbone and the clean-token head and copies the single MASK
embedding into every mask row, so all masks start identical and (3.5) teaches the model to tell
them apart; Algorithm 3 starts distillation (online AND EMA network) from a model pretrained by
Algorithm 1. This module is the one place that initialises parameters from elsewhere
(train.create_train_state and preflight call `apply` / `check` whenever an `init` source is set):
* `init.workdir = DIR`: DIR's latest checkpoint (EMA parameters with `init.use_ema`), its process
  and vocabulary layout read from DIR/config.json; no TrainState of that run is rebuilt;
* `init.mdlm_checkpoint = FILE`: a converted MDLM checkpoint, its rows remapped for MultiMDM /
  HDLM (`init.mdlm_mask_id` names its MASK row; HDLM's cluster rows: the mean of their words'),
  or merged by `convert_mdlm.init_from_mdlm` for one noise row (MDLM, HMDLM, HDLM n = 1). The
  mapping (`adapt`), EMA and optimiser state: docs/method.md §13.2 ("Continual adaptation");
* `init.embedding`: the input table only (§13.1); `init.adlm_checkpoint`: all of ADLM's (§13.4).
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from typing import Any, Mapping

import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from hmdlm_jax import config as config_lib
from hmdlm_jax import convert_adlm
from hmdlm_jax import convert_mdlm
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import storage

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the noise rows of a vocabulary are: vocab_size rows, mask_rows the noise-state ids."""
  vocab_size: int
  mask_rows: tuple[int, ...]


def layout_of(config: config_lib.Config) -> Layout:
  """The vocabulary layout of a resolved experiment config: its noise rows (MultiMDM: its M
  masks; else MASK), then the rows the process appends (HDLM: its cluster rows)."""
  vocab, noise = int(config.model.vocab_size), tuple(config_lib.noise_ids(config))
  rows = config_lib.appended_rows(config)
  return Layout(vocab, noise + tuple(range(vocab - rows, vocab)))


def requested(config: config_lib.Config) -> bool:
  """Whether the config initialises from elsewhere (`init.workdir`, `init.mdlm_checkpoint`,
  `init.adlm_checkpoint` or `init.embedding`)."""
  ini = config.init
  return any(bool(x) for x in (ini.workdir, ini.mdlm_checkpoint, ini.adlm_checkpoint,
                               ini.embedding))


def maps_rows(config: config_lib.Config) -> bool:
  """Whether the source's vocabulary rows are mapped leaf by leaf (`adapt`): a run directory, or
  an MDLM file into a table with several noise rows (MultiMDM's masks: the MASK row is copied into
  each). One noise row is MDLM's own layout: `convert_mdlm.init_from_mdlm` merges it."""
  return bool(config.init.workdir) or (bool(config.init.mdlm_checkpoint)
                                       and len(layout_of(config).mask_rows) > 1)


def appended_rows_from_members(config: config_lib.Config, params: PyTree, source: PyTree,
                               vocab_axes: Mapping[str, int | None]) -> PyTree:
  """From a one-MASK source: each row the process appends (HDLM's cluster rows) of every
  vocabulary leaf becomes the mean of its member words' source rows, as the process says
  (`Process.appended_row_members`; HDLM: docs/method.md §13.1)."""
  first, member = processes.build(config, check_sampling=False).appended_row_members()
  flat_p, flat_s = _flat(params), _flat(source)
  for k, axis in vocab_axes.items():
    if axis is None or k not in flat_p:
      continue
    s = np.moveaxis(np.asarray(flat_s[k], np.float64), axis, 0)  # [V_src, ...]
    means = np.tensordot(member[:, :s.shape[0]], s, axes=1)  # [n, ...]
    v = np.moveaxis(np.array(flat_p[k]), axis, 0)
    v[first:first + member.shape[0]] = means
    flat_p[k] = np.moveaxis(v, 0, axis)
  return convert_mdlm.unflatten(flat_p)


# ------------------------------------------------------------------------------------ sources


def _source_dirs(workdir: str) -> tuple[config_lib.Config, str, int]:
  """(DIR's config, its latest checkpoint's state folder, that step); ValueError if unusable."""
  path = storage.join(workdir, 'config.json')
  try:
    source = config_lib.from_record(json.loads(storage.read_text(path)))
  except (OSError, ValueError) as e:
    raise ValueError(f'init.workdir={workdir!r}: cannot read {path} ({e}).') from e
  ckpt_dir = storage.join(storage.absolute(workdir), 'checkpoints')
  # Finished steps only: on an object store a step being written has its final name already (Orbax
  # marks it finished with commit_success.txt); locally it is still a *.orbax-checkpoint-tmp-*.
  steps = sorted(int(d) for d in (storage.listdir(ckpt_dir) if storage.isdir(ckpt_dir) else [])
                 if d.isdigit() and ocp.path.step.is_checkpoint_finalized(
                     storage.as_path(storage.join(ckpt_dir, d))))
  if not steps:
    raise ValueError(f'init.workdir={workdir!r} holds no finished checkpoint in {ckpt_dir}; '
                     'train there first.')
  return source, storage.join(ckpt_dir, str(steps[-1]), 'state'), steps[-1]


def read_workdir(workdir: str, *, use_ema: bool = True) -> tuple[PyTree, Layout, int]:
  """(parameters as numpy, vocabulary layout, step) of DIR's latest checkpoint."""
  source, state_dir, step = _source_dirs(workdir)
  try:
    with ocp.StandardCheckpointer() as ckptr:
      state = ckptr.restore(state_dir)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'init.workdir={workdir!r}: checkpoint {state_dir} is unreadable '
                     f'({type(e).__name__}: {e}).') from e
  name = 'ema_params' if use_ema else 'params'
  params = jax.tree.map(np.asarray, state[name])
  return params, layout_of(source), step


def workdir_shapes(workdir: str, *, use_ema: bool = True) -> tuple[dict[str, tuple[int, ...]],
                                                                    Layout]:
  """('/'-joined leaf -> shape, layout) of DIR's latest parameters, from the Orbax metadata."""
  source, state_dir, _ = _source_dirs(workdir)
  try:
    with ocp.StandardCheckpointer() as ckptr:
      meta = ckptr.metadata(state_dir)
    tree = getattr(meta, 'item_metadata', meta)['ema_params' if use_ema else 'params']
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'init.workdir={workdir!r}: checkpoint {state_dir} is unreadable '
                     f'({type(e).__name__}: {e}).') from e
  return _shapes(tree), layout_of(source)


def read_mdlm_file(path: str, mask_id: int) -> tuple[PyTree, Layout]:
  """(parameters, layout) of a converted MDLM checkpoint (.npz) or an MDLM file."""
  try:
    params = convert_mdlm.load_pretrained(path)
  except ValueError as e:
    raise ValueError(f'init.mdlm_checkpoint: {e}') from e
  embed = params.get('vocab_embed', {}).get('embedding')
  if embed is None:
    raise ValueError(f'init.mdlm_checkpoint={path!r} has no vocab_embed/embedding.')
  vocab = int(embed.shape[0])
  row = vocab - 1 if mask_id < 0 else mask_id
  if not 0 <= row < vocab:
    raise ValueError(f'init.mdlm_mask_id={mask_id} is outside the checkpoint\'s {vocab} rows.')
  return params, Layout(vocab, (row,))


# ------------------------------------------------------------------------ the embedding only

# The table's name in a converted MDLM checkpoint (convert_mdlm) and data/clusters.py's default.
EMBEDDING_KEY = 'vocab_embed/embedding'


def read_embedding(path: str) -> np.ndarray:
  """The table [N, D] of an `init.embedding` .npz: its EMBEDDING_KEY array, else its only one."""
  try:
    with storage.open_file(path, 'rb') as f, np.load(f, allow_pickle=False) as z:
      names = list(z.files)
      key = EMBEDDING_KEY if EMBEDDING_KEY in names else names[0] if len(names) == 1 else ''
      table = np.asarray(z[key]) if key else None
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f'init.embedding={path!r} is not a readable .npz ({type(e).__name__}: '
                     f'{e}).') from e
  if table is None:
    raise ValueError(f'init.embedding={path!r} holds no {EMBEDDING_KEY!r} array but '
                     f'{len(names)} others ({sorted(names)[:6]}); save the table alone or under '
                     'that name.')
  if table.ndim != 2 or not np.issubdtype(table.dtype, np.floating):
    raise ValueError(f'init.embedding={path!r}: array {key!r} is {table.dtype} {table.shape}, '
                     'not a float table [rows, model.hidden_size].')
  return table


def embedding_words(config: config_lib.Config, table: tuple[int, ...],
                    token_table: tuple[int, ...]) -> np.ndarray:
  """The word ids [W] (every row but the noise rows) of the model's token table [V, H], after
  checking that an `init.embedding` table of shape [N, D] fits it: D = H, N >= the largest word
  id + 1 (rows beyond are ignored). No projection: another width is an error."""
  path = config.init.embedding
  words = np.setdiff1d(np.arange(token_table[0]), layout_of(config).mask_rows)
  if table[1] != token_table[1]:
    raise ValueError(f'init.embedding={path!r}: the table has dimension {table[1]} but '
                     f'model.hidden_size={token_table[1]}; use a table of the model\'s width (it '
                     'is not projected) or set model.hidden_size to it.')
  if table[0] < int(words.max()) + 1:
    raise ValueError(f'init.embedding={path!r}: the table has {table[0]} rows but the word '
                     f'ids go up to {int(words.max())} (model.vocab_size={token_table[0]}); a '
                     'table of another tokenizer?')
  return words


def embedding_params(config: config_lib.Config, fresh: PyTree, model: nn.Module
                     ) -> tuple[PyTree, str]:
  """`fresh` (numpy) with its input token table (`model.token_embed_name`; with tied embeddings
  also the output head) replaced: word rows from `init.embedding`, noise rows (MASK, MultiMDM's
  masks) zero, HDLM's cluster rows the mean of their member words' table rows (the k-means
  centroids when the clusters were computed on this table). Every other leaf is `fresh`'s."""
  table = read_embedding(config.init.embedding)
  key = f'{type(model).token_embed_name}/embedding'
  flat = _flat(fresh)
  emb = np.array(flat[key])
  words = embedding_words(config, table.shape, emb.shape)
  emb[list(layout_of(config).mask_rows)] = 0.0
  emb[words] = table[words]
  flat[key] = emb
  params = convert_mdlm.unflatten(flat)
  what = f'{config.init.embedding} (input embedding: {len(words)} word rows'
  if config_lib.appended_rows(config):
    source = convert_mdlm.unflatten({key: table[:emb.shape[0]]})
    params = appended_rows_from_members(config, params, source, {key: 0})
    what += ', cluster rows at their words\' mean'
  return params, what + ')'


# ---------------------------------------------------------------------------------- mapping


def _flat(tree: Mapping[str, Any]) -> dict[str, Any]:
  return convert_mdlm.flatten(tree)


def row_map(src: Layout, dst: Layout) -> np.ndarray:
  """For each destination row, the source row it is copied from: int [dst.vocab_size]."""
  out = np.arange(dst.vocab_size)
  for i, row in enumerate(dst.mask_rows):
    out[row] = src.mask_rows[i % len(src.mask_rows)]
  words = np.setdiff1d(np.arange(dst.vocab_size), dst.mask_rows)
  if words.size and words.max() >= src.vocab_size:
    raise ValueError(f'the destination has word ids up to {words.max()} but the source '
                     f'vocabulary has {src.vocab_size} rows; the tokenizers differ.')
  return out


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """'/'-joined leaf path -> shape of any tree of arrays / ShapeDtypeStructs / array metadata."""
  return {'/'.join(str(getattr(p, 'key', p)) for p in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(
              tree, is_leaf=lambda x: hasattr(x, 'shape'))[0]}


def check_fit(fresh: Mapping[str, tuple[int, ...]], source: Mapping[str, tuple[int, ...]],
              vocab_axes: Mapping[str, int | None], src: Layout, dst: Layout) -> list[str]:
  """Raises ValueError unless the source leaves fit the destination's (leaf -> shape, both);
  returns the source leaves the destination lacks (dropped)."""
  row_map(src, dst)
  missing = sorted(k for k in fresh if k not in source)
  if missing:
    raise ValueError(f'the destination model has parameters the source lacks: {missing[:6]} '
                     '(is config.model the architecture of the source run?).')
  for k, shape in fresh.items():
    s = tuple(source[k])
    axis = vocab_axes.get(k)
    if axis is not None:
      if s[axis] != src.vocab_size:
        raise ValueError(f'{k}: the source has {s[axis]} vocabulary rows, expected '
                         f'{src.vocab_size}.')
      s = s[:axis] + (dst.vocab_size,) + s[axis + 1:]
    if s != tuple(shape):
      raise ValueError(f'{k}: source shape {s} != destination shape {tuple(shape)} (check '
                       'config.model.hidden_size / num_heads / mlp_dim / seq_len).')
  return sorted(k for k in source if k not in fresh)


def adapt(fresh: PyTree, source: PyTree, vocab_axes: Mapping[str, int | None], src: Layout,
          dst: Layout) -> tuple[PyTree, list[str]]:
  """`fresh` with every leaf taken from `source`: (new tree, dropped leaves).

  The leaves with a 'vocab' logical axis are the token embedding and the token head
  (`models.logical_specs` says which axis): a destination row that is a word takes the source row
  of the same id; the destination's mask rows take the source's mask rows in turn (one MDLM MASK
  row -> copied into all M rows; a MultiMDM source of the same M -> row for row). Every other leaf
  must exist in the source with the same shape and is copied. Source leaves the destination lacks
  (an HMDLM source's level table and hierarchy head) are dropped, and the caller logs them.

  Args:
    fresh: the destination model's parameters (numpy), which fix every shape.
    source: the source parameters.
    vocab_axes: leaf path ('a/b/c') -> its 'vocab' axis in the destination, or None.
    src, dst: the two vocabulary layouts.
  """
  flat_f, flat_s = _flat(fresh), _flat(source)
  dropped = check_fit({k: v.shape for k, v in flat_f.items()},
                      {k: np.shape(v) for k, v in flat_s.items()}, vocab_axes, src, dst)
  rows = row_map(src, dst)
  out = {}
  for k, v in flat_f.items():
    s = np.asarray(flat_s[k])
    axis = vocab_axes.get(k)
    if axis is not None:
      s = np.take(s, rows, axis=axis)
    out[k] = s.astype(v.dtype)
  return convert_mdlm.unflatten(out), dropped


def vocab_axes_of(model: nn.Module, seq_len: int) -> dict[str, int | None]:
  """Leaf path -> index of its 'vocab' logical axis (None if it has none)."""
  specs = models.logical_specs(model, seq_len)
  out = {}
  for path, spec in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]:
    key = '/'.join(str(getattr(p, 'key', p)) for p in path)
    axes = tuple(spec)
    out[key] = axes.index('vocab') if 'vocab' in axes else None
  return out


# ---------------------------------------------------------------------------------- entry point


def check(config: config_lib.Config, model: nn.Module) -> None:
  """What `load` would raise, before anything is initialised (preflight): the source is readable
  and fits `model`, the run's network (shapes only: Orbax metadata /
  `convert_mdlm.pretrained_shapes`)."""
  ini = config.init
  seq_len = int(config.model.seq_len)
  fresh = _shapes(models.abstract_params(model, seq_len))
  if ini.embedding:
    embedding_words(config, read_embedding(ini.embedding).shape,
                    fresh[f'{type(model).token_embed_name}/embedding'])
    return
  if ini.adlm_checkpoint:  # the whole ADLM network, no leaf fresh
    try:
      convert_mdlm.check_shapes(fresh, convert_mdlm.pretrained_shapes(ini.adlm_checkpoint), ())
    except ValueError as e:
      raise ValueError(f'init.adlm_checkpoint={ini.adlm_checkpoint!r}: {e}') from None
    return
  if not maps_rows(config):  # MDLM's own layout
    try:
      convert_mdlm.check_shapes(fresh, convert_mdlm.pretrained_shapes(ini.mdlm_checkpoint))
    except ValueError as e:
      raise ValueError(f'init.mdlm_checkpoint={ini.mdlm_checkpoint!r}: {e}') from None
    return
  if ini.workdir:
    shapes, src = workdir_shapes(ini.workdir, use_ema=bool(ini.use_ema))
    what = f'init.workdir={ini.workdir!r}'
  else:
    what = f'init.mdlm_checkpoint={ini.mdlm_checkpoint!r}'
    try:
      shapes = convert_mdlm.pretrained_shapes(ini.mdlm_checkpoint)
    except ValueError as e:
      raise ValueError(f'{what}: {e}') from None
    vocab = shapes.get('vocab_embed/embedding', (0,))[0]
    row = vocab - 1 if ini.mdlm_mask_id < 0 else int(ini.mdlm_mask_id)
    if not 0 <= row < vocab:
      raise ValueError(f"init.mdlm_mask_id={ini.mdlm_mask_id} is outside the checkpoint's "
                       f'{vocab} rows.')
    src = Layout(vocab, (row,))
  try:
    check_fit(fresh, shapes, vocab_axes_of(model, seq_len), src, layout_of(config))
  except ValueError as e:
    raise ValueError(f'{what}: {e}') from None


def load(config: config_lib.Config, fresh: PyTree, model: nn.Module
         ) -> tuple[PyTree, str]:
  """The warm-start parameters (numpy) for `fresh`'s shapes (parameters of `model`), and a
  description of the source."""
  dst = layout_of(config)
  ini = config.init
  if ini.embedding:
    return embedding_params(config, fresh, model)
  if ini.adlm_checkpoint:
    try:
      return convert_adlm.init_from_adlm(fresh, ini.adlm_checkpoint), ini.adlm_checkpoint
    except ValueError as e:
      raise ValueError(f'init.adlm_checkpoint={ini.adlm_checkpoint!r}: {e}') from None
  if not maps_rows(config):  # MDLM's own layout: backbone and token head, hierarchy kept fresh
    try:
      return convert_mdlm.init_from_mdlm(fresh, ini.mdlm_checkpoint), ini.mdlm_checkpoint
    except ValueError as e:
      raise ValueError(f'init.mdlm_checkpoint: {e}') from e
  if ini.workdir:
    source, src, step = read_workdir(ini.workdir, use_ema=bool(ini.use_ema))
    what = f'{ini.workdir} (step {step}, {"EMA" if ini.use_ema else "raw"} parameters)'
  else:
    source, src = read_mdlm_file(ini.mdlm_checkpoint, int(ini.mdlm_mask_id))
    what = f'{ini.mdlm_checkpoint} (MASK row {src.mask_rows[0]})'
  axes = vocab_axes_of(model, int(config.model.seq_len))
  params, dropped = adapt(fresh, source, axes, src, dst)
  if len(src.mask_rows) == 1 and config_lib.appended_rows(config):
    params = appended_rows_from_members(config, params, source, axes)
  if dropped:
    more = f' and {len(dropped) - 4} more' if len(dropped) > 4 else ''  # a log line stays short
    logging.info('Warm start: %d source parameters not in this model, dropped: %s%s',
                 len(dropped), ', '.join(dropped[:4]), more)
  return params, what


def apply(config: config_lib.Config, state: Any, shardings: Any, model: nn.Module
          ) -> Any:
  """`state` (a TrainState of `model`) with params and EMA replaced by the warm start, in their
  shardings.

  Every process reads the source and places its own shards.
  """
  fresh = multihost_utils.process_allgather(state.params, tiled=True)
  params, what = load(config, jax.tree.map(np.asarray, fresh), model)

  def place(x: np.ndarray, s: jax.sharding.Sharding) -> jax.Array:
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

  params = jax.tree.map(place, params, shardings.params)
  logging.info('Warm start from %s.', what)
  return state.replace(params=params, ema_params=jax.tree.map(jnp.copy, params))
