"""The tables of docs/results/*.md, generated from the raw JSON committed beside them.

  python -m benchmarks.results_pages [--check] [--dir=docs/results]

Each page marks its generated blocks `<!-- generated: NAME -->` … `<!-- end -->`; this rewrites
every block from its JSON (statistics: benchmarks/stats.py), or with --check only lists the blocks
whose committed text differs and exits 1. tests/test_results_pages.py runs the check. Text outside
the markers is prose, written by hand; a figure it quotes must be one a block shows.
performance.md's TPU table has its own generator (`python -m benchmarks.aot --table`).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys
import textwrap
from typing import Any, Callable, Sequence

from benchmarks import stats

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'docs' / 'results'
BLOCK = re.compile(r'(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end -->)', re.S)
SEEDS = ('0', '1', '2')
Load = Callable[[str], Any]

# ------------------------------------------------------------------------------- formatting


def pm(r: stats.MeanSE, digits: int, sign: bool = False) -> str:
  """'m ± se' ('m' alone without a s.e.); `sign` writes '+' before positive means."""
  m = f'{r.mean:+.{digits}f}' if sign else f'{r.mean:.{digits}f}'
  m = m.replace('-', '−')
  return m if r.se is None else f'{m} ± {r.se:.{digits}f}'


def seeds(values: Sequence[float], digits: int, sign: bool = False) -> str:
  f = (lambda v: f'{v:+.{digits}f}') if sign else (lambda v: f'{v:.{digits}f}')
  return ' / '.join(f(v).replace('-', '−') for v in values)


def prose(text: str) -> list[str]:
  """A generated sentence, wrapped at 100 characters as the pages' prose is."""
  return textwrap.wrap(text, 100, break_long_words=False, break_on_hyphens=False)


def row(*cells: Any) -> str:
  return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def head(*cells: str) -> list[str]:
  return [row(*cells), '|' + '---|' * len(cells)]


# ---------------------------------------------------------------------- Sudoku: MGDM, MDLM

SUDOKU_KEYS = ('greedy_solve', 'greedy_cells', 'stochastic_solve', 'stochastic_cells')
SUDOKU_FILES = (('wall time', 'baselines_sudoku_wall.json'), ('FLOPs', 'baselines_sudoku.json'))
SUDOKU_PAIRS = (('hmdlm', 'twin'), ('hmdlm', 'mgdm'), ('mgdm', 'twin'))
SUDOKU_NAMES = {'hmdlm': 'HMDLM', 'twin': 'MDLM twin', 'mgdm': 'MGDM'}


def _sudoku(load: Load) -> list[tuple[str, dict[str, Any]]]:
  out = [(budget, load(name)) for budget, name in SUDOKU_FILES]
  first = out[0][1]['runs']['hmdlm']
  for _, j in out[1:]:
    if j['runs']['hmdlm'] != first:
      raise ValueError('the Sudoku baselines files hold different HMDLM runs')
  return out


def _pct(j: dict[str, Any], model: str, key: str) -> list[float]:
  return [100 * j['runs'][model][s][key] for s in _sudoku_seeds(j)]


def _sudoku_seeds(j: dict[str, Any]) -> list[str]:
  have = [set(j['runs'][m]) for m in SUDOKU_NAMES]
  return sorted(set.intersection(*have), key=int)


def baselines_sudoku(load: Load) -> list[str]:
  files = _sudoku(load)
  lines = head('model', 'budget', 'steps', 'solved, greedy', 'cells, greedy',
               'solved, stochastic', 'cells, stochastic')
  j0 = files[0][1]
  lines.append(row('HMDLM', '', f'{j0["hmdlm_steps"]:,}',
                   *(pm(stats.mean_se(_pct(j0, 'hmdlm', k)), 1) for k in SUDOKU_KEYS)))
  for budget, j in files:
    for m in ('twin', 'mgdm'):
      lines.append(row(SUDOKU_NAMES[m], budget, f'{j["twin_steps"]:,}',
                       *(pm(stats.mean_se(_pct(j, m, k)), 1) for k in SUDOKU_KEYS)))
    for a, b in SUDOKU_PAIRS:
      cells = [pm(stats.paired(_pct(j, a, k), _pct(j, b, k)).diff, 1, sign=True)
               for k in SUDOKU_KEYS]
      lines.append(row(f'{SUDOKU_NAMES[a]} − {SUDOKU_NAMES[b].split()[0]} (paired)', budget, '',
                       *cells))
  return lines


