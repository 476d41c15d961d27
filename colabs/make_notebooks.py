"""Writes the three Colab notebooks of colabs/ from the cells in colabs/cells_*.py (nbformat v4).

Run `python colabs/make_notebooks.py` after editing a cell; the notebooks are generated, never edited
by hand, so that they stay reproducible and reviewable as plain Python. `--check` exits non-zero when
a notebook on disk differs from what this script would write (CI / tests).

Every notebook
  * opens with an "Open in Colab" badge (REPO_URL: pyproject.toml's project.urls, else
    PLACEHOLDER_URL) and a `parameters`-tagged cell of its knobs (papermill -p NAME VALUE);
  * finds the repository root (the working directory, a parent, or a clone it makes of REPO_URL)
    and works there, so that the kernel imports this checkout (no sys.path changes);
  * skips `pip install -e .` when the requirements are installed in pyproject.toml's ranges, and
    always under the test (HMDLM_NOTEBOOK_TEST=1), which also selects the smallest settings;
  * writes its pictures and checkpoints under WORKDIR (default $HMDLM_NOTEBOOK_WORKDIR or
    /tmp/hmdlm_colabs), so tests/test_notebooks.py can check them;
  * runs on a CPU runtime offline with its default settings, and on a Colab GPU/TPU runtime after a
    one-line change (QUICK = False / CONFIG = ...; ACCELERATOR picks the jax wheel to install).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tomllib

import nbformat
from nbformat import v4

# The cell sources, one module per notebook (colabs/, the script's folder, is where Python looks
# first: this is run as a script, `python colabs/make_notebooks.py`).
import cells_checkpoints
import cells_quickstart
import cells_schedules

HERE = pathlib.Path(__file__).resolve().parent

KERNEL = {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}
# The repository the badges open and the notebooks clone while pyproject.toml names none
# ([project.urls] Repository / Source / Homepage): replace it with the public GitHub URL.
PLACEHOLDER_URL = 'https://github.com/YOUR-ORG/hmdlm_jax'
BRANCH = 'main'
BADGE = 'https://colab.research.google.com/assets/colab-badge.svg'


def repo_url() -> str:
  urls = tomllib.loads((HERE.parent / 'pyproject.toml').read_text())['project'].get('urls', {})
  for key in ('Repository', 'Source', 'Homepage'):
    if key in urls:
      return urls[key].removesuffix('.git').rstrip('/')
  return PLACEHOLDER_URL


def badge(name: str) -> str:
  """The "Open in Colab" markdown of colabs/`name` in the repository's GitHub `BRANCH`."""
  path = re.sub(r'^https://github\.com/', '', repo_url())
  return (f'[![Open In Colab]({BADGE})](https://colab.research.google.com/github/{path}/blob/'
          f'{BRANCH}/colabs/{name})')


def _cell(kind: str, src: str) -> nbformat.NotebookNode:
  if kind == 'md':
    return v4.new_markdown_cell(src)
  if kind == 'parameters':  # papermill injects its -p values right after this cell
    return v4.new_code_cell(src.replace('@REPO_URL@', repo_url()),
                            metadata={'tags': ['parameters']})
  return v4.new_code_cell(src)


def build(spec: list[tuple[str, str]], name: str) -> nbformat.NotebookNode:
  nb = v4.new_notebook(cells=[v4.new_markdown_cell(badge(name))]
                       + [_cell(kind, src) for kind, src in spec])
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


def render(spec: list[tuple[str, str]], name: str) -> str:
  return nbformat.writes(build(spec, name)) + '\n'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true', help='fail if a notebook is out of date')
  args = parser.parse_args(argv)
  stale = []
  for name, spec in NOTEBOOKS.items():
    path = HERE / name
    text = render(spec, name)
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
