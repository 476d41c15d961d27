"""Loading an experiment: a `configs/*.py` file (or a run directory's recorded config.json) plus
`--config.a.b=value` overrides.

The entry point, the scripts and the benchmarks all call `load` (one dialect: ml_collections'
config flags), then `resolve` once. Every mistake is one ValueError naming the file or field.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

from absl import flags
import ml_collections
from ml_collections import config_flags

from hmdlm_jax import storage

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
DEFAULT_CONFIG = os.path.join(CONFIGS_DIR, 'sudoku.py')
# `--config=DIR` (a run directory) is read as this experiment file with DIR/config.json.
RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recorded.py')
OVERRIDE_PREFIXES = ('--config.', '--noconfig.')


def config_spec(argv: Sequence[str], default: str = DEFAULT_CONFIG) -> str:
  """The value of the last --config flag (`--config=X` or `--config X`), else `default`."""
  spec = default
  for i, a in enumerate(argv):
    if a.startswith('--config='):
      spec = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def config_first(argv: Sequence[str]) -> list[str]:
  """`argv` (argv[0] = the program) with its --config file flags moved before everything else.

  ml_collections refuses a `--config.a.b=` override that comes before `--config=FILE`; a launch
  script that adds its overrides ahead of the user's flags would stop there. The order among the
  overrides (the last value of a field wins) and among the other flags is kept.
  """
  rest, files, i = list(argv[1:]), [], 0
  while i < len(rest):
    a = rest[i]
    if a == '--':
      break
    if a.startswith(('--config=', '-config=')):
      files.append(rest.pop(i))
    elif a in ('--config', '-config') and i + 1 < len(rest):
      files += [rest.pop(i), rest.pop(i)]
    else:
      i += 1
  return list(argv[:1]) + files + rest


def packaged(path: str) -> str:
  """`path`, or for a `configs/NAME.py` that is not a file here the config installed with the
  package (hmdlm_jax/configs): `--config=configs/lm1b.py` works in a checkout and after
  `pip install` alike."""
  rel = os.path.normpath(path)
  if os.path.isfile(path) or not rel.startswith('configs' + os.sep):
    return path
  candidate = os.path.join(CONFIGS_DIR, rel[len('configs') + 1:])
  return candidate if os.path.isfile(candidate) else path


def recorded_path(spec: str) -> str | None:
  """The config.json that `--config=spec` names when `spec` is a run directory (local or a URL)
  or a .json file, else None (an experiment file)."""
  if spec.endswith('.json'):
    return spec
  if storage.is_url(spec) or os.path.isdir(spec):
    return storage.join(spec, 'config.json')
  return None


def _split(spec: str) -> tuple[str, str | None]:
  """(file, argument) of `spec` (`path` or `path:arg`), the file resolved by `packaged`; a run
  directory's is `RECORDED` with its config.json."""
  recorded = recorded_path(spec)
  if recorded is not None:
    return RECORDED, recorded
  path, arg = packaged(spec), None
  if not os.path.isfile(path) and ':' in spec and os.path.isfile(packaged(spec.rsplit(':', 1)[0])):
    path, arg = spec.rsplit(':', 1)
    path = packaged(path)
  return path, arg


def packaged_spec(spec: str) -> str:
  """`spec` with its file resolved by `packaged` (what ml_collections' flag is given to read)."""
  path, arg = _split(spec)
  return path if arg is None else f'{path}:{arg}'