def baselines_sudoku_tests(load: Load) -> list[str]:
  lines = head('paired difference', 'budget', 'solved, greedy', 'cells, greedy',
               'solved, stochastic', 'cells, stochastic')
  for budget, j in _sudoku(load):
    for a, b in SUDOKU_PAIRS:
      cells = [stats.t_cell(stats.paired(_pct(j, a, k), _pct(j, b, k))) for k in SUDOKU_KEYS]
      lines.append(row(f'{SUDOKU_NAMES[a]} − {SUDOKU_NAMES[b].split()[0]}', budget, *cells))
  return lines


def baselines_sudoku_seeds(load: Load) -> list[str]:
  files = _sudoku(load)
  j0 = files[0][1]
  parts = [f'HMDLM {seeds(_pct(j0, "hmdlm", "greedy_solve"), 1)}']
  for budget, j in files:
    parts.append(f'at equal {budget} MDLM {seeds(_pct(j, "twin", "greedy_solve"), 1)} and MGDM '
                 f'{seeds(_pct(j, "mgdm", "greedy_solve"), 1)}')
  added = {'wall time': '87a9cf8', 'FLOPs': 'bdc2fb7'}
  src = '; '.join(f'[{name}]({name}) (equal {b}; committed in {added[b]})'
                  for b, name in SUDOKU_FILES)
  return prose(f'Per seed {" / ".join(_sudoku_seeds(j0))}, greedy solved: ' + '; '.join(parts)
               + f'. Raw: {src}. Neither file records the commit its runs were made at; each '
               'holds its `commands`.')


# --------------------------------------------------------------------------- text bounds

TEXT_MODELS = (('mdlm', 'MDLM'), ('adlm', 'ADLM'), ('hmdlm', 'HMDLM'), ('hdlm', 'HDLM'))
TEXT_PAIRS = (('hmdlm', 'adlm'), ('hmdlm', 'mdlm'), ('hdlm', 'mdlm'), ('adlm', 'mdlm'))


def _nats(j: dict[str, Any], m: str) -> list[float]:
  return [j[m]['per_seed'][str(s)]['bound_nats_per_token'] for s in j['seeds']]


def baselines_text(load: Load) -> list[str]:
  j = load('baselines_text.json')
  lines = prose(f'Runs at commit {j["commit"]}, {j["num_steps"]:,} steps, seeds '
                f'{", ".join(map(str, j["seeds"]))} ([baselines_text.json](baselines_text.json)).')
  lines.append('')
  lines += head('model', 'bound nats/token', 'bound PPL', 'per seed (PPL)')
  for m, name in TEXT_MODELS:
    r = stats.mean_se(_nats(j, m))
    ppl = [j[m]['per_seed'][str(s)]['bound_ppl'] for s in j['seeds']]
    lines.append(row(name, pm(r, 3), f'{math.exp(r.mean):.1f}', seeds(ppl, 1)))
  u = j['unigram']
  lines.append(row(f'unigram ({u["smoothing"]}), same tokens', f'{u["nats_per_token"]:.3f}',
                   f'{u["ppl"]:.1f}', '–'))
  return lines


def baselines_text_pairs(load: Load) -> list[str]:
  j = load('baselines_text.json')
  names = dict(TEXT_MODELS)
  lines = head('pair', 'per seed', 'mean ± s.e.', 't, p, same sign', 'reading')
  for a, b in TEXT_PAIRS:
    r = stats.paired(_nats(j, a), _nats(j, b))
    d = [x - y for x, y in zip(_nats(j, a), _nats(j, b))]
    lines.append(row(f'{names[a]} − {names[b]}', seeds(d, 3, sign=True), pm(r.diff, 3, sign=True),
                     stats.t_cell(r), stats.verdict(r)))
  return lines


