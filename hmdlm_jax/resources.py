"""Memory and disk a run needs, against what the devices and the host have (preflight.check).

Memory, per device: the train state's bytes exactly (its abstract leaves under the mesh's
shardings), plus for a train step the gradient (the parameters' bytes), the batch, and what the
backward pass keeps at the least: every trunk layer's input [b, L, H] and, when the loss reads
them, the dense token logits [b, L, V], both float32 (b: one device's micro-batch rows; the larger
of the loss's differentiated network calls). Even `model.remat='block'` keeps these, so this is a
lower bound: a refusal never stops a run that would fit. It is compared with the device's `bytes_limit`, or on
a CPU host with MemAvailable shared by its devices. Disk: one checkpoint (about the state's bytes)
must fit in a local workdir's free space; a URL (gs://) is not checked.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import sharding as shd
from hmdlm_jax import storage
from hmdlm_jax import train

F32 = 4  # bytes of the float32 activations and gradients
MeshLike = jax.sharding.Mesh | jax.sharding.AbstractMesh
BATCH_DTYPES = {'tokens': jnp.int32, 'levels': jnp.int32, 'given': jnp.bool_,
                'loss_mask': jnp.bool_}  # the train step's batch (train.make_train_step)


def _leaves(tree: Any) -> list[Any]:
  return jax.tree_util.tree_leaves(tree)


def state_bytes(abstract: Any) -> int:
  """Bytes of an abstract tree (ShapeDtypeStructs) in all: about one checkpoint's size."""
  return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in _leaves(abstract))


def device_bytes(abstract: Any) -> int:
  """Bytes of an abstract tree on one device: every leaf's shard under its attached sharding."""
  def shard(a: Any) -> int:
    shape = a.sharding.shard_shape(a.shape) if a.sharding is not None else a.shape
    return math.prod(shape) * np.dtype(a.dtype).itemsize
  return sum(shard(a) for a in _leaves(abstract))


