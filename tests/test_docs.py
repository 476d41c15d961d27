"""The documentation's own rules (issue 51), checked on the files themselves.

* README.md is short (at most 150 lines) and holds the exact test command that .ci/run runs.
* Every relative markdown link in README.md, docs/**/*.md and benchmarks/*.md points to a file or
  folder that exists, and an anchor into a markdown file to one of its headings.
* The README's configs table names every experiment config.
* Every experiment config's module docstring is at most 15 lines and states its expected result
  on a line that starts with "Expected".
* README.md and the current result pages (docs/results/*.md) carry no dates: dated history lives in
  docs/experiments/ and benchmarks/LOG.md.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
MAX_README_LINES = 150
MAX_DOCSTRING_LINES = 15
DATE = re.compile(r'\b20\d\d-\d\d-\d\d\b')  # a day, as the logs write it
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
CONFIGS = sorted(p for p in (ROOT / 'configs').glob('*.py') if p.stem not in ('__init__', 'base'))
MARKDOWN = ([README] + sorted((ROOT / 'docs').rglob('*.md'))
            + sorted((ROOT / 'benchmarks').glob('*.md')))


def _ci_command() -> str:
  lines = [l for l in (ROOT / '.ci' / 'run').read_text(encoding='utf-8').splitlines() if l.strip()]
  return lines[-1].strip()


def _links(text: str) -> list[str]:
  """Relative link targets (with their anchors) of a markdown text, code left out."""
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  text = re.sub(r'`[^`\n]*`', '', text)
  return [t for t in LINK.findall(text)
          if not re.match(r'^[a-z][a-z0-9+.-]*:', t) and not t.startswith('#')]


def _anchors(text: str) -> set[str]:
  """GitHub's anchors of a markdown text's headings: lower case, punctuation dropped, ' ' -> '-'."""
  text = re.sub(r'```.*?```', '', text, flags=re.S)
  heads = re.findall(r'^#{1,6}\s+(.*?)\s*$', text, flags=re.M)
  return {re.sub(r'[^\w\- ]', '', h.lower()).replace(' ', '-') for h in heads}


def test_link_finder_finds_relative_links_only():
  text = ('[a](docs/a.md) ![b](img/b.png "title") [c](https://x.org) [d](#anchor) '
          '[e](../f.md#sec) `[g](not/a/link.md)`\n```\n[h](nor/this.md)\n```\n')
  assert _links(text) == ['docs/a.md', 'img/b.png', '../f.md#sec']
  assert _anchors('# Multi-device, multi-host\n## "pmap" and `pjit`\n') == {
      'multi-device-multi-host', 'pmap-and-pjit'}


def test_readme_is_short():
  n = len(README.read_text(encoding='utf-8').splitlines())
  assert n <= MAX_README_LINES, f'README.md has {n} lines (at most {MAX_README_LINES})'


def test_readme_holds_the_ci_test_command():
  command = _ci_command()
  assert 'pytest' in command, f'.ci/run no longer ends with the test command: {command!r}'
  assert command in README.read_text(encoding='utf-8'), (
      f'README.md does not contain the command .ci/run runs:\n{command}')


@pytest.mark.parametrize('path', MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(path):
  missing = []
  for link in _links(path.read_text(encoding='utf-8')):
    target, _, anchor = link.partition('#')
    file = path.parent / target
    if not file.exists():
      missing.append(link)
    elif anchor and file.suffix == '.md':
      if anchor not in _anchors(file.read_text(encoding='utf-8')):
        missing.append(link)
  assert not missing, f'{path.relative_to(ROOT)} links to missing files or headings: {missing}'


def test_readme_lists_every_config():
  text = README.read_text(encoding='utf-8')
  absent = [p.name for p in CONFIGS if f'`configs/{p.name}' not in text]
  assert not absent, f"README.md's configs table lacks {absent}"


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.name)
def test_config_docstring_is_short_and_states_the_expected_result(path):
  doc = ast.get_docstring(ast.parse(path.read_text(encoding='utf-8')), clean=False)
  assert doc, f'configs/{path.name} has no module docstring'
  lines = doc.strip('\n').splitlines()
  assert len(lines) <= MAX_DOCSTRING_LINES, (
      f'configs/{path.name}: docstring of {len(lines)} lines (at most {MAX_DOCSTRING_LINES}); '
      'move the rationale to docs/results/')
  assert any(l.startswith('Expected') for l in lines), (
      f'configs/{path.name}: no line starting with "Expected" (its expected result, or that it '
      'was not measured)')


@pytest.mark.parametrize('path', [README] + sorted((ROOT / 'docs' / 'results').glob('*.md')),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_current_pages_carry_no_dates(path):
  dates = DATE.findall(path.read_text(encoding='utf-8'))
  assert not dates, (f'{path.relative_to(ROOT)} mentions {sorted(set(dates))}: dated history '
                     'belongs in docs/experiments/ or benchmarks/LOG.md')