def baselines_text_front(load: Load) -> list[str]:
  j = load('baselines_text_front.json')
  temps = j['settings']['temperatures']
  lines = head('model', 'K', *(f'τ = {t:g}: entropy / judge GenPPL' if i == 0 else f'τ = {t:g}'
                               for i, t in enumerate(temps)))
  for g, name in TEXT_MODELS:
    runs = [j['runs'][r] for r in j['groups'][g]['runs']]
    for k in j['settings']['steps']:
      cells = []
      for t in temps:
        pts = [next(p['mean'] for p in r['points'] if p['steps'] == k and p['temperature'] == t)
               for r in runs]
        ent = stats.mean_se([p['entropy'] for p in pts])
        ppl = stats.mean_se([p['gen_ppl_judge'] for p in pts])
        cells.append(f'{pm(ent, 2)} / {pm(ppl, 0)}')
      lines.append(row(name, k, *cells))
  return lines


# ------------------------------------------------------ text bounds transcribed (hdlm, text)

BOUND_MODELS = ('hdlm', 'mdlm', 'hmdlm')


def _log_nats(j: dict[str, Any], m: str) -> list[float]:
  return [math.log(j['seeds'][s][m]['bound_ppl']) for s in sorted(j['seeds'], key=int)]


def bounds_table(load: Load) -> list[str]:
  j = load('text_bounds.json')
  lg = j['means_logged']
  u = load('baselines_text.json')['unigram']['nats_per_token']  # the same split and vocabulary
  names = {'hdlm': f'HDLM, n = 16 (cluster {lg["hdlm"]["cluster_nats"]:.3f} + word '
                   f'{lg["hdlm"]["word_nats"]:.3f})',
           'mdlm': 'MDLM twin',
           'hmdlm': f'HMDLM, `configs/text.py` (LM {lg["hmdlm"]["lm_nats"]:.3f} + hier '
                    f'{lg["hmdlm"]["hier_nats"]:.3f} + cons {lg["hmdlm"]["cons_nats"]:.3f})'}
  appx = {'hdlm': 'n/a (no such estimate)', 'mdlm': '= the bound',
          'hmdlm': f'{math.exp(lg["hmdlm"]["appendix_e_nats"]):.1f} '
                   f'({lg["hmdlm"]["appendix_e_nats"]:.3f} ± {lg["hmdlm"]["appendix_e_se"]:.3f} '
                   'nats, logged)'}
  lines = head('model', 'bound nats/token', 'bound PPL', '/ unigram PPL', 'per seed (PPL)',
               'Appendix E PPL (estimate, not a bound)')
  for m in BOUND_MODELS:
    r = stats.mean_se(_log_nats(j, m))
    ppl = [j['seeds'][s][m]['bound_ppl'] for s in sorted(j['seeds'], key=int)]
    lines.append(row(names[m].replace('-', '−'), pm(r, 3), f'{math.exp(r.mean):.1f}',
                     f'{math.exp(r.mean - u):.2f}', seeds(ppl, 1), appx[m]))
  lines.append(row('unigram (add-one), same test tokens', f'{u:.3f}', f'{math.exp(u):.1f}', '1',
                   '–', '–'))
  lines += [''] + prose(
      f'Runs at commit {j["commit_of_runs"]}; per-seed bound PPLs as logged to 0.1 (nats = ln '
      "PPL; [text_bounds.json](text_bounds.json)); the decompositions are the log's means. Not "
      'the runs of [baselines.md](baselines.md) (commit c6394e9): the same command and seeds '
      'gave other per-seed figures there, so rows of the two pages are not paired.')
  return lines


def bounds_pairs(load: Load) -> list[str]:
  j = load('text_bounds.json')
  names = {'hdlm': 'HDLM', 'mdlm': 'MDLM', 'hmdlm': 'HMDLM'}
  lines = head('pair', 'per seed (nats/token)', 'mean ± s.e.', 't, p, same sign', 'reading')
  for a, b in (('hdlm', 'mdlm'), ('hdlm', 'hmdlm'), ('mdlm', 'hmdlm')):
    x, y = _log_nats(j, a), _log_nats(j, b)
    r = stats.paired(x, y)
    lines.append(row(f'{names[a]} − {names[b]}', seeds([p - q for p, q in zip(x, y)], 3, True),
                     pm(r.diff, 3, sign=True), stats.t_cell(r), stats.verdict(r)))
  return lines


