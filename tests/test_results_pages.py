"""docs/results/*.md: every generated table equals its regeneration from the committed JSON.

`python -m benchmarks.results_pages` rewrites the blocks between `<!-- generated: NAME -->` and
`<!-- end -->`; these tests fail when a page's table and its JSON disagree (issue 69), and show
on a copy of the folder that a changed figure, in the page or in the JSON, is caught.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest

from benchmarks import results_pages as rp


@pytest.fixture(scope='module')
def load():
  return rp.loader(rp.RESULTS)


@pytest.mark.parametrize('page', sorted(rp.PAGES))
def test_generated_tables_match_their_json(page, load):
  text = (rp.RESULTS / page).read_text(encoding='utf-8')
  assert rp.render(page, text, load) == text, (
      f'docs/results/{page}: a generated table differs from its JSON; run '
      '`python -m benchmarks.results_pages` and check the prose that quotes it')


def test_every_page_with_markers_is_registered():
  for path in sorted(rp.RESULTS.glob('*.md')):
    found = rp.BLOCK.findall(path.read_text(encoding='utf-8'))
    assert not found or path.name in rp.PAGES, f'{path.name} has blocks no generator knows'


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
  folder = tmp_path / 'results'
  shutil.copytree(rp.RESULTS, folder)
  return folder


def test_a_changed_figure_in_a_page_is_caught(tmp_path):
  folder = _copy(tmp_path)
  page = folder / 'baselines.md'
  text = page.read_text(encoding='utf-8')
  edited = text.replace('| MGDM | wall time | 1,450 | 58.7 ± 2.0 |',
                        '| MGDM | wall time | 1,450 | 58.9 ± 2.0 |')
  assert edited != text, 'the figure this test edits is no longer on the page'
  page.write_text(edited, encoding='utf-8')
  assert rp.stale(folder) == ['baselines.md']
  assert rp.main(['--check', f'--dir={folder}']) == 1
  assert rp.main([f'--dir={folder}']) == 0          # rewriting restores the JSON's figure
  assert page.read_text(encoding='utf-8') == text
  assert rp.stale(folder) == []


def test_a_changed_figure_in_the_json_is_caught(tmp_path):
  folder = _copy(tmp_path)
  path = folder / 'baselines_text.json'
  data = json.loads(path.read_text(encoding='utf-8'))
  data['hmdlm']['per_seed']['0']['bound_nats_per_token'] += 0.01
  path.write_text(json.dumps(data), encoding='utf-8')
  assert rp.stale(folder) == ['baselines.md']


def test_a_block_without_a_generator_or_a_missing_block_is_an_error(load):
  text = (rp.RESULTS / 'text.md').read_text(encoding='utf-8')
  with pytest.raises(ValueError, match='unknown'):
    rp.render('text.md', text + '\n<!-- generated: nonesuch -->\n<!-- end -->\n', load)
  stripped = re.sub(r'<!-- generated: text-variants -->\n.*?<!-- end -->', '', text, flags=re.S)
  with pytest.raises(ValueError, match='missing'):
    rp.render('text.md', stripped, load)


@pytest.mark.parametrize('page', sorted(rp.PAGES))
def test_pages_say_which_commit_their_runs_came_from(page):
  blocks = ''.join(m.group(3) for m in rp.BLOCK.finditer(
      (rp.RESULTS / page).read_text(encoding='utf-8')))
  assert 'commit' in blocks, f'{page}: no generated block names the commit of its runs'
