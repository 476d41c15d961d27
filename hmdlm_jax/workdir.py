"""The run directory: its record of runs, and the checks made before anything is written into it.

Process 0 writes the record when a run has passed every check of hmdlm_jax/preflight.py and really
starts (`start_run` lists the fields): config.json / config.yaml, the resolved config of the
training run that created DIR's checkpoints (written when training starts from step 0, never
rewritten by a resume), and runs.jsonl, one JSON object appended per run that started (train in
DIR; eval / sample in their output directory, DIR unless --out).

A rejected run writes nothing: no config.json, no runs.jsonl line, no directory. Eval and sample
runs never create or write into DIR unless it is also their output directory (the default, when
DIR is writable); their outputs (evaluation reports, samples_<step>.jsonl, pictures/) are never
replaced without --overwrite.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import jax

from hmdlm_jax import config as config_lib
from hmdlm_jax import lease as lease_lib
from hmdlm_jax import storage

RUNS_FILE = 'runs.jsonl'
# What a resumed training run must share with its checkpoints (dotted prefixes of config fields).
RESUME_FIELDS = ('seed', 'process.', 'model.', 'schedule.', 'loss.', 'optim.', 'data.kind',
                 'data.batch_size', 'data.seq_len')
RESUME_FREE = ('schedule.check_ordering',)  # checked on the sampling grid only


def config_to_dict(config: config_lib.Config) -> dict[str, Any]:
  """JSON-ready nested dict (tuples become lists)."""
  return json.loads(json.dumps(config_lib.to_dict(config)))


# ------------------------------------------------------------------------------------ directories


def check_creatable(path: str, flag: str) -> bool:
  """Raises ValueError unless `path` is a writable directory or can be created; creates nothing
  (a URL: a probe object is written and removed at once).

  Returns:
    Whether `path` already exists.
  """
  path = storage.absolute(path)
  if storage.is_url(path):
    if storage.isfile(path):
      raise ValueError(f'{flag}={path!r} is an object, not a folder; choose another {flag}.')
    why = storage.probe_writable(path)
    if why:
      raise ValueError(f'{flag}={path!r} cannot be written ({why}); check that the bucket exists '
                       f'and that these credentials may write to it, or choose another {flag}.')
    return storage.isdir(path)
  if os.path.exists(path):
    if not os.path.isdir(path):
      raise ValueError(f'{flag}={path!r} exists and is not a directory; choose another '
                       f'{flag} or remove that file.')
    why = storage.probe_writable(path)
    if why:
      raise ValueError(f'{flag}={path!r} is not writable ({why}); choose a writable {flag}.')
    return True
  parent = os.path.dirname(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f'{flag}={path!r} cannot be created: {parent!r} is a file, not a '
                     f'directory; choose another {flag}.')
  why = storage.probe_writable(parent)
  if why:
    raise ValueError(f'{flag}={path!r} cannot be created: {parent!r} is not writable ({why}); '
                     f'choose a writable {flag}.')
  return False


def check_run_dir(workdir: str) -> None:
  """Raises ValueError unless `workdir` is an existing directory (eval / sample read it)."""
  if not storage.exists(workdir):
    raise ValueError(f'--workdir={workdir!r} does not exist: train first (--mode=train with this '
                     '--workdir) or point --workdir at a trained run.')
  if not storage.isdir(workdir):
    raise ValueError(f'--workdir={workdir!r} is not a directory; point --workdir at a trained '
                     'run.')


def output_dir(workdir: str, out: str | None, mode: str) -> str:
  """The directory an eval / sample run writes to: `out`, else `workdir` when it is writable."""
  if out:
    check_creatable(out, '--out')
    return storage.absolute(out)
  why = storage.probe_writable(workdir)
  if why:
    raise ValueError(f'--workdir={workdir!r} is not writable ({why}); pass --out=DIR for the '
                     f'outputs of this --mode={mode} run.')
  return storage.absolute(workdir)


def check_outputs(directory: str, names: Iterable[str], overwrite: bool) -> None:
  """Raises ValueError if an output of `names` exists in `directory` (a folder with a file counts),
  unless `overwrite`. A temporary file a killed write left behind (storage.is_partial) is no
  output: the rerun of a killed command is not refused for it."""
  if overwrite:
    return
  for name in names:
    path = storage.join(directory, name)
    if storage.isfile(path) or (storage.isdir(path) and not all(
        storage.is_partial(n) for n in storage.listdir(path))):
      raise ValueError(f'{path} exists (from an earlier run) and would be replaced: pass '
                       '--overwrite to replace it, or --out=ANOTHER_DIR to keep it.')


# ------------------------------------------------------------------------------------ the config


def _flat(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(_flat(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def config_changes(stored: Mapping[str, Any] | None, config: config_lib.Config
                   ) -> list[str]:
  """'field: stored -> now' for every RESUME_FIELDS field where `config` (resolved) differs from
  the `stored` config dict of a checkpoint; fields absent from either side are skipped."""
  if not stored:
    return []
  old = _flat(json.loads(json.dumps(config_lib.schema.migrate_record(stored))))
  new = _flat(config_to_dict(config))
  keys = [k for k in new if k in old and k not in RESUME_FREE
          and any(k == f or (f.endswith('.') and k.startswith(f)) for f in RESUME_FIELDS)]
  return [f'{k}: {old[k]!r} -> {new[k]!r}' for k in sorted(keys) if old[k] != new[k]]


# ------------------------------------------------------------------------------------ the record


def start_run(config: config_lib.Config, directory: str, mode: str, *, workdir: str,
              step: int, write_config: bool, argv: Sequence[str] | None = None) -> None:
  """Creates `directory`, writes config.json/.yaml when `write_config` and appends the run's line
  to runs.jsonl (module docstring); process 0 only.

    config.json / config.yaml   the resolved config of the training run that created DIR's
                                checkpoints: written when training starts from step 0, never
                                rewritten by a resume (a resume must keep the model, process and
                                optimiser; its other overrides, e.g. a larger train.num_steps, are
                                in runs.jsonl). config.yaml only when PyYAML is installed.
    runs.jsonl                  one JSON object per run that started, appended:
                                  time       ISO 8601 UTC start time
                                  mode       'train' | 'eval' | 'sample'
                                  workdir    absolute run directory
                                  out        eval / sample: absolute output directory; train: null
                                  step       train: the checkpoint step resumed from (0: fresh);
                                             eval / sample: the checkpoint step used
                                  argv       the command line (null for a call of main.run)
                                  overrides  its --config.* arguments
                                  config     the resolved config of this run
  """
  if jax.process_index() != 0:
    return
  lease_lib.check_held()  # fenced: no record from a run whose lease was taken over (lease.py)
  storage.makedirs(directory)
  d = config_to_dict(config)
  if write_config:
    storage.write_text(storage.join(directory, 'config.json'),
                       json.dumps(d, indent=2, sort_keys=True))
    try:
      import yaml  # pylint: disable=g-import-not-at-top
    except ImportError:
      yaml = None
    if yaml is not None:
      storage.write_text(storage.join(directory, 'config.yaml'), yaml.safe_dump(d, sort_keys=True))
  record = {
      'time': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'mode': mode, 'workdir': storage.absolute(workdir),
      'out': None if mode == 'train' else storage.absolute(directory), 'step': int(step),
      'argv': None if argv is None else list(argv),
      'overrides': [a for a in argv or () if a.startswith(('--config.', '--noconfig.'))],
      'config': d,
  }
  storage.append_text(storage.join(directory, RUNS_FILE), json.dumps(record, sort_keys=True) + '\n')