def text_variants(load: Load) -> list[str]:
  v = load('text_bounds.json')['seed_0_variants_logged']
  u = load('baselines_text.json')['unigram']['ppl']
  rows = (('two_pass_beta0.1', 'two-pass (the paper\'s Algorithm 1), β = 0.1 into the backbone'),
          ('two_pass_hier_stop_gradient', 'two-pass, `hier_stop_gradient`, β = 1'),
          ('single_pass_hier_stop_gradient',
           'single-pass, `hier_stop_gradient`, β = 1 (`configs/text.py`)'),
          ('mdlm_twin', 'MDLM twin, same seed'))
  lines = head('HMDLM variant', 'bound PPL', 'LM / hier nats', 'bound / unigram PPL')
  for key, name in rows:
    r = v[key]
    nats = f'{r["lm_nats"]:.3f} / {r["hier_nats"]:.3f}' if 'lm_nats' in r else '–'
    lines.append(row(name, f'{r["bound_ppl"]:.1f}', nats, f'{r["bound_ppl"] / u:.2f}'))
  lines += [''] + prose('Single runs, seed 0, as docs/experiments/text_log.md logged them '
                        '([text_bounds.json](text_bounds.json)).')
  return lines


# ------------------------------------------------------------------ fronts (hdlm, multimdm)

FRONT_LABELS = {'t3_hmdlm': 'HMDLM', 't3_hdlm': 'HDLM', 'mdlm': 'MDLM', 'mm_cont': 'MM-cont',
                'mdlm_more': 'control', 'mdlm_cd': 'MDLM-CD', 'mm_cd': 'MM-CD',
                'mm_cdf': 'MM-CD frozen', 'mm_cdf4': 'MM-CD frozen 4×'}
FRONT_ORDER = ('t3_hmdlm', 't3_hdlm', 'mdlm', 'mm_cont', 'mdlm_more', 'mdlm_cd', 'mm_cd',
               'mm_cdf', 'mm_cdf4')
HDLM_PAIRS = (('t3_hdlm', 'mdlm'), ('t3_hmdlm', 'mdlm'), ('t3_hdlm', 't3_hmdlm'))
MULTIMDM_PAIRS = HDLM_PAIRS + (
    ('mdlm_more', 'mdlm'), ('mm_cont', 'mdlm'), ('mdlm_cd', 'mdlm_more'), ('mm_cd', 'mdlm_more'),
    ('mm_cd', 'mdlm_cd'), ('mm_cdf', 'mm_cd'), ('mm_cdf4', 'mm_cdf'), ('mm_cdf4', 'mdlm_cd'))


def _fronts(load: Load) -> dict[str, Any]:
  merged = load('fronts_text.json')
  merged = {**merged, 'groups': {g: merged['groups'][g] for g in FRONT_ORDER}}
  return merged


def fronts_table(load: Load) -> list[str]:
  from scripts import front_table  # pylint: disable=import-outside-toplevel
  return front_table.table(_fronts(load), FRONT_LABELS) + [''] + prose(
      'Raw: [fronts_text.json](fronts_text.json) (`scripts.front_table --out`, committed in '
      "39ede1b); it records no commit or command: the page's commands made it. HMDLM and HDLM are "
      'the runs of [baselines.md](baselines.md) (commit c6394e9); the commit of the others is not '
      'recorded.')


def _front_pairs(load: Load, pairs: Sequence[tuple[str, str]]) -> list[str]:
  from scripts import front_table  # pylint: disable=import-outside-toplevel
  return front_table.pair_table(_fronts(load), pairs, FRONT_LABELS)


def fronts_pairs_hdlm(load: Load) -> list[str]:
  return _front_pairs(load, HDLM_PAIRS)


def fronts_pairs_multimdm(load: Load) -> list[str]:
  return _front_pairs(load, MULTIMDM_PAIRS)


