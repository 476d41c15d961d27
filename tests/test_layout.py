"""The package's layout rules (docs/design.md), checked on the source itself.

* The import graph of hmdlm_jax (every import, module level or not, read with `ast`) has no cycle.
* No module of hmdlm_jax is over 500 lines.
* Imports inside functions are for optional heavy dependencies only, never for hmdlm_jax or configs.
* Every configs/*.py sets only fields that configs/base.py lists (base.py is the schema).
* Nothing in the repository cites the specification file of another repository: the method and
  our decisions are stated in docs/method.md.
* Package code states intent, not history: every module docstring of hmdlm_jax is at most 15
  lines (the detail lives in docs/method.md and docs/design.md), and no package file holds a date,
  an "item N" reference to a results page, or the name of the old results page.
* No Python file or notebook of the repository changes sys.path: scripts and benchmarks
  run as modules from the repository root (`python -m scripts.NAME`), their children get `cwd` and
  PYTHONPATH, the notebooks work in the repository root.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import ml_collections
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'hmdlm_jax'
MAX_LINES = 500


def _module_name(path: pathlib.Path) -> str:
  rel = path.relative_to(ROOT).with_suffix('')
  parts = list(rel.parts)
  if parts[-1] == '__init__':
    parts.pop()
  return '.'.join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}


def _imports(path: pathlib.Path, name: str) -> list[tuple[str, bool]]:
  """(imported module, at module level?) for every import of `path`.

  `from pkg import sub` imports the module pkg.sub when that is a module, else pkg.
  """
  mods = _modules()
  tree = ast.parse(path.read_text(encoding='utf-8'))
  top = set(id(n) for n in tree.body)
  package = name if path.name == '__init__.py' else name.rpartition('.')[0]
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        base = '.'.join(package.split('.')[:len(package.split('.')) - node.level + 1] +
                        ([base] if base else []))
      names = [f'{base}.{a.name}' if f'{base}.{a.name}' in mods else base for a in node.names]
    else:
      continue
    for n in names:
      out.append((n, id(node) in top))
  return out


def _graph() -> dict[str, set[str]]:
  mods = _modules()
  graph: dict[str, set[str]] = {m: set() for m in mods}
  for name, path in mods.items():
    for imported, _ in _imports(path, name):
      if imported in mods and imported != name:
        graph[name].add(imported)
  return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_cycle_finder_finds_a_cycle():
  assert _find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert _find_cycle({'a': {'b'}, 'b': set()}) is None


def test_import_graph_has_no_cycle():
  cycle = _find_cycle(_graph())
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_no_module_over_500_lines():
  long = {n: len(p.read_text(encoding='utf-8').splitlines()) for n, p in _modules().items()}
  long = {n: k for n, k in long.items() if k > MAX_LINES}
  assert not long, f'modules over {MAX_LINES} lines: {long}'


def test_no_function_level_imports_of_the_package():
  bad = []
  for name, path in _modules().items():
    for imported, at_top in _imports(path, name):
      if not at_top and imported.split('.')[0] in ('hmdlm_jax', 'configs'):
        bad.append(f'{name} imports {imported} inside a function')
  assert not bad, '\n'.join(sorted(set(bad)))


def _keys(c: ml_collections.ConfigDict, prefix: str = '') -> set[str]:
  out = set()
  for k, v in c.items():
    if isinstance(v, ml_collections.ConfigDict):
      out |= _keys(v, f'{prefix}{k}.')
    else:
      out.add(prefix + k)
  return out


CONFIGS = sorted(p.stem for p in (ROOT / 'configs').glob('*.py')
                 if p.stem not in ('__init__', 'base'))


@pytest.mark.parametrize('name', CONFIGS)
def test_configs_only_set_fields_of_the_schema(name):
  from hmdlm_jax.configs import base  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f'configs.{name}').get_config()
  extra = _keys(config) - _keys(base.get_base_config())
  assert not extra, f'configs/{name}.py sets fields configs/base.py does not list: {sorted(extra)}'


def test_no_citation_of_an_external_specification():
  offenders = []
  for path in ROOT.rglob('*'):
    if (not path.is_file() or any(part.startswith('.') for part in path.relative_to(ROOT).parts)
        or path.suffix not in ('.py', '.md', '.ipynb', '.sh', '.toml', '.txt')):
      continue
    text = path.read_text(encoding='utf-8', errors='replace')
    for needle in ('SPEC ', 'SPEC.md', '../shared'):
      if needle in text and path.name != 'test_layout.py':
        offenders.append(f'{path.relative_to(ROOT)}: {needle!r}')
  assert not offenders, '\n'.join(offenders)


MAX_DOCSTRING_LINES = 15
# A date, an "item N" / "items N" reference (to the numbered items of a results page), or the name
# of the old results page: history that belongs in docs/, not in the package.
_HISTORY = re.compile(r'20\d\d-\d\d-\d\d|(?i:\bitems? \d+)|hierarchy_results')


def _checked_package_files() -> list[pathlib.Path]:
  return sorted(PACKAGE.rglob('*.py'))


def _docstring_lines(source: str) -> int:
  """Lines of the module docstring, from the opening to the closing quotes (0 without one)."""
  body = ast.parse(source).body
  if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
      and isinstance(body[0].value.value, str)):
    return body[0].end_lineno - body[0].lineno + 1
  return 0


def _history_marks(source: str) -> list[str]:
  """'line N: match' for every date, item reference or old results page name in `source`."""
  return [f'line {i}: {m.group(0)!r}' for i, line in enumerate(source.splitlines(), 1)
          for m in _HISTORY.finditer(line)]


def test_the_intent_checks_catch_a_bad_source():
  assert _docstring_lines('"""One line."""\nx = 1\n') == 1
  assert _docstring_lines('x = 1\n') == 0
  assert _docstring_lines('"""' + '\n' * MAX_DOCSTRING_LINES + '"""\n') == MAX_DOCSTRING_LINES + 1
  assert _history_marks('# measured 2026-12-05, see item 17\n') == [
      "line 1: '2026-12-05'", "line 1: 'item 17'"]
  assert _history_marks('"""items 34-35 of docs/hierarchy_results.md."""') == [
      "line 1: 'items 34'", "line 1: 'hierarchy_results'"]
  assert _history_marks('x = 1\n# Item 3 of issue 14.\n') == ["line 2: 'Item 3'"]
  assert not _history_marks('"""Items of a batch; 20 items; see docs/results/sudoku.md."""')


def test_module_docstrings_are_short():
  # An experiment file's docstring is its user's page (command, expected result, design), so the
  # configs are exempt; tests/test_docs.py checks they state their expected result.
  long = {p.relative_to(ROOT).as_posix(): n for p in _checked_package_files()
          if p.parent.name != 'configs' and (n := _docstring_lines(p.read_text(encoding='utf-8'))) > MAX_DOCSTRING_LINES}
  assert not long, (f'module docstrings over {MAX_DOCSTRING_LINES} lines (state the intent and '
                    f'point to docs/method.md §n for the detail): {long}')


def test_package_code_holds_no_history():
  bad = [f'{p.relative_to(ROOT).as_posix()} {mark}' for p in _checked_package_files()
         for mark in _history_marks(p.read_text(encoding='utf-8'))]
  assert not bad, ('dates, item references or docs/hierarchy_results.md in package code (say the '
                   'reason and point to docs/method.md or docs/results/sudoku.md):\n'
                   + '\n'.join(bad))


# Written in pieces so that this file does not match itself.
SYS_PATH_EDITS = tuple('sys.path' + tail for tail in ('.insert', '.append', '['))
SKIPPED_DIRS = ('venv', 'site-packages', 'node_modules', 'build', 'dist', '__pycache__')


def _sys_path_edits(root: pathlib.Path) -> list[str]:
  """'file:line: text' of every line of a .py file or notebook under `root` that changes
  sys.path (hidden folders such as .git, and virtual environments, left out)."""
  found = []
  for path in sorted(root.rglob('*')):
    rel = path.relative_to(root)
    if (path.suffix not in ('.py', '.ipynb') or not path.is_file()
        or any(p.startswith('.') or p in SKIPPED_DIRS or p.endswith('venv') for p in rel.parts)):
      continue
    for n, line in enumerate(path.read_text(encoding='utf-8', errors='replace').splitlines(), 1):
      if any(needle in line for needle in SYS_PATH_EDITS):
        found.append(f'{rel}:{n}: {line.strip()}')
  return found


def test_sys_path_finder_finds_an_edit(tmp_path):
  (tmp_path / 'pkg').mkdir()
  (tmp_path / 'pkg' / 'bad.py').write_text('import sys\n' + SYS_PATH_EDITS[0] + "(0, '..')\n")
  (tmp_path / 'nb.ipynb').write_text('{"source": ["' + SYS_PATH_EDITS[2] + ':0] = []"]}')
  (tmp_path / 'ok.py').write_text('import sys\nprint(sys.path)\n')
  (tmp_path / '.venv').mkdir()
  (tmp_path / '.venv' / 'site.py').write_text(SYS_PATH_EDITS[1] + "('x')\n")
  assert [f.split(':')[0] for f in _sys_path_edits(tmp_path)] == ['nb.ipynb', 'pkg/bad.py']


def test_nothing_changes_sys_path():
  found = _sys_path_edits(ROOT)
  assert not found, ('sys.path is changed (run tools as `python -m scripts.NAME` from the '
                     'repository root; give a child process cwd / PYTHONPATH):\n' + '\n'.join(found))


MAX_CALL_LINES = 40


def test_backbone_call_is_short():
  """The generic backbone's __call__ delegates (embedding, trunk, pathway, heads): at most
  MAX_CALL_LINES lines, so an experiment's options cannot grow it again."""
  tree = ast.parse((PACKAGE / 'models' / 'hierarchy.py').read_text(encoding='utf-8'))
  found = [f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == 'HierarchicalBackbone'
           for f in c.body if isinstance(f, ast.FunctionDef) and f.name == '__call__']
  assert len(found) == 1
  call = found[0]
  first = min([call.lineno] + [d.lineno for d in call.decorator_list])
  assert call.end_lineno - first + 1 <= MAX_CALL_LINES, call.end_lineno - first + 1


