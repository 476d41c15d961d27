"""Everything a run checks before it writes anything (main.run calls `check` first).

A mistake is one ValueError naming the field or file and what to do, raised before a file is
created or the model initialised. In order: the task's data against the model, the process, the
batch against the process count; the workdir (train: creatable, and train.wandb usable; eval /
sample: exists, outputs writable); memory and disk (hmdlm_jax/resources.py: the batch fits the
devices, one checkpoint the disk); the checkpoint (its files whole, checkpoint_manifest; resume:
its stored config agrees on workdir.RESUME_FIELDS and its tree fits; eval / sample: --step exists
and fits); a warm start's source fits the model (shapes only); sample inputs parse; eval / sample
outputs do not exist yet unless `overwrite`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import flax.linen as nn
import jax

from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import config as config_lib
from hmdlm_jax import lease
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import processes
from hmdlm_jax import resources
from hmdlm_jax import sharding
from hmdlm_jax import storage
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax import warm_start
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.tasks import base as tasks_base

MODES = ('train', 'eval', 'sample')


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checked run. model: its network, built with the task's features (tasks.build_model).
  step: train, the checkpoint resumed from (None: a fresh start); eval / sample, the checkpoint
  used. out_dir: eval / sample, where outputs go (None for train)."""
  mode: str
  config: config_lib.Config
  task: tasks_base.Task
  model: nn.Module
  workdir: str
  step: int | None
  out_dir: str | None


def _abstract_state(config: config_lib.Config, model: nn.Module) -> Any:
  return train.state_shardings(config, model, sharding.make_mesh(config.mesh))[0]


def _stored_config(ckpt: ckpt_lib.Checkpointer, workdir: str, step: int) -> tuple[Any, str]:
  """(the config a checkpoint was trained with, where it was read): its meta, else config.json."""
  stored = ckpt.meta(step).get('config')
  if stored:
    return stored, storage.join(ckpt.step_dir(step), 'meta')
  path = storage.join(workdir, 'config.json')
  try:
    return json.loads(storage.read_text(path)), path
  except (OSError, ValueError):  # none, or unreadable: the tree check below still applies
    return None, ''


def _check_whole(ckpt: ckpt_lib.Checkpointer, step: int, workdir: str, mode: str) -> None:
  """Step `step`'s files against its manifest (checkpoint_manifest); a damaged one is refused
  naming the file and the latest whole step before it (train: move the damaged step away)."""
  damage = ckpt.damage(step)
  if not damage:
    return
  where = ckpt.step_dir(step)
  earlier = ckpt.whole_step_before(step)
  if earlier is None:
    offer = ('no earlier step is whole: use another --workdir to start afresh' if mode == 'train'
             else 'no earlier step is whole: train again')
  elif mode == 'train':
    offer = (f'step {earlier} is whole: move this step away (mv {where} '
             f'{storage.join(workdir, f"damaged_step_{step}")}) to resume from it')
  else:
    offer = f'step {earlier} is whole: --step={earlier} uses it'
  raise ckpt_lib.CheckpointError(f'checkpoint {where} is damaged: {damage}; {offer}.')


def check_resume(config: config_lib.Config, workdir: str, model: nn.Module, *,
                 resume_with_changes: bool = False) -> int | None:
  """The step a training run of `model` in `workdir` resumes from (None: a fresh start),
  checked."""
  directory = storage.join(workdir, 'checkpoints')
  if not storage.isdir(directory):
    return None
  why = storage.probe_writable(directory)
  if why:  # Orbax would open it read-only and wait for each save's folder until it times out
    raise ValueError(f'{directory!r} is not writable ({why}): training saves its checkpoints '
                     'there. Fix its permissions (or mount) or choose another --workdir.')
  ckpt = ckpt_lib.Checkpointer(workdir, config.train, read_only=True)
  try:
    step = ckpt.latest_step()
    if step is None:
      return None
    _check_whole(ckpt, step, workdir, 'train')
    num_steps = int(config.train.num_steps)
    # The loop would not run and the command would end with exit 0 and no word. Equal is let
    # through: rerunning a finished (or preempted-at-its-last-step) command is the documented
    # resume, and finishes the run (its final evaluation).
    if step > num_steps:
      raise ValueError(
          f'--workdir={workdir!r} holds a checkpoint at step {step}; train.num_steps={num_steps} '
          'is below it, so there is nothing to train. Raise train.num_steps above '
          f'{step} to train on, or use another --workdir to start afresh.')
    stored, where = _stored_config(ckpt, workdir, step)
    changes = workdir_lib.config_changes(stored, config)
    if changes and not resume_with_changes:
      raise ValueError(
          f'--workdir={workdir!r} holds checkpoints (latest step {step}) trained with another '
          f'config ({where}): ' + '; '.join(changes) + '. A rerun resumes that training: drop '
          'these overrides, use a new --workdir to start afresh, or pass --resume_with_changes '
          'to resume with them anyway.')
    ckpt.check_compatible(_abstract_state(config, model), step)
    return step
  finally:
    ckpt.close()


