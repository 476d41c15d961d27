"""Writes the three Colab notebooks of colabs/ from the cells in colabs/cells_*.py (nbformat v4).

Run `python colabs/make_notebooks.py` after editing a cell; the notebooks are generated, never edited
by hand, so that they stay reproducible and reviewable as plain Python. `--check` exits non-zero when
a notebook on disk differs from what this script would write (CI / tests).

Every notebook
  * finds the repository root (the working directory or one of its parents) and works there, so
    that the kernel imports this checkout (no sys.path changes);
  * skips `pip install -e .` when the requirements are installed in pyproject.toml's ranges, and
    always under the test (HMDLM_NOTEBOOK_TEST=1), which also selects the smallest settings;
  * writes its pictures and checkpoints under WORKDIR = $HMDLM_NOTEBOOK_WORKDIR (default
    /tmp/hmdlm_colabs), so tests/test_notebooks.py can check them;
  * runs on a CPU runtime offline with its default settings, and on a Colab GPU/TPU runtime after a
    one-line change (QUICK = False / CONFIG = ...; ACCELERATOR picks the jax wheel to install).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbformat import v4

# The cell sources, one module per notebook (colabs/, the script's folder, is where Python looks
# first: this is run as a script, `python colabs/make_notebooks.py`).
import cells_checkpoints
import cells_quickstart
import cells_schedules

HERE = pathlib.Path(__file__).resolve().parent

KERNEL = {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}


def _cells(spec: list[tuple[str, str]]) -> list[nbformat.NotebookNode]:
  return [v4.new_markdown_cell(src) if kind == 'md' else v4.new_code_cell(src)
          for kind, src in spec]


def build(spec: list[tuple[str, str]]) -> nbformat.NotebookNode:
  nb = v4.new_notebook(cells=_cells(spec))
  nb.metadata['kernelspec'] = KERNEL
  nb.metadata['language_info'] = {'name': 'python'}
  nb.metadata['colab'] = {'provenance': []}
  # Stable cell ids: the notebooks must be byte-identical on every run of this script.
  for i, cell in enumerate(nb.cells):
    cell['id'] = f'cell-{i:02d}'
  return nb


NOTEBOOKS = {
    'quickstart.ipynb': cells_quickstart.QUICKSTART,
    'schedules_explorer.ipynb': cells_schedules.SCHEDULES,
    'checkpoint_explorer.ipynb': cells_checkpoints.CHECKPOINTS,
}


def render(spec: list[tuple[str, str]]) -> str:
  return nbformat.writes(build(spec)) + '\n'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true', help='fail if a notebook is out of date')
  args = parser.parse_args(argv)
  stale = []
  for name, spec in NOTEBOOKS.items():
    path = HERE / name
    text = render(spec)
    nbformat.validate(nbformat.reads(text, as_version=4))
    if args.check:
      if not path.exists() or path.read_text() != text:
        stale.append(name)
    else:
      path.write_text(text)
      print('wrote', path)
  if stale:
    print('out of date (run python colabs/make_notebooks.py):', ', '.join(stale))
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