def test_no_task_named_in_models_or_processes():
  hits = [p.relative_to(ROOT).as_posix() for d in ('models', 'processes')
          for p in sorted((PACKAGE / d).rglob('*.py'))
          if 'sudoku' in p.read_text(encoding='utf-8').lower()]
  assert not hits, f'task-specific code belongs to its task (models/features.py seam): {hits}'


# The registries' rules: processes/__init__.py is the only place that branches on
# `config.process.kind`, tasks/__init__.py the only one that branches on the task
# (docs/extending.md). A kind's behaviour is a method or an attribute of its object (a Process, a
# Task, a row of config/kinds.py's table), never a comparison of its name elsewhere.


def _literals(node: ast.AST) -> set[str]:
  """The strings of a literal or of a tuple / list / set of literals (else none)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return {node.value}
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return set().union(*(_literals(e) for e in node.elts)) if node.elts else set()
  return set()


def _names_a_kind(node: ast.AST) -> bool:
  """`kind` or `<anything>.kind`: the expression a kind's name is read from."""
  return ((isinstance(node, ast.Name) and node.id == 'kind')
          or (isinstance(node, ast.Attribute) and node.attr == 'kind'))


def _kind_branches(source: str, field: str, kinds: set[str], classes: set[str] = frozenset()
                   ) -> list[str]:
  """'line N: code' for each branch of `source` on the kind `field` names ('process.kind',
  'data.kind'): a comparison, membership test or match of an expression ending in `field`, or of
  a literal naming one of `kinds` against a `kind`; and `isinstance(x, C)` for C in `classes`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
    elif isinstance(node, ast.Match):
      operands = [node.subject, *(p for c in node.cases for p in ast.walk(c.pattern)
                                  if isinstance(p, ast.MatchValue))]
      operands = [o.value if isinstance(o, ast.MatchValue) else o for o in operands]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id == 'isinstance' and len(node.args) == 2):
      hit = {n.attr if isinstance(n, ast.Attribute) else getattr(n, 'id', '')
             for n in ast.walk(node.args[1])} & classes
      if hit:
        found.append(f'line {node.lineno}: {ast.unparse(node)}')
      continue
    else:
      continue
    on_field = any(ast.unparse(o).endswith(field) for o in operands)
    on_name = (any(_names_a_kind(o) for o in operands)
               and any(_literals(o) & kinds for o in operands))
    if on_field or on_name:
      found.append(f'line {node.lineno}: {ast.unparse(node)}')
  return found


def _branches_outside(folder: str, field: str, kinds: set[str], classes: set[str] = frozenset()
                      ) -> list[str]:
  return [f'{p.relative_to(ROOT).as_posix()} {hit}' for p in _checked_package_files()
          if p.relative_to(PACKAGE).parts[0] != folder
          for hit in _kind_branches(p.read_text(encoding='utf-8'), field, kinds, classes)]


def _task_classes() -> set[str]:
  from hmdlm_jax import tasks  # pylint: disable=g-import-not-at-top
  return {c.__name__ for t in tasks.TASKS.values() for c in type(t).__mro__
          if issubclass(c, tasks.base.Task)}


def test_the_kind_scan_finds_a_branch():
  kinds = {'hdlm', 'mdlm'}
  assert _kind_branches("if config.process.kind == 'hdlm':\n  pass\n", 'process.kind', kinds)
  assert _kind_branches("x = self.config.process.kind != 'adlm'\n", 'process.kind', kinds)
  assert _kind_branches("kind = c.process.kind\nok = kind in ('mdlm', 'x')\n", 'process.kind',
                        kinds) == ["line 2: kind in ('mdlm', 'x')"]
  assert _kind_branches('match config.process.kind:\n  case _:\n    pass\n', 'process.kind',
                        kinds)
  assert _kind_branches("match p.kind:\n  case 'hdlm':\n    pass\n", 'process.kind', kinds)
  assert _kind_branches("if config.data.kind in TEXT:\n  pass\n", 'data.kind', set())
  assert _kind_branches('ok = isinstance(task, text.TextTask)\n', 'data.kind', set(),
                        {'TextTask'}) == ['line 1: isinstance(task, text.TextTask)']
  assert not _kind_branches("if s.kind == 'loglinear' or arg == 'mdlm':\n  pass\n",
                            'process.kind', kinds)
  assert not _kind_branches('rules = RULES[config.process.kind]\n', 'process.kind', kinds)


def _process_classes() -> set[str]:
  from hmdlm_jax import processes  # pylint: disable=g-import-not-at-top
  found, todo = set(), [processes.Process]
  while todo:
    cls = todo.pop()
    found.add(cls.__name__)
    todo.extend(cls.__subclasses__())
  return found


def test_only_the_process_registry_branches_on_the_process_kind():
  from hmdlm_jax import processes  # pylint: disable=g-import-not-at-top
  bad = _branches_outside('processes', 'process.kind', set(processes.BUILDERS),
                          _process_classes())
  assert not bad, ('a branch on the process (config.process.kind, a kind name or a Process class) '
                   'outside hmdlm_jax/processes/ (make it a method or attribute of the Process, '
                   'or a row of config/kinds.py):\n' + '\n'.join(bad))


def test_only_the_task_registry_branches_on_the_task():
  from hmdlm_jax import tasks  # pylint: disable=g-import-not-at-top
  bad = _branches_outside('tasks', 'data.kind', set(tasks.TASKS), _task_classes())
  assert not bad, ('a branch on the task (config.data.kind, a task name or class) outside '
                   'hmdlm_jax/tasks/ (make it a method of the Task, tasks/base.py):\n'
                   + '\n'.join(bad))


def test_the_process_chooses_the_heads_of_pass_1():
  """Which heads pass 1 reads is the process's decision (processes/); models/ only builds them."""
  hier = (PACKAGE / 'models' / 'hierarchy.py').read_text(encoding='utf-8')
  defined = {n.name for n in ast.parse(hier).body if isinstance(n, ast.FunctionDef)}
  assert 'pass1_heads' not in defined, 'pass1_heads belongs to processes/'
  hmdlm = (PACKAGE / 'processes' / 'hmdlm.py').read_text(encoding='utf-8')
  assert 'pass1_heads' in {n.name for n in ast.parse(hmdlm).body if isinstance(n, ast.FunctionDef)}
  bad = [name for name, path in _modules().items() if name.startswith('hmdlm_jax.processes')
         for imported, _ in _imports(path, name) if imported == 'hmdlm_jax.models.hierarchy']
  assert not bad, f'processes/ reaches into the backbone (models/hierarchy.py): {bad}'
