"""Device mesh, parameter/batch shardings and multi-host start-up.

The mesh always has the three axes ('data', 'fsdp', 'tensor'):
- 'data'   : pure data parallelism (parameters replicated),
- 'fsdp'   : data parallelism whose parameters are also sharded (ZeRO-3 style) along the
             logical 'embed' axis,
- 'tensor' : model parallelism over 'mlp' / 'heads' / 'vocab' (per LOGICAL_RULES below).
The batch dimension is split over ('data', 'fsdp'). Model code never mentions the mesh: parameters
carry logical axis names (`nn.with_logical_partitioning`) and this module maps them to mesh axes
(LOGICAL_RULES); `mesh_context(mesh)` makes the models' activation constraints apply too.
The mesh uses `AxisType.Auto` (GSPMD propagation), not explicit-sharding mode.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from typing import Any, Iterator, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES: tuple[str, str, str] = ('data', 'fsdp', 'tensor')
BATCH_AXES: tuple[str, str] = ('data', 'fsdp')

# Logical axis name (the models' parameter and activation names) -> mesh axes. Flax assigns by
# priority and never reuses a mesh axis within one array, so for activations
# ('batch', 'length', 'embed') 'embed' stays unsharded when 'batch' already took 'fsdp'.
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ('batch', BATCH_AXES),
    ('length', None),
    ('embed', 'fsdp'),
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
    ('vocab', 'tensor'),
    ('kv', None),
    ('qkv', None),
    ('levels', None),
    ('clusters', None),
    ('cond', None),
    ('norm', None),
)


# ----------------------------------------------------------------------------- multi-host


def _slurm_multi_task() -> bool:
  return int(os.environ.get('SLURM_NTASKS', '1')) > 1 and 'SLURM_PROCID' in os.environ


def _tasks_on_node(spec: str, node: int) -> int:
  """This node's count in SLURM's tasks-per-node list, e.g. '4(x2),2' -> 4, 4, 2."""
  counts: list[int] = []
  for part in spec.split(','):
    m = re.fullmatch(r'\s*(\d+)(?:\(x(\d+)\))?\s*', part)
    if not m:
      raise ValueError(f'SLURM tasks per node {spec!r}: not a list like 4(x2),2')
    counts += [int(m[1])] * int(m[2] or 1)
  return counts[node] if 0 <= node < len(counts) else counts[-1]


def slurm_local_device_ids(environ: Mapping[str, str] | None = None) -> list[int] | None:
  """The GPUs a SLURM task drives, where JAX's SLURM auto-detection alone would get them wrong.

  JAX gives every task `local_device_ids=[SLURM_LOCALID]`: right for one task per GPU that sees
  all the node's GPUs (launch/slurm_gpu.sh). With fewer tasks than visible GPUs it would leave
  GPUs idle, and a task bound to its own GPU would ask for an id it cannot see. Returns an even
  share of the visible GPUs (CUDA_VISIBLE_DEVICES) per task, all of them when there are fewer than
  the node's tasks (bound), or None for JAX's own choice (not a SLURM task, JAX_LOCAL_DEVICE_IDS
  set, no CUDA_VISIBLE_DEVICES, one task per visible GPU).

  Raises:
    ValueError when this node's tasks do not share its visible GPUs evenly.
  """
  env = os.environ if environ is None else environ
  if ('SLURM_PROCID' not in env or 'SLURM_LOCALID' not in env or env.get('JAX_LOCAL_DEVICE_IDS')
      or not env.get('CUDA_VISIBLE_DEVICES', '').strip()):
    return None
  visible = len([d for d in env['CUDA_VISIBLE_DEVICES'].split(',') if d.strip()])
  spec = env.get('SLURM_STEP_TASKS_PER_NODE') or env.get('SLURM_TASKS_PER_NODE') or '1'
  tasks, local = _tasks_on_node(spec, int(env.get('SLURM_NODEID', '0'))), int(env['SLURM_LOCALID'])
  if visible == tasks:
    return None
  if visible < tasks:  # SLURM bound each task to its own GPUs (--gpus-per-task, --gpu-bind)
    return list(range(visible))
  if visible % tasks:
    raise ValueError(f'SLURM runs {tasks} tasks on this node, which sees {visible} GPUs '
                     f'(CUDA_VISIBLE_DEVICES={env["CUDA_VISIBLE_DEVICES"]}): they cannot share '
                     'them evenly; use --ntasks-per-node equal to --gpus-per-node (one task per '
                     'GPU, as launch/slurm_gpu.sh does).')
  share = visible // tasks
  return list(range(local * share, (local + 1) * share))


def _cluster_detected() -> bool:
  """Whether jax.distributed.initialize() without an address would find its cluster.

  Without one JAX fails with "coordinator_address should be defined", naming neither our config
  field nor the launchers; this asks JAX's own detectors, in JAX's order and with its opt-in rule,
  so every environment JAX accepts passes (a private module: when it moves, the check steps
  aside and JAX's own error remains).
  """
  if os.environ.get('JAX_COORDINATOR_ADDRESS'):
    return True
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top
    envs = list(clusters.ClusterEnv._cluster_types)  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return True
  return any(not env.opt_in_only_method and env.is_env_present() for env in envs)


def maybe_initialize_distributed(dist_cfg: Any) -> bool:
  """Calls `jax.distributed.initialize` when `distributed.enabled` (before any device use).

  With `coordinator_address` set, uses (coordinator_address, num_processes, process_id) from the
  config; with it empty, lets JAX auto-detect the cluster (Cloud TPU pod slices, SLURM, ...).

  Args:
    dist_cfg: the config's `distributed` section.
  Returns:
    True when this call initialised the distributed runtime, False otherwise.
  """
  if not bool(dist_cfg.enabled):
    if _slurm_multi_task():
      logging.warning('SLURM_NTASKS > 1 but distributed.enabled=False: every task trains alone. '
                      'Pass --config.distributed.enabled=True (launch/slurm_gpu.sh does).')
    return False
  if jax.distributed.is_initialized():
    return False
  address = str(dist_cfg.coordinator_address)
  if address:
    num_processes = int(dist_cfg.num_processes)
    process_id = int(dist_cfg.process_id)
    if num_processes < 1:
      raise ValueError(f'distributed.num_processes={num_processes} must be >= 1 when '
                       f'distributed.coordinator_address={address!r} is set.')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'distributed.process_id={process_id} must lie in [0, '
                       f'distributed.num_processes={num_processes}).')
    jax.distributed.initialize(coordinator_address=address, num_processes=num_processes,
                               process_id=process_id)
  else:
    if not _cluster_detected():
      raise ValueError(
          'distributed.enabled=True, but distributed.coordinator_address is empty and no cluster '
          'environment JAX can detect is present (SLURM, Open MPI, Cloud TPU pod, Kubernetes, '
          'JAX_COORDINATOR_ADDRESS). Start the command through launch/slurm_gpu.sh or '
          'launch/tpu_pod.sh, set distributed.coordinator_address / num_processes / process_id, '
          'or drop distributed.enabled to train on this host alone.')
    # Auto-detection (TPU pod metadata, SLURM environment, ...); under SLURM, the GPUs of
    # each task where JAX's one-GPU-per-task guess is wrong.
    ids = slurm_local_device_ids()
    if ids is not None:
      logging.info('SLURM task %s drives the GPUs %s of its node.', os.environ['SLURM_LOCALID'],
                   ids)
    jax.distributed.initialize(local_device_ids=ids)
  logging.info('jax.distributed initialised: process %d of %d, %d local / %d global devices.',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


# ----------------------------------------------------------------------------- mesh


def resolve_mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, int, int]:
  """Resolves the config's (data, fsdp, tensor) sizes; at most one may be -1 ('the rest').

  Raises:
    ValueError naming mesh.data / mesh.fsdp / mesh.tensor and the device count when the product
    does not equal the number of devices.
  """
  sizes = [int(getattr(mesh_cfg, a)) for a in MESH_AXES]
  desc = ', '.join(f'mesh.{a}={s}' for a, s in zip(MESH_AXES, sizes))
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'Mesh sizes must be positive or -1 (all remaining devices); got {desc}.')
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ValueError(f'At most one mesh axis may be -1; got {desc}.')
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(f'{desc}: the fixed axes multiply to {fixed}, which does not divide the '
                       f'{num_devices} available devices.')
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(f'{desc} multiply to {math.prod(sizes)} but there are {num_devices} devices '
                     f'(jax.device_count()); make mesh.data * mesh.fsdp * mesh.tensor equal '
                     f'{num_devices} or set one of them to -1.')
  return tuple(sizes)  # type: ignore[return-value]


def make_mesh(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the ('data', 'fsdp', 'tensor') mesh over `devices` (default: all global devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_cfg, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def num_batch_shards(mesh: Mesh) -> int:
  """How many ways the batch dimension is split (data * fsdp)."""
  return int(mesh.shape['data'] * mesh.shape['fsdp'])


# ----------------------------------------------------------------------------- shardings


@contextlib.contextmanager
def mesh_context(mesh: Mesh) -> Iterator[Mesh]:
  """`mesh` and LOGICAL_RULES set, so the models' activation constraints (`layers.constrain`)
  apply inside jitted code traced or run under it."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
    yield mesh


def _mesh_axes_size(mesh: Mesh, entry: Any) -> int:
  if entry is None:
    return 1
  names = entry if isinstance(entry, (tuple, list)) else (entry,)
  return int(math.prod(mesh.shape[n] for n in names))


def logical_to_sharding(logical_spec: P | None, shape: Sequence[int], mesh: Mesh,
                        rules: Sequence[tuple[str, Any]]) -> NamedSharding:
  """One array's NamedSharding from its logical PartitionSpec.

  A dimension whose size the mapped mesh axes do not divide stays replicated (e.g. a Sudoku
  vocabulary of 11 over tensor=2): jit outputs must be evenly divisible.
  """
  if logical_spec is None or len(logical_spec) == 0:
    return NamedSharding(mesh, P())
  mesh_spec = list(nn.logical_to_mesh_axes(tuple(logical_spec), rules))
  for i, entry in enumerate(mesh_spec):
    if entry is not None and i < len(shape) and shape[i] % _mesh_axes_size(mesh, entry):
      logging.info('Dimension %d (size %d, logical %r) not divisible by mesh axes %r: '
                   'replicated.', i, shape[i], logical_spec[i], entry)
      mesh_spec[i] = None
  return NamedSharding(mesh, P(*mesh_spec))


def param_shardings(logical_spec_tree: Any, abstract_params: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]] | None = None) -> Any:
  """NamedSharding tree for the parameters.

  Args:
    logical_spec_tree: PartitionSpec tree of logical axis names (`models.logical_specs`), same
      structure as the parameters; a None leaf (or empty spec) means replicated.
    abstract_params: ShapeDtypeStruct tree of the parameters (`models.abstract_params`).
    mesh: the device mesh.
    rules: logical rules; default LOGICAL_RULES.
  """
  rules = LOGICAL_RULES if rules is None else tuple(rules)
  specs = jax.tree.leaves(logical_spec_tree, is_leaf=lambda x: isinstance(x, P) or x is None)
  leaves, treedef = jax.tree.flatten(abstract_params)
  if len(specs) != len(leaves):
    raise ValueError(f'logical spec tree has {len(specs)} leaves but the parameter tree has '
                     f'{len(leaves)}; they must have the same structure.')
  return jax.tree.unflatten(
      treedef, [logical_to_sharding(s, x.shape, mesh, rules) for s, x in zip(specs, leaves)])


