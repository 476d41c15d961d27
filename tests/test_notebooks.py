"""Executes every Colab notebook end to end with nbclient on the tiny settings (CI: seconds each).

The test sets the notebooks' knobs as papermill does: a cell injected right after the cell tagged
`parameters` sets TEST = True (smallest settings, no pip install) and WORKDIR, a temporary folder
shared by the tests of this module: the checkpoint explorer reuses the Sudoku run of the quickstart
(as it does on Colab) when the quickstart ran first. The kernel is `python3`; jupyter_client starts
it with this interpreter (sys.executable), so it sees the venv's packages. The kernel starts in
colabs/, so the notebooks' repository search (working directory or a parent) is exercised too; the
clone a notebook makes outside a checkout is tested from a local repository (no network).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import nbformat
from nbclient import NotebookClient
import numpy as np
from PIL import Image
import pytest

from tests.conftest import subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLABS = ROOT / 'colabs'
NOTEBOOKS = ('quickstart.ipynb', 'schedules_explorer.ipynb', 'checkpoint_explorer.ipynb')
CELL_TIMEOUT_S = 300


@pytest.fixture(scope='module')
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  return tmp_path_factory.mktemp('colabs')


def _parameters_cell(nb: nbformat.NotebookNode) -> int:
  tagged = [i for i, c in enumerate(nb.cells) if 'parameters' in c.metadata.get('tags', [])]
  assert len(tagged) == 1 and nb.cells[tagged[0]].cell_type == 'code', tagged
  return tagged[0]


def _run(name: str, workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
         jax_cache: str) -> nbformat.NotebookNode:
  for var in ('HMDLM_NOTEBOOK_TEST', 'HMDLM_NOTEBOOK_WORKDIR'):
    monkeypatch.delenv(var, raising=False)  # the injected parameters alone select the test mode
  # The kernel compiles as the other JAX subprocesses of the tests do (CPU, XLA's fast compile
  # level, the session's compilation cache): compiling is most of a notebook's test time.
  for var, value in subprocess_env(jax_cache).items():
    if var.startswith(('JAX_', 'XLA_', 'TF_CPP')):
      monkeypatch.setenv(var, value)
  nb = nbformat.read(COLABS / name, as_version=4)
  # What `papermill -p TEST True -p WORKDIR ...` injects.
  nb.cells.insert(_parameters_cell(nb) + 1, nbformat.v4.new_code_cell(
      f'# Parameters\nTEST = True\nWORKDIR = {str(workdir)!r}\n',
      metadata={'tags': ['injected-parameters']}))
  client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name='python3',
                          resources={'metadata': {'path': str(COLABS)}})
  client.execute()  # raises CellExecutionError with the failing cell's traceback
  return nb


def _stdout(nb: nbformat.NotebookNode) -> str:
  return ''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code'
                 for o in c.get('outputs', []) if o.get('output_type') == 'stream')


def _num_images(nb: nbformat.NotebookNode) -> int:
  return sum(1 for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', [])
             if o.get('output_type') == 'display_data' and
             ({'image/png', 'image/gif'} & set(o.get('data', {}))))


def _check_png(path: pathlib.Path) -> None:
  assert path.is_file(), f'{path} was not written'
  with Image.open(path) as im:
    assert im.format == 'PNG' and min(im.size) >= 200, (path, im.format, im.size)
    # Not a blank canvas: a picture has many distinct colours.
    assert len(np.unique(np.asarray(im.convert('RGB')).reshape(-1, 3), axis=0)) > 20


def test_notebooks_are_generated_from_make_notebooks():
  res = subprocess.run([sys.executable, str(COLABS / 'make_notebooks.py'), '--check'],
                       capture_output=True, text=True, check=False)
  assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_notebook_opens_in_colab_with_parameters_then_clone_and_install(name):
  nb = nbformat.read(COLABS / name, as_version=4)
  badge = nb.cells[0]
  assert badge.cell_type == 'markdown' and 'colab.research.google.com/assets/colab-badge.svg' in (
      badge.source) and f'/blob/main/colabs/{name})' in badge.source, badge.source
  i = _parameters_cell(nb)
  params = nb.cells[i].source
  for knob in ('TEST =', 'WORKDIR =', 'ACCELERATOR =', 'REPO_URL ='):
    assert knob in params, (name, knob)
  if name != 'schedules_explorer.ipynb':  # the two that train
    assert 'TRAIN_STEPS =' in params and 'TRAIN_MINUTES =' in params
  # The first code cell after the knobs clones (outside a checkout) and installs: the package in
  # pyproject.toml's ranges, never requirements.txt's pins over the runtime's own packages.
  setup = nb.cells[i + 1].source
  assert "'git', 'clone'" in setup and '!pip install -q -e "{ROOT}{extra}"' in setup
  assert 'pip install -r' not in setup and 'requirements.txt"' not in setup
  assert [c for c in nb.cells[:i] if c.cell_type == 'code'] == []


def test_setup_cell_clones_the_repository_outside_a_checkout(tmp_path):
  nb = nbformat.read(COLABS / 'quickstart.ipynb', as_version=4)
  i = _parameters_cell(nb)
  setup = nb.cells[i + 1].source.split('# Install the package')[0]  # the clone, not the pip
  repo = tmp_path / 'origin'  # a local repository stands in for REPO_URL: no network
  subprocess.run(['git', 'init', '-q', str(repo)], check=True)
  for d in ('hmdlm_jax', 'configs'):
    (repo / d).mkdir()
  (repo / 'hmdlm_jax' / '__init__.py').write_text('')
  (repo / 'configs' / 'base.py').write_text('')
  git = ['git', '-C', str(repo), '-c', 'user.name=t', '-c', 'user.email=t@t']
  subprocess.run(git + ['add', '.'], check=True)
  subprocess.run(git + ['commit', '-q', '-m', 'x'], check=True)
  colab = tmp_path / 'content'  # Colab's working directory: no checkout at or above it
  colab.mkdir()
  script = (f'import os\nTEST = True\nWORKDIR = {str(tmp_path / "work")!r}\n'
            f'REPO_URL = {repo.as_uri()!r}\n' + setup + '\nprint("ROOT", ROOT, os.getcwd())\n')
  for _ in range(2):  # the second run finds the clone of the first in ./hmdlm_jax
    res = subprocess.run([sys.executable, '-c', script], cwd=colab, capture_output=True,
                         text=True, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    clone = colab / 'hmdlm_jax'
    assert f'ROOT {clone} {clone}' in res.stdout
    assert (clone / 'hmdlm_jax' / '__init__.py').is_file()
  assert res.stdout.count('cloning') == 0  # the second run did not clone again


def test_quickstart(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch, jax_cache: str):
  nb = _run('quickstart.ipynb', workdir, monkeypatch, jax_cache)
  pictures = workdir / 'pictures'
  _check_png(pictures / 'quickstart_sudoku_reveal.png')
  # The GIF has one frame per distinct reveal step of the generated cells, plus the quiz.
  # hmdlm_jax.load(...).solve wrote nothing into the run: the notebook saved its record.
  assert not list((workdir / 'sudoku_run').glob('samples_*.jsonl'))
  rec = json.loads((workdir / 'quickstart_solution.json').read_text())
  free = np.array([c == '0' for c in rec['quiz']])
  steps = np.array(rec['reveal_step'])
  with Image.open(pictures / 'quickstart_sudoku_reveal.gif') as im:
    assert im.n_frames == len(np.unique(steps[free])) + 1
  assert _num_images(nb) == 2
  assert 'skipping pip install' in _stdout(nb)  # TEST never installs


def test_schedules_explorer(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch, jax_cache: str):
  nb = _run('schedules_explorer.ipynb', workdir, monkeypatch, jax_cache)
  pictures = workdir / 'pictures'
  for name in ('schedules_lm1b', 'schedules_wikihow', 'schedules_sudoku', 'ordering_lm1b',
               'ordering_violation'):
    _check_png(pictures / f'{name}.png')
  out = _stdout(nb)
  # Appendix D's remark: on LM1B's T = 256 grid λ_0 > λ_1 exactly on the 64 steps with t <= δ_1.
  assert 'steps with λ_0 > λ_1: 64 (all with t_n <= δ_1: True)' in out
  assert '15 violating steps' in out  # ω = (2, 1), T = 16: every step but n = 1
  assert _num_images(nb) == 5


def test_checkpoint_explorer(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                             jax_cache: str):
  nb = _run('checkpoint_explorer.ipynb', workdir, monkeypatch, jax_cache)
  pictures = workdir / 'pictures'
  for name in ('explorer_sudoku_0', 'explorer_sudoku_1', 'explorer_sudoku_decodings',
               'explorer_text_reveal'):
    _check_png(pictures / f'{name}.png')
  ppl = json.loads((workdir / 'sentences_perplexity.json').read_text())['perplexity']
  assert ppl['num_sequences'] == 3  # the notebook's three sentences
  assert np.isfinite(ppl['bound_nats_per_token']) and ppl['ppl'] > 1.0
  out = _stdout(nb)
  assert 'bound' in out
  # hmdlm_jax.load(...): a continuation begins with its prompt; an infill keeps the unmasked words.
  assert 'complete: the king said' in out
  infill = [line for line in out.splitlines() if line.startswith('infill: ')]
  assert len(infill) == 1 and infill[0].startswith('infill: the') and infill[0].endswith(
      ' was first printed in the folio.'), infill  # WordPiece detokenised