def multimdm_sudoku(load: Load) -> list[str]:
  from scripts import few_step  # pylint: disable=import-outside-toplevel
  j = load('multimdm_sudoku.json')
  keys = set().union(*(s.keys() for s in j['seeds'].values()))
  nfes = sorted({int(k.rsplit('/', 1)[1]) for k in keys})
  decodings = ('confidence', 'ancestral')
  rows = [(run, dec) for dec in decodings for run in few_step.SUDOKU_RUNS]
  return few_step.sudoku_table(j, rows, nfes) + [''] + prose(
      f'Raw: [multimdm_sudoku.json](multimdm_sudoku.json), made by `{j["command"]}`; it '
      'records no commit (committed in dc81ac0).')


# ------------------------------------------------------------------------------ sudoku.md

def _rate(run: dict[str, Any], mode: str, metric: str) -> float:
  return 100 * run[mode][metric]


def _solve_cells(runs: list[dict[str, Any]], mode: str, base: str | None = None) -> str:
  """'solve / cells' mean ± s.e. over runs (of mode − base, paired, when `base`)."""
  out = []
  for metric in ('solve_rate', 'cell_accuracy'):
    x = [_rate(r, mode, metric) for r in runs]
    if base is None:
      out.append(pm(stats.mean_se(x), 1))
    else:
      out.append(pm(stats.paired(x, [_rate(r, base, metric) for r in runs]).diff, 1, sign=True))
  return ' / '.join(out)


def sudoku_targets(load: Load) -> list[str]:
  j = load('demo.json')
  seeds_ = sorted(j['demo_8x'])
  hm = [j['demo_8x'][s] for s in seeds_]
  tw = [j['twin_1450'][s] for s in seeds_]
  acc = [r['level_accuracy']['t=random'] for r in hm]
  prior = stats.mean_se([r['level_prior']['t=random']
                         for r in load('lr5.json')['width64_5x']['runs'].values()])
  order = [stats.paired([_rate(r, 'head_order/greedy', m) for r in hm],
                        [_rate(r, 'head_ignored/greedy', m) for r in hm])
           for m in ('solve_rate', 'cell_accuracy')]
  vs_twin = [stats.paired([_rate(r, d, 'solve_rate') for r in hm],
                          [_rate(r, d, 'solve_rate') for r in tw])
             for d in ('greedy', 'stochastic')]
  lines = head(f'what (mean ± s.e., seeds {seeds_[0][1:]}–{seeds_[-1][1:]})', 'figure',
               't, p, same sign')
  lines.append(row(f'the head\'s level accuracy on blanks (prior {prior.mean:.3f})',
                   f'{pm(stats.mean_se(acc), 3)} (lowest seed {min(acc):.3f}; '
                   f'{pm(stats.mean_se([r["level_accuracy"]["t=1.0"] for r in hm]), 3)} at t = 1)',
                   ''))
  low = [min(_rate(r, 'head_order/greedy', m) - _rate(r, 'head_ignored/greedy', m) for r in hm)
         for m in ('solve_rate', 'cell_accuracy')]
  lines.append(row('greedy solve / cells: the head\'s order (w = 1) − head ignored',
                   ' / '.join(pm(o.diff, 1, sign=True) for o in order)
                   + f' (lowest seed {low[0]:+.1f} / {low[1]:+.1f})',
                   ' / '.join(stats.t_cell(o) for o in order)))
  lines.append(row('the same for the demo\'s decoding (w = 0.1)',
                   _solve_cells(hm, 'greedy', 'head_ignored/greedy'), ''))
  lines.append(row('the demo\'s decoding, greedy / stochastic solve',
                   ' / '.join(pm(stats.mean_se([_rate(r, d, 'solve_rate') for r in hm]), 1)
                              for d in ('greedy', 'stochastic')), ''))
  lines.append(row('HMDLM − MDLM twin at equal training wall time, greedy / stochastic solve',
                   ' / '.join(pm(v.diff, 1, sign=True) for v in vs_twin),
                   ' / '.join(stats.t_cell(v) for v in vs_twin)))
  lines += [''] + prose(f'Runs at commit {j["commit_of_runs"]}: `{j["train_command"]}` and the '
                        f'twin `{j["twin_command"]}` ([demo.json](demo.json)).')
  return lines


