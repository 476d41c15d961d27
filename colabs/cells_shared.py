"""Cells every notebook starts with: parameters, setup (clone, install), imports."""

from __future__ import annotations

# The first lines of every notebook's `parameters` cell (papermill injects its -p values after
# that cell). make_notebooks.py replaces @REPO_URL@.
PARAMETERS = '''\
import os

# HMDLM_NOTEBOOK_TEST=1 (tests/test_notebooks.py, CI): the smallest settings, nothing installed.
TEST = os.environ.get('HMDLM_NOTEBOOK_TEST') == '1'
# Everything this notebook writes (checkpoints, pictures) goes below WORKDIR.
WORKDIR = os.environ.get('HMDLM_NOTEBOOK_WORKDIR', '/tmp/hmdlm_colabs')
# 'gpu' or 'tpu': the jax extra installed when jax is missing or outside pyproject.toml's range.
ACCELERATOR = 'cpu'
# Cloned (into ./hmdlm_jax) when the notebook runs outside a checkout, e.g. opened on Colab.
REPO_URL = '@REPO_URL@'
'''

SETUP = '''\
# Setup: find the repository (cloning it when there is none, e.g. on Colab) and work in it.
import pathlib
import subprocess


def find_repo_root() -> pathlib.Path | None:
  """The hmdlm_jax checkout: the working directory, one of its parents, or ./hmdlm_jax."""
  here = pathlib.Path.cwd().resolve()
  for d in (here, *here.parents, here / 'hmdlm_jax'):
    if (d / 'hmdlm_jax' / '__init__.py').is_file() and (d / 'configs' / 'base.py').is_file():
      return d
  return None


ROOT = find_repo_root()
if ROOT is None:
  ROOT = pathlib.Path.cwd().resolve() / 'hmdlm_jax'
  print('no checkout here: cloning', REPO_URL, 'into', ROOT)
  subprocess.run(['git', 'clone', '--depth=1', REPO_URL, str(ROOT)], check=True)
# A notebook kernel imports from its working directory first: working in the repository root
# makes `import hmdlm_jax` (and `configs`) this checkout, installed or not.
os.chdir(ROOT)
WORKDIR = pathlib.Path(WORKDIR)
WORKDIR.mkdir(parents=True, exist_ok=True)
print(f'repository: {ROOT}\\nworkdir:    {WORKDIR}\\ntest mode:  {TEST}')
'''

INSTALL = '''\
# Install the package unless its requirements are installed in their ranges (pyproject.toml, not
# requirements.txt's exact pins): `pip install -e .` keeps every package Colab has in its range
# (jax, torch, ...) and adds the accelerator's jax extra only when jax itself is missing.
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
  extra = EXTRA if any(Requirement(m).name == 'jax' for m in MISSING) else ''
  print('installing', MISSING)
  !pip install -q -e "{ROOT}{extra}"
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