def check_init(config: config_lib.Config, model: nn.Module) -> None:
  """init.mdlm_checkpoint / init.workdir (when set) is readable and fits `model`'s parameters
  (a warm start across processes, hmdlm_jax/warm_start.py, maps the vocabulary rows first)."""
  if warm_start.requested(config):
    warm_start.check(config, model)


def check_checkpoint(config: config_lib.Config, workdir: str, step: int | None,
                     model: nn.Module) -> int:
  """The checkpoint step of `model` an eval / sample run reads (`step`, None: the latest),
  checked. The run itself selects the latest again (a live training run may delete this one)."""
  ckpt = ckpt_lib.Checkpointer(workdir, config.train, read_only=True)
  try:
    abstract = _abstract_state(config, model)
    chosen = []

    def compatible(s: int) -> int:
      chosen.append(s)
      _check_whole(ckpt, s, workdir, 'eval')
      ckpt.check_compatible(abstract, s)
      return s

    try:
      return ckpt.read_latest(step, compatible)
    except ckpt_lib.CheckpointError as e:
      if not chosen or ckpt.superseded(chosen[-1]):  # none read, or replaced meanwhile
        raise
      step = chosen[-1]
      stored, where = _stored_config(ckpt, workdir, step)
      changes = [c for c in workdir_lib.config_changes(stored, config) if c.startswith('model.')]
      if not changes:
        raise
      # The changed fields say what to do; the arrays that differ (e) would bury them.
      shown = '; '.join(changes[:3]) + (f'; and {len(changes) - 3} more' if changes[3:] else '')
      raise ValueError(f'checkpoint {ckpt.step_dir(step)!r} holds another model ({where}): '
                       f'{shown}. Use the config it was trained with: --config={workdir}.') from e
  finally:
    ckpt.close()


def check(mode: str, config: config_lib.Config, workdir: str, *,
          step: int | None = None, inputs: Sequence[str] | None = None,
          input_file: str | None = None, out: str | None = None, overwrite: bool = False,
          resume_with_changes: bool = False, prompts: Sequence[str] = (),
          infills: Sequence[str] = ()) -> Plan:
  """Checks a run of `mode` (module docstring); raises ValueError, writes nothing."""
  if mode not in MODES:
    raise ValueError(f'--mode={mode!r} is not one of {MODES}.')
  task = tasks.get(config)
  task.validate(config)
  model = task.build_model(config)
  train.validate_config(config)
  sharding.resolve_mesh_shape(config.mesh, jax.device_count())
  # The process as the train step will run it on this mesh (e.g. loss.token_rows='selected' is
  # refused on several devices here, before anything is written).
  processes.build(config).for_devices(jax.device_count())
  workdir = storage.absolute(workdir)
  if mode == 'train':
    extra = [f for f, v in (('--step', step is not None), ('--out', out),
                            ('--inputs', inputs), ('--input_file', input_file),
                            ('--prompt', prompts), ('--infill', infills)) if v]
    if extra:
      raise ValueError(f'{", ".join(extra)} apply to --mode=eval / --mode=sample, not to '
                       'training (a rerun of training resumes from the latest checkpoint).')
    workdir_lib.check_creatable(workdir, '--workdir')
    # Before reading the checkpoints a live run there may be rewriting (main takes the lease).
    lease.refuse_if_held(workdir, lease.TRAIN_LEASE, '--workdir')
    metrics_lib.check_wandb(config.train.wandb)
    abstract, mesh = resources.abstract_state(config, model)
    resources.check_train(config, model, abstract, mesh)
    resources.check_disk(workdir, abstract)
    resumed = check_resume(config, workdir, model, resume_with_changes=resume_with_changes)
    if resumed is None:
      check_init(config, model)
    return Plan(mode, config, task, model, workdir, resumed, None)
  if mode == 'eval' and (inputs or input_file or prompts or infills):
    raise ValueError('--inputs / --input_file / --prompt / --infill apply to --mode=sample; '
                     '--mode=eval evaluates the test split (data.test_path or the generated '
                     'puzzles).')
  workdir_lib.check_run_dir(workdir)
  step = check_checkpoint(config, workdir, step, model)
  num_inputs = 1 if input_file else (len(inputs) if inputs else None)
  resources.check_eval(config, *resources.abstract_state(config, model),
                       resources.eval_rows(config, mode, num_inputs))
  if mode == 'sample':
    task.prepare_sample(config, inputs, input_file, prompts=prompts, infills=infills)
  out_dir = workdir_lib.output_dir(workdir, out, mode)
  workdir_lib.check_outputs(out_dir, task.outputs(config, mode, step), overwrite)
  return Plan(mode, config, task, model, workdir, step, out_dir)
