"""Executes every Colab notebook end to end with nbclient on the tiny settings.

The notebooks read HMDLM_NOTEBOOK_TEST=1 (smallest settings, no pip install) and write everything
under HMDLM_NOTEBOOK_WORKDIR, which points at a temporary folder shared by the tests of this module:
the checkpoint explorer reuses the Sudoku run of the quickstart (as it does on Colab) when the
quickstart ran first. The kernel is `python3`; jupyter_client starts it with this interpreter
(sys.executable), so it sees the venv's packages. The kernel starts in colabs/, so the notebooks'
repository search (working directory or a parent) is exercised too.
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLABS = ROOT / 'colabs'
NOTEBOOKS = ('quickstart.ipynb', 'schedules_explorer.ipynb', 'checkpoint_explorer.ipynb')
CELL_TIMEOUT_S = 300


@pytest.fixture(scope='module')
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  return tmp_path_factory.mktemp('colabs')


def _run(name: str, workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
  monkeypatch.setenv('HMDLM_NOTEBOOK_TEST', '1')
  monkeypatch.setenv('HMDLM_NOTEBOOK_WORKDIR', str(workdir))
  nb = nbformat.read(COLABS / name, as_version=4)
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


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_quickstart(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
  nb = _run('quickstart.ipynb', workdir, monkeypatch)
  pictures = workdir / 'pictures'
  _check_png(pictures / 'quickstart_sudoku_reveal.png')
  # The GIF has one frame per distinct reveal step of the generated cells, plus the quiz.
  run = workdir / 'sudoku_run'
  samples = sorted(run.glob('samples_*.jsonl'))
  assert samples, 'run_sample wrote no samples file'
  rec = json.loads(samples[-1].read_text().splitlines()[0])
  free = np.array([c == '0' for c in rec['quiz']])
  steps = np.array(rec['reveal_step'])
  with Image.open(pictures / 'quickstart_sudoku_reveal.gif') as im:
    assert im.n_frames == len(np.unique(steps[free])) + 1
  assert _num_images(nb) == 2
  assert 'skipping pip install' in _stdout(nb)  # TEST never installs


def test_schedules_explorer(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
  nb = _run('schedules_explorer.ipynb', workdir, monkeypatch)
  pictures = workdir / 'pictures'
  for name in ('schedules_lm1b', 'schedules_wikihow', 'schedules_sudoku', 'ordering_lm1b',
               'ordering_violation'):
    _check_png(pictures / f'{name}.png')
  out = _stdout(nb)
  # Appendix D's remark: on LM1B's T = 256 grid λ_0 > λ_1 exactly on the 64 steps with t <= δ_1.
  assert 'steps with λ_0 > λ_1: 64 (all with t_n <= δ_1: True)' in out
  assert '15 violating steps' in out  # ω = (2, 1), T = 16: every step but n = 1
  assert _num_images(nb) == 5


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_checkpoint_explorer(workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
  nb = _run('checkpoint_explorer.ipynb', workdir, monkeypatch)
  pictures = workdir / 'pictures'
  for name in ('explorer_sudoku_0', 'explorer_sudoku_1', 'explorer_sudoku_decodings',
               'explorer_text_reveal'):
    _check_png(pictures / f'{name}.png')
  ppl = json.loads((workdir / 'sentences_perplexity.json').read_text())['perplexity']
  assert ppl['num_sequences'] == 3  # the notebook's three sentences
  assert np.isfinite(ppl['bound_nats_per_token']) and ppl['ppl'] > 1.0
  assert 'bound' in _stdout(nb)
