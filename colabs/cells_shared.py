"""Cells every notebook starts with: setup, install, imports (colabs/make_notebooks.py)."""

from __future__ import annotations

SETUP = '''\
# Setup: find the repository, work in it, and read the test switches.
import os
import pathlib

# tests/test_notebooks.py sets HMDLM_NOTEBOOK_TEST=1: smallest settings, nothing installed.
TEST = os.environ.get('HMDLM_NOTEBOOK_TEST') == '1'
# Everything this notebook writes (checkpoints, pictures) goes below WORKDIR.
WORKDIR = pathlib.Path(os.environ.get('HMDLM_NOTEBOOK_WORKDIR', '/tmp/hmdlm_colabs'))
# Colab: 'gpu' or 'tpu' installs the matching jax extra (pip install -e ".[cuda]" / ".[tpu]").
ACCELERATOR = 'cpu'


def find_repo_root() -> pathlib.Path:
  """The hmdlm_jax checkout: the working directory or one of its parents."""
  here = pathlib.Path.cwd().resolve()
  for d in (here, *here.parents):
    if (d / 'hmdlm_jax' / '__init__.py').is_file() and (d / 'configs' / 'base.py').is_file():
      return d
  raise FileNotFoundError(
      f'No hmdlm_jax checkout at or above {here}. On Colab: upload or `!git clone` the repository, '
      'then `%cd` into it (or its colabs/ folder) and run this cell again.')


ROOT = find_repo_root()
# A notebook kernel imports from its working directory first: working in the repository root
# makes `import hmdlm_jax` (and `configs`) this checkout, installed or not.
os.chdir(ROOT)
WORKDIR.mkdir(parents=True, exist_ok=True)
print(f'repository: {ROOT}\\nworkdir:    {WORKDIR}\\ntest mode:  {TEST}')
'''

INSTALL = '''\
# Install the package with its requirements unless they are already installed in their ranges
# (pyproject.toml): a Colab runtime keeps the versions it has when they fit.
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

EXTRA = {'cpu': '', 'gpu': '[cuda]', 'tpu': '[tpu]'}[ACCELERATOR]


def missing_requirements(pyproject: pathlib.Path) -> list[str]:
  """The requirements of `pyproject` that are not installed at a version in their range."""
  out = []
  for line in tomllib.loads(pyproject.read_text())['project']['dependencies']:
    req = Requirement(line)
    try:
      if not req.specifier.contains(metadata.version(req.name), prereleases=True):
        out.append(line)
    except metadata.PackageNotFoundError:
      out.append(line)
  return out


MISSING = [] if TEST else missing_requirements(ROOT / 'pyproject.toml')
if MISSING:
  print('installing', MISSING)
  !pip install -q -e "{ROOT}{EXTRA}"
  print('Installed: restart the runtime (Runtime > Restart session), then run all cells again.')
else:
  print('requirements satisfied: skipping pip install')
'''

IMPORTS = '''\
import jax
import numpy as np
from IPython.display import Image, display

import hmdlm_jax
from hmdlm_jax import config as config_lib
from hmdlm_jax import visualize

if pathlib.Path(hmdlm_jax.__file__).resolve().parents[1] != ROOT:
  raise ImportError(f'hmdlm_jax was imported from {hmdlm_jax.__file__}, not from {ROOT}: restart '
                    'the runtime and run the setup cell first.')


def load_config(path: str, *overrides: str):
  """The experiment `path` of the repository (e.g. 'configs/sudoku.py') with `--config.a.b=value`
  overrides, read as `python -m hmdlm_jax.main --config=path` reads it (hmdlm_jax.config.load)."""
  return config_lib.load(str(ROOT / path), list(overrides))


def show(path) -> None:
  """Displays a picture written by hmdlm_jax.visualize."""
  display(Image(filename=str(path)))


PICTURES = WORKDIR / 'pictures'
PICTURES.mkdir(parents=True, exist_ok=True)
print('jax', jax.__version__, jax.devices())
'''