def _fmt(n: float) -> str:
  """Bytes for a person: '123 B', '4.5 MiB', ..."""
  if n < 1024:
    return f'{int(n)} B'
  unit = 'B'
  for unit in ('KiB', 'MiB', 'GiB', 'TiB', 'PiB'):
    n /= 1024
    if n < 1024:
      break
  return f'{n:.1f} {unit}'


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """The lower bound of one device's memory as a function of the batch rows.

  fixed: bytes whatever the batch (state + gradient); row_batch: bytes of one batch row (on the
  device that holds it); row_act: activation bytes of one micro-batch row; shards: devices the
  batch is split over; accum: micro-batches per step (1 for evaluation).
  """
  fixed: int
  row_batch: int
  row_act: int
  shards: int
  accum: int

  def bytes(self, batch_size: int) -> int:
    rows = -(-batch_size // self.shards)
    micro_rows = -(-batch_size // (self.accum * self.shards))
    return self.fixed + rows * self.row_batch + micro_rows * self.row_act

  def largest(self, limit: int, multiple: int) -> int:
    """The largest multiple of `multiple` whose bytes are <= `limit` (0: none)."""
    lo, hi = 0, 1
    while self.bytes(hi * multiple) <= limit:
      lo, hi = hi, hi * 2
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if self.bytes(mid * multiple) <= limit else (lo, mid)
    return lo * multiple


def abstract_state(config: config_lib.Config, model: nn.Module
                   ) -> tuple[Any, jax.sharding.AbstractMesh]:
  """(the train state with its shardings, the mesh) over an abstract mesh of the config's shape:
  no device is touched."""
  shape = shd.resolve_mesh_shape(config.mesh, jax.device_count())
  mesh = jax.sharding.AbstractMesh(shape, shd.MESH_AXES,
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
  return train.state_shardings(config, model, mesh)[0], mesh


def _loss_calls(config: config_lib.Config, model: nn.Module, abstract_params: Any,
                num_devices: int) -> list[tuple[str, ...]]:
  """The heads of each network call the training loss differentiates (traced at one row)."""
  process = processes.build(config).for_devices(num_devices)
  seq_len = int(config.model.seq_len)
  calls: list[tuple[str, ...]] = []

  def loss(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> Any:
    apply_fn = models.make_apply_fn(model, params, train=True, rng=key)

    def recorded(*args: Any, heads: tuple[str, ...], **kw: Any) -> Any:
      calls.append(tuple(heads))
      return apply_fn(*args, heads=heads, **kw)
    target = models.make_apply_fn(model, params, train=False) if process.uses_target else None
    return process.loss(recorded, batch, key, step=jnp.zeros((), jnp.int32),
                        target_apply_fn=target)

  dtypes = {**BATCH_DTYPES, **process.extra_batch_keys}
  batch = {k: jax.ShapeDtypeStruct((1, seq_len), d) for k, d in dtypes.items()}
  jax.eval_shape(loss, abstract_params, batch, jax.ShapeDtypeStruct((2,), jnp.uint32))
  return calls


def train_memory(config: config_lib.Config, model: nn.Module, abstract: Any,
                 mesh: MeshLike) -> StepMemory:
  """The train step's StepMemory; `abstract`: the state with shardings (train.state_shardings)."""
  m = config.model
  seq_len, hidden, vocab = int(m.seq_len), int(m.hidden_size), int(m.vocab_size)
  calls = _loss_calls(config, model, jax.tree.map(lambda a: jax.ShapeDtypeStruct(
      a.shape, a.dtype), abstract.params), mesh.size)
  per_call = [int(m.num_layers) * hidden + (vocab if 'token' in heads else 0) for heads in calls]
  row_batch = seq_len * sum(np.dtype(d).itemsize for d in BATCH_DTYPES.values())
  return StepMemory(fixed=device_bytes(abstract) + device_bytes(abstract.params),
                    row_batch=row_batch, row_act=F32 * seq_len * max(per_call, default=hidden),
                    shards=shd.num_batch_shards(mesh), accum=int(config.train.grad_accum))


def eval_memory(config: config_lib.Config, abstract: Any, mesh: MeshLike) -> StepMemory:
  """An evaluation / sampling call's StepMemory: the restored state and one forward pass's final
  hidden state and dense token logits (float32)."""
  m = config.model
  return StepMemory(fixed=device_bytes(abstract), row_batch=0,
                    row_act=F32 * int(m.seq_len) * (int(m.hidden_size) + int(m.vocab_size)),
                    shards=shd.num_batch_shards(mesh), accum=1)


def _host_available() -> int:
  """MemAvailable of /proc/meminfo (bytes), else the free physical pages."""
  try:
    with open('/proc/meminfo', 'rb') as f:  # bytes: no codec lookup (a forked child may lack it)
      for line in f:
        if line.startswith(b'MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')


def available(devices: list[jax.Device] | None = None) -> tuple[int, str]:
  """(bytes one device may use, where that figure comes from)."""
  devices = devices or jax.local_devices()
  stats = [d.memory_stats() or {} for d in devices]
  if all('bytes_limit' in s for s in stats):
    return min(int(s['bytes_limit']) for s in stats), f'each {devices[0].platform} device'
  # CPU devices share the host's memory.
  n = len(devices)
  return _host_available() // n, 'the host' + (f' (MemAvailable / {n} devices)' * (n > 1))


def check_train(config: config_lib.Config, model: nn.Module, abstract: Any,
                mesh: MeshLike,
                limit: tuple[int, str] | None = None) -> None:
  """ValueError when even the lower bound of a train step exceeds the memory available, naming
  data.batch_size and the largest value that fits."""
  mem = train_memory(config, model, abstract, mesh)
  limit_bytes, where = limit or available()
  b = int(config.data.batch_size)
  need = mem.bytes(b)
  if need <= limit_bytes:
    return
  multiple = mem.accum * math.lcm(mem.shards, jax.process_count())
  best = mem.largest(limit_bytes, multiple)
  head = (f'data.batch_size={b} needs at least {_fmt(need)} per device (state and gradient '
          f'{_fmt(mem.fixed)}, the rest batch and activations); {where} has {_fmt(limit_bytes)}')
  if best:
    raise ValueError(f'{head}: use data.batch_size={best} or less (or raise train.grad_accum).')
  raise ValueError(f'{head}: the model alone does not fit; shrink model.* or shard it over more '
                   'devices (mesh.fsdp).')


def eval_rows(config: config_lib.Config, mode: str, num_inputs: int | None) -> int:
  """A lower bound of the rows of an evaluation / sampling batch: data.eval_batch_size (eval:
  the test split's batches are padded to it, data/pipeline.pad_for_eval, however few examples
  are evaluated), at most sample.num_samples and the inputs given (sample; an input file's count
  is not read here: 1)."""
  rows = int(config.data.eval_batch_size)
  if mode == 'eval':
    return rows
  rows = min(rows, int(config.sample.num_samples))
  return rows if num_inputs is None else min(rows, num_inputs)


def check_eval(config: config_lib.Config, abstract: Any, mesh: MeshLike, rows: int,
               limit: tuple[int, str] | None = None) -> None:
  """ValueError when even the lower bound of an evaluation / sampling batch of `rows` rows
  (`eval_rows`) exceeds the memory available, naming data.eval_batch_size."""
  mem = eval_memory(config, abstract, mesh)
  limit_bytes, where = limit or available()
  need = mem.bytes(rows)
  if need <= limit_bytes:
    return
  b = int(config.data.eval_batch_size)
  best = mem.largest(limit_bytes, 1)
  if best:
    raise ValueError(f'data.eval_batch_size={b} ({rows} rows) needs at least {_fmt(need)} per '
                     f'device (restored state {_fmt(mem.fixed)}); {where} has '
                     f'{_fmt(limit_bytes)}: use data.eval_batch_size={best} or less.')
  raise ValueError(f'the restored state ({_fmt(mem.fixed)} per device) does not fit the '
                   f'{_fmt(limit_bytes)} of {where}: evaluate on more devices (mesh.fsdp).')


def nearest_existing(path: str) -> str:
  """`path`, or its nearest ancestor that exists (where a new workdir would be created)."""
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def check_disk(workdir: str, abstract: Any,
               free: Callable[[str], int] = lambda p: shutil.disk_usage(p).free) -> None:
  """ValueError when one checkpoint (the state's bytes) does not fit in a local workdir's free
  space (a URL is not checked: a bucket reports none)."""
  if storage.is_url(workdir):
    return
  size = state_bytes(abstract)
  where = nearest_existing(workdir)
  have = free(where)
  if size > have:
    raise ValueError(f'--workdir={workdir!r} has {_fmt(have)} free (on {where!r}) but one '
                     f'checkpoint needs about {_fmt(size)}: free space there or choose a '
                     '--workdir on a larger disk.')