def sudoku_lr5(load: Load) -> list[str]:
  j = load('lr5.json')
  runs = [j['width64_5x']['runs'][k] for k in sorted(j['width64_5x']['runs'])]
  acc = stats.mean_se([r['level_accuracy']['t=random'] for r in runs])
  prior = stats.mean_se([r['level_prior']['t=random'] for r in runs])
  lines = head('', 'mean ± s.e.')
  lines.append(row(f'level accuracy, t ~ U (prior {prior.mean:.3f})', pm(acc, 3)))
  for name, mode in (('head ignored (w = 0)', 'head_ignored'),
                     ("the head's order (w = 1)", 'head_order'),
                     ("w = 0.1 (the config's)", 'greedy'), ('stochastic, w = 0.1', 'stochastic')):
    lines.append(row(name, _solve_cells(runs, mode)))
  for name, mode in (("the head's order − ignored", 'head_order'),
                     ('w = 0.1 − ignored', 'greedy'),
                     ("the labeller's order − ignored (reference)", 'labeller_order')):
    lines.append(row(name, _solve_cells(runs, mode, 'head_ignored')))
  lines += [''] + prose(f'Runs at commit {j["commit_of_runs"]}: `{j["width64_5x"]["command"]}` '
                        '([lr5.json](lr5.json)).')
  return lines


# -------------------------------------------------------------------------------- registry

PAGES: dict[str, dict[str, Callable[[Load], list[str]]]] = {
    'baselines.md': {'baselines-sudoku': baselines_sudoku,
                     'baselines-sudoku-tests': baselines_sudoku_tests,
                     'baselines-sudoku-seeds': baselines_sudoku_seeds,
                     'baselines-text': baselines_text,
                     'baselines-text-pairs': baselines_text_pairs,
                     'baselines-text-front': baselines_text_front},
    'hdlm.md': {'text-bounds': bounds_table, 'text-bound-pairs': bounds_pairs,
                'fronts': fronts_table, 'fronts-pairs-hdlm': fronts_pairs_hdlm},
    'multimdm.md': {'multimdm-sudoku': multimdm_sudoku, 'fronts': fronts_table,
                    'fronts-pairs-multimdm': fronts_pairs_multimdm},
    'text.md': {'text-bounds': bounds_table, 'text-variants': text_variants},
    'sudoku.md': {'sudoku-targets': sudoku_targets, 'sudoku-lr5': sudoku_lr5},
}


def loader(folder: pathlib.Path) -> Load:
  cache: dict[str, Any] = {}

  def load(name: str) -> Any:
    if name not in cache:
      cache[name] = json.loads((folder / name).read_text(encoding='utf-8'))
    return cache[name]
  return load


def render(page: str, text: str, load: Load) -> str:
  """`text` with every generated block of `page` regenerated; a block the registry does not
  know, or one it expects and the page lacks, is an error."""
  blocks = PAGES.get(page, {})
  found = [m.group(2) for m in BLOCK.finditer(text)]
  unknown = sorted(set(found) - set(blocks))
  missing = sorted(set(blocks) - set(found))
  if unknown or missing or len(found) != len(set(found)):
    raise ValueError(f'{page}: blocks unknown {unknown}, missing {missing}, found {found}')
  return BLOCK.sub(lambda m: m.group(1) + '\n'.join(blocks[m.group(2)](load)) + '\n'
                   + m.group(4), text)


def stale(folder: pathlib.Path = RESULTS, write: bool = False) -> list[str]:
  """The pages whose generated blocks differ from their JSON (rewritten when `write`)."""
  load = loader(folder)
  out = []
  for page in PAGES:
    path = folder / page
    text = path.read_text(encoding='utf-8')
    new = render(page, text, load)
    if new != text:
      out.append(page)
      if write:
        path.write_text(new, encoding='utf-8')
  return out


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--check', action='store_true', help='list stale pages, write nothing')
  ap.add_argument('--dir', default=str(RESULTS), help='the results folder')
  a = ap.parse_args(argv)
  pages = stale(pathlib.Path(a.dir), write=not a.check)
  for p in pages:
    print(f'{p}: generated tables {"differ from" if a.check else "rewritten from"} its JSON')
  return 1 if (a.check and pages) else 0


if __name__ == '__main__':
  sys.exit(main())