def shardings_like_params(abstract_tree: Any, param_shardings: Any, abstract_params: Any,
                          mesh: Mesh) -> Any:
  """Shardings for a tree that embeds copies of the parameter tree (optimiser moments, EMA).

  A leaf whose key path ends with a parameter's key path and has that parameter's shape gets the
  parameter's sharding (Adam's mu/nu live at `<optax prefix>/<param path>`); every other leaf
  (step counts, injected hyperparameters) is replicated.

  Args:
    abstract_tree: tree of ShapeDtypeStruct (e.g. `jax.eval_shape(optimizer.init, params)`).
    param_shardings: NamedSharding tree with the structure of `abstract_params`.
    abstract_params: the (unboxed) parameter tree of ShapeDtypeStruct.
    mesh: the device mesh.
  """
  by_path: dict[tuple[Any, ...], tuple[tuple[int, ...], NamedSharding]] = {}
  for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(abstract_params)[0],
                              jax.tree.leaves(param_shardings)):
    by_path[tuple(path)] = (tuple(leaf.shape), sh)
  lengths = sorted({len(p) for p in by_path}, reverse=True)

  def leaf_sharding(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
    path = tuple(path)
    for n in lengths:
      hit = by_path.get(path[-n:]) if len(path) >= n else None
      if hit is not None and hit[0] == tuple(getattr(leaf, 'shape', ())):
        return hit[1]
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(leaf_sharding, abstract_tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of every batch array: leading (batch) dimension over ('data', 'fsdp')."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def make_global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles a global jax.Array batch from each process's local numpy batch.

  Each process passes its own rows (`process_count` equal parts of the global batch, in process
  order); `jax.make_array_from_process_local_data` places them on the local devices.

  Args:
    local_batch: dict of numpy arrays `[B_local, ...]` (tokens, levels, given, loss_mask).
    mesh: the device mesh.
  Returns:
    dict of global jax.Arrays `[B_local * process_count, ...]` sharded by `batch_sharding(mesh)`.
  """
  sharding = batch_sharding(mesh)
  shards = num_batch_shards(mesh)
  rows = {name: np.shape(arr)[0] if np.ndim(arr) else None for name, arr in local_batch.items()}
  if len(set(rows.values())) > 1 or None in rows.values():
    raise ValueError(f'Batch arrays need the same leading (batch) dimension; got {rows}.')
  out = {}
  for name, arr in local_batch.items():
    arr = np.asarray(arr)
    global_shape = (arr.shape[0] * jax.process_count(),) + arr.shape[1:]
    if global_shape[0] % shards:
      raise ValueError(f'Global batch of {global_shape[0]} rows (batch key {name!r}) is not '
                       f'divisible by mesh.data * mesh.fsdp = {shards}; change data.batch_size.')
    out[name] = jax.make_array_from_process_local_data(sharding, arr, global_shape)
  return out
