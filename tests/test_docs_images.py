"""The README's reveal picture is what the current drawing code makes of its committed solve.

docs/images/sudoku_reveal.json is the demo's solve of one test puzzle, written beside the picture
by colabs/make_docs_images.py; redrawing it with that script's `draw_reveal` must give the
committed PNG pixel for pixel, so a change to the drawing code that leaves the README's picture
stale fails here (rerun `python colabs/make_docs_images.py --workdir=RUN --minutes=0`).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGES = ROOT / 'docs' / 'images'


def _script():
  spec = importlib.util.spec_from_file_location('make_docs_images',
                                                ROOT / 'colabs' / 'make_docs_images.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _pixels(path: pathlib.Path) -> np.ndarray:
  with Image.open(path) as im:
    return np.asarray(im.convert('RGBA'))


def test_the_readme_picture_is_redrawn_from_its_record(tmp_path):
  assert '](docs/images/sudoku_reveal.png)' in (ROOT / 'README.md').read_text(encoding='utf-8')
  record = json.loads((IMAGES / 'sudoku_reveal.json').read_text(encoding='utf-8'))
  wrong = _script().draw_reveal(record, tmp_path)
  assert wrong == sum(t + 1 != s for t, s in zip(record['tokens'], record['solution']))
  drawn, committed = _pixels(tmp_path / 'sudoku_reveal.png'), _pixels(IMAGES / 'sudoku_reveal.png')
  assert drawn.shape == committed.shape
  assert np.array_equal(drawn, committed), 'docs/images/sudoku_reveal.png is stale: redraw it'
  # The record is a real solve of its puzzle: givens kept, every cell revealed once.
  quiz = [int(c) if c.isdigit() else 0 for c in record['quiz']]
  assert all(q == 0 or t + 1 == q for q, t in zip(quiz, record['tokens']))
  assert len(record['reveal_step']) == 81 and len(record['levels']) == 81