def load_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config()` of the file `spec` (or of `path:arg`, as ml_collections reads it), checked.

  Raises:
    ValueError naming the file: missing, a syntax error, failing to import, no get_config(), or
    get_config() raising or not returning an ml_collections.ConfigDict.
  """
  path, arg = _split(spec)
  flag = f'--config={spec}'
  if path == RECORDED and not storage.isfile(arg):
    raise ValueError(f'{flag}: no run config {arg!r}; --config=DIR takes a run directory that '
                     'training wrote (its config.json), or give an experiment file.')
  if not os.path.isfile(path):
    raise ValueError(f'{flag}: no such file or run directory; give an experiment file with '
                     'get_config(), e.g. --config=configs/sudoku.py (the experiments are in '
                     'configs/), or a trained run\'s --workdir.')
  try:
    module_spec = importlib.util.spec_from_file_location('_hmdlm_checked_config', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ValueError(f'{flag}: syntax error at line {e.lineno}: {e.msg} '
                     f'({(e.text or "").strip()!r}); fix the file.') from None
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{flag}: importing it failed: {type(e).__name__}: {e}') from None
  if not callable(getattr(module, 'get_config', None)):
    raise ValueError(f'{flag} defines no get_config(); an experiment file returns its '
                     'ml_collections.ConfigDict from get_config() (see configs/sudoku.py).')
  try:
    config = module.get_config() if arg is None else module.get_config(arg)
  except Exception as e:  # pylint: disable=broad-except
    if path == RECORDED:
      raise ValueError(f'{flag}: {arg!r} is not a readable run config ({type(e).__name__}: '
                       f'{e}).') from None
    raise ValueError(f'{flag}: get_config() raised {type(e).__name__}: {e}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'{flag}: get_config() returned {type(config).__name__}, not an '
                     'ml_collections.ConfigDict; build it from configs.base.get_base_config().')
  return config


def unknown_overrides(config: ml_collections.ConfigDict, argv: Sequence[str]) -> list[str]:
  """The --config.a.b overrides of `argv` that name no field of `config`."""
  bad = []
  for a in argv:
    name = a.split('=', 1)[0]
    for prefix in OVERRIDE_PREFIXES:
      if name.startswith(prefix):
        node: Any = config
        for part in name[len(prefix):].split('.'):
          if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
            bad.append(name)
            break
          node = node[part]
  return bad


def define_config_flag(flag_values: flags.FlagValues, default: str = DEFAULT_CONFIG,
                       argv: Sequence[str] | None = None) -> Any:
  """Defines `--config` (a config file with `--config.a.b=` overrides) on `flag_values`; the
  overrides are read from `argv` (None: sys.argv, the command line), in `config_first` order."""
  return config_flags.DEFINE_config_file(
      'config', default, 'Experiment config file (a Python file with get_config()).',
      flag_values=flag_values, lock_config=True,
      sys_argv=None if argv is None else config_first(argv))


def _with_config(argv: list[str], spec: str) -> list[str]:
  """`argv` with its last --config value replaced by `spec` (the file ml_collections reads)."""
  for i in reversed(range(1, len(argv))):
    if argv[i].startswith('--config='):
      return argv[:i] + [f'--config={spec}'] + argv[i + 1:]
    if argv[i] == '--config' and i + 1 < len(argv):
      return argv[:i + 1] + [spec] + argv[i + 2:]
  return argv


def parse(flag_values: flags.FlagValues, argv: Sequence[str],
          default: str = DEFAULT_CONFIG) -> list[str]:
  """absl's parsing of `argv` (argv[0] = the program) with the config checked first.

  Returns the arguments absl leaves over. Raises ValueError: the config file's own problems
  (`load_file`), an unknown override (named, with the schema to look in), a bad value. The
  overrides may come before `--config=FILE` (`config_first`); where the flag reads sys.argv
  (`define_config_flag` without argv), the caller reorders sys.argv itself.
  """
  argv = config_first(argv)
  spec = config_spec(argv[1:], default)
  config = load_file(spec)
  try:
    return flag_values(_with_config(list(argv), packaged_spec(spec)))
  except flags.Error as e:
    raise ValueError(str(e)) from None
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    bad = unknown_overrides(config, argv[1:])
    if bad:
      raise ValueError(f'unknown config field{"s" if len(bad) > 1 else ""} {", ".join(bad)}: no '
                       f'such key in {spec} (every field is listed in '
                       'hmdlm_jax/config/schema.py).') from None
    raise ValueError(f'invalid config override: {type(e).__name__}: {e}') from None


def load(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The experiment `spec` (a configs/*.py path, or `path:arg`) with `--config.a.b=value`
  overrides applied, as `python -m hmdlm_jax.main` reads them (not yet resolved).

  Raises:
    ValueError naming the file or the override.
  """
  bad = [o for o in overrides if not o.startswith(OVERRIDE_PREFIXES)]
  if bad:
    raise ValueError(f'{bad[0]!r}: overrides are written --config.section.field=value.')
  argv = ['load', f'--config={spec}', *overrides]  # already in config_first's order
  fv = flags.FlagValues()
  holder = define_config_flag(fv, spec, argv)
  parse(fv, argv, spec)
  return holder.value
