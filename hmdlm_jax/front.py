r"""GenPPL–entropy fronts of trained text runs: one generative harness for every process (§8.5).

  python -m hmdlm_jax.front --workdirs=A,B --steps=8,16,32 --temperatures=1.0,0.9 \
      --top_p=1.0,0.95 --seeds=0,1,2 --num_samples=64 --out=FILE [--judge_cache=DIR] [--groups=..]

Each run is read by `hmdlm_jax.load` (recorded config, EMA weights) and sampled by its process's
own sampler (MDLM, HMDLM, HDLM, MultiMDM, distilled or not) at every step count K x temperature τ
x nucleus mass p, --num_samples rows per sampling seed. Per seed: the measured network calls (nfe),
the unigram entropy of the generated content (cut at [SEP], prompt excluded), the GenPPL under the
offline AR judge (ar_judge: trained on the FIRST run's train split, cached in --judge_cache; runs
share its tokenizer) and under GPT-2 Large where it loads (else None and why). FILE (JSON): per-seed
values, mean ± s.e. over seeds, per run and K the front (evaluation/front.py) and its GenPPL at
each --entropies value (`equal_entropy`); samples in FILE.samples.jsonl. --groups (one per workdir,
e.g. a model's training seeds): `groups` gets mean ± s.e. over each group's runs of those.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hmdlm_jax import ar_judge
from hmdlm_jax import tasks
from hmdlm_jax import trained
from hmdlm_jax.data import text as text_data
from hmdlm_jax.evaluation import front as front_lib
from hmdlm_jax.evaluation import generative
from hmdlm_jax.evaluation import reports
from hmdlm_jax.tasks import text as text_task

METRICS = ('gen_ppl_judge', 'gen_ppl_gpt2')  # the GenPPLs a front is drawn on


def score(samples: trained.Samples, tok: Any, judge: Any, gpt2: Any, gpt2_reason: str | None
          ) -> dict[str, Any]:
  """Entropy (nats, generated content), the measured network calls per row (nfe) and the GenPPLs
  of one seed's samples."""
  _, text = text_task.content_mask(samples.tokens, tok.bos_id, tok.eos_id)
  out = {'entropy': generative.entropy_report(samples.tokens, text & ~samples.given)['entropy'],
         'mean_length': float((text & ~samples.given).sum(-1).mean()),
         'nfe': float(np.mean([r['nfe'] for r in samples.records]))}
  texts = list(samples.texts)
  if judge is not None:
    out['gen_ppl_judge'] = generative.gen_ppl_report(texts, scorer=judge)['gen_ppl']
  rep = generative.gen_ppl_report(texts, scorer=gpt2, unavailable_reason=gpt2_reason)
  out['gen_ppl_gpt2'] = rep['gen_ppl']
  return out


def sweep(model: trained.Model, *, steps: Sequence[int], temperatures: Sequence[float],
          top_ps: Sequence[float], seeds: Sequence[int], num_samples: int, judge: Any,
          gpt2: Any, gpt2_reason: str | None, write: Callable[[dict[str, Any]], None],
          log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
  """The points (K, τ, p) of one run: per-seed scores, mean and s.e.; `write` gets each sample."""
  tok = text_data.checked_tokenizer(model.config)
  points = []
  for k in steps:
    for tau in temperatures:
      for p in top_ps:
        m = model.with_sampling(num_steps=int(k), temperature=float(tau), top_p=float(p))
        per_seed = {}
        for seed in seeds:
          samples = m.sample(num_samples, seed=int(seed))
          per_seed[str(seed)] = score(samples, tok, judge, gpt2, gpt2_reason)
          for r in samples.records:
            write({'steps': int(k), 'temperature': float(tau), 'top_p': float(p),
                   'seed': int(seed), 'index': r['index'], 'text': r['text'],
                   'tokens': r['tokens'], 'given': r['given'], 'nfe': r['nfe']})
        mean, se = front_lib.summarise(per_seed)
        points.append({'steps': int(k), 'temperature': float(tau), 'top_p': float(p),
                       'per_seed': per_seed, 'mean': mean, 'se': se})
        log(f'  K={k} τ={tau:g} p={p:g}: entropy {mean["entropy"]}, judge GenPPL '
            f'{mean.get("gen_ppl_judge")}, GPT-2 {mean.get("gen_ppl_gpt2")}')
  return points


def run(workdirs: Sequence[str], out: str, *, names: Sequence[str] = (),
        steps: Sequence[int], temperatures: Sequence[float], top_ps: Sequence[float],
        seeds: Sequence[int], num_samples: int, judge_cache: str = '',
        judge_cfg: ar_judge.JudgeConfig = ar_judge.JudgeConfig(),
        gpt2_model: str = generative.DEFAULT_SCORER, params: str = 'ema',
        entropies: Sequence[float] = (), groups: Sequence[str] = (), overwrite: bool = False,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
  """The sweep of every run, written to `out` (JSON) and `out`.samples.jsonl; returns the JSON.

  An existing `out` or samples file is refused unless `overwrite`; both files appear only when
  the sweep is complete (the samples are written to a temporary file, renamed at the end).
  """
  for path in (out, out + '.samples.jsonl'):
    if os.path.exists(path) and not overwrite:
      raise ValueError(f'--out: {path} exists; choose another --out or pass --overwrite to '
                       'replace it.')
  check_settings(out, steps=steps, temperatures=temperatures, top_ps=top_ps, seeds=seeds,
                 num_samples=num_samples)
  if groups and (len(groups) != len(workdirs) or not all(groups)):
    raise ValueError(f'--groups={list(groups)} must give one non-empty group name per '
                     f'--workdirs entry ({len(workdirs)} here), or be left out.')
  base = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  # Training seeds' workdirs often share a basename (.../mdlm/seed_0, .../adlm/seed_0).
  names = list(names) or ([f'{g}/{b}' for g, b in zip(groups, base)] if groups else base)
  if len(names) != len(workdirs) or len(set(names)) != len(names):
    raise ValueError(f'--names={names} must give one distinct name per --workdirs entry.')
  models = [trained.load(w, params=params) for w in workdirs]
  for w, m in zip(workdirs, models):
    if not m.offers('score'):  # a text task's model
      raise ValueError(f'--workdirs: {w} is a data.kind={m.config.data.kind!r} run; the sweep '
                       f"scores text ({tasks.kinds_offering('score')}).")
  vocab = sorted({str(m.config.data.tokenizer) for m in models})
  if len(vocab) != 1:
    raise ValueError(f'--workdirs: the runs use the tokenizers {vocab}; one judge scores them '
                     'all, so they must share data.tokenizer.')
  judge, judge_info = None, None
  if judge_cache:
    judge = ar_judge.load_or_train(models[0].config, judge_cfg, cache_dir=judge_cache)
    judge_info = {'name': judge.name, **ar_judge.test_split_perplexity(judge, models[0].config)}
  gpt2, gpt2_reason = (generative.load_or_reason(generative.TransformersGPT2Scorer, gpt2_model)
                       if gpt2_model else (None, '--gpt2_model is empty'))
  result: dict[str, Any] = {
      'settings': {'steps': list(steps), 'temperatures': list(temperatures),
                   'top_p': list(top_ps), 'seeds': list(seeds), 'num_samples': num_samples,
                   'params': params, 'entropies': list(entropies)},
      'judge': judge_info, 'gpt2': {'model': gpt2_model, 'unavailable_reason': gpt2_reason},
      'runs': {}}
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  partial = out + '.samples.jsonl.partial'
  try:
    with open(partial, 'w', encoding='utf-8') as f:
      for name, workdir, model in zip(names, workdirs, models):
        log(f'{name}: {workdir} (process {model.config.process.kind}, step {model.step})')
        write = lambda r, name=name: f.write(json.dumps({'run': name, **r}) + '\n')
        points = sweep(model, steps=steps, temperatures=temperatures, top_ps=top_ps, seeds=seeds,
                       num_samples=num_samples, judge=judge, gpt2=gpt2, gpt2_reason=gpt2_reason,
                       write=write, log=log)
        result['runs'][name] = {
            'workdir': workdir, 'process': model.config.process.kind, 'step': model.step,
            'points': points, 'front': {m: front_lib.fronts(points, m) for m in METRICS}}
  except BaseException:  # a failed or interrupted sweep leaves nothing behind
    os.remove(partial)
    raise
  result['equal_entropy'] = equal_entropy(result['runs'], entropies)
  members: dict[str, list[str]] = {}
  for g, name in zip(groups, names):
    members.setdefault(g, []).append(name)
  result['groups'] = group_equal_entropy(result['equal_entropy'], members)
  os.replace(partial, out + '.samples.jsonl')
  reports.write_json(out, result)
  for line in group_table(result['groups'], entropies):
    log(line)
  return result


def check_settings(out: str, *, steps: Sequence[int], temperatures: Sequence[float],
                   top_ps: Sequence[float], seeds: Sequence[int], num_samples: int) -> None:
  """Validate first: the sweep's settings and the folder of `out`, before any run is read (a bad
  value would otherwise surface after the models load, or after the judge trains)."""
  for flag, values, ok, want in (
      ('--steps', steps, lambda v: v >= 1, 'step counts >= 1'),
      ('--temperatures', temperatures, lambda v: v > 0, 'temperatures > 0'),
      ('--top_p', top_ps, lambda v: 0 < v <= 1, 'nucleus masses in (0, 1]'),
      ('--seeds', seeds, lambda v: True, 'seeds')):
    if not values or not all(ok(v) for v in values):
      raise ValueError(f'{flag}={",".join(map(str, values))} must be a non-empty comma-separated '
                       f'list of {want}.')
  if num_samples < 1:
    raise ValueError(f'--num_samples={num_samples} must be >= 1.')
  folder = os.path.dirname(os.path.abspath(out))
  existing = folder
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ValueError(f'--out={out!r}: {existing!r} is a file, not a folder; choose another --out.')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f'--out={out!r}: {existing!r} is not writable; choose another --out.')


class _Parser(argparse.ArgumentParser):
  """argparse whose mistakes are one `hmdlm_jax: error:` line and exit code 1 (not usage + 2)."""

  def error(self, message: str) -> None:  # type: ignore[override]
    sys.exit(f'hmdlm_jax: error: {" ".join(message.split())} (--help lists the flags).')


def equal_entropy(runs: dict[str, Any], entropies: Sequence[float]
                  ) -> dict[str, dict[str, dict[str, list[float | None]]]]:
  """{metric: {K: {run: [GenPPL on its front at each of `entropies`]}}} (None outside it)."""
  out: dict[str, Any] = {}
  for metric in METRICS:
    for name, r in runs.items():
      for k, idx in r['front'][metric].items():
        out.setdefault(metric, {}).setdefault(k, {})[name] = [
            front_lib.at_entropy(r['points'], idx, metric, e) for e in entropies]
  return out


def group_equal_entropy(eq: Mapping[str, Any], members: Mapping[str, Sequence[str]]
                        ) -> dict[str, Any]:
  """{group: {'runs', 'equal_entropy': {metric: {K: {'per_run', 'mean', 'se', 'n'}}}}} from
  `eq` = equal_entropy(runs, entropies).

  per_run[r][j] is run r's front GenPPL at entropies[j]; mean and se (ddof = 1) over the group's
  runs at each j are None unless every run's front reaches it; n counts the runs that do.
  """
  out: dict[str, Any] = {}
  for group, names in members.items():
    table: dict[str, Any] = {}
    for metric, by_k in eq.items():
      for k, by_run in by_k.items():
        per_run = [by_run[n] for n in names]
        stats = [reports.mean_se(list(col)) for col in zip(*per_run)]
        table.setdefault(metric, {})[k] = {
            'per_run': per_run, 'mean': [m for m, _ in stats], 'se': [e for _, e in stats],
            'n': [sum(v is not None for v in col) for col in zip(*per_run)]}
    out[group] = {'runs': list(names), 'equal_entropy': table}
  return out


def group_table(groups: Mapping[str, Any], entropies: Sequence[float],
                metric: str = 'gen_ppl_judge') -> list[str]:
  """One line per group x K x entropy: the mean ± s.e. of `metric` over the group's runs."""
  lines = []
  for group, g in groups.items():
    for k, cell in g['equal_entropy'].get(metric, {}).items():
      for j, e in enumerate(entropies):
        pm = reports.mean_pm(cell['mean'][j], cell['se'][j], digits=2, count=cell['n'][j])
        lines.append(f'{group[:120]} K={k} entropy {e:g}: {metric} {pm} '
                     f'({cell["n"][j]}/{len(g["runs"])} runs reach it)')
  return lines


def _ints(s: str) -> list[int]:
  return [int(x) for x in s.split(',') if x]


def _floats(s: str) -> list[float]:
  return [float(x) for x in s.split(',') if x]


def main(argv: Sequence[str] | None = None) -> None:
  ap = _Parser(prog='python -m hmdlm_jax.front', description=__doc__.split('\n')[0])
  ap.add_argument('--workdirs', required=True, help='comma-separated trained text runs')
  ap.add_argument('--names', default='',
                  help='their names in FILE (default: directory names; GROUP/dirname with --groups)')
  ap.add_argument('--steps', type=_ints, default=[8, 16, 32], help='step counts K')
  ap.add_argument('--temperatures', type=_floats, default=[1.0])
  ap.add_argument('--top_p', type=_floats, default=[1.0], help='nucleus masses in (0, 1]')
  ap.add_argument('--seeds', type=_ints, default=[0, 1, 2])
  ap.add_argument('--num_samples', type=int, default=64, help='rows per seed and point')
  ap.add_argument('--out', required=True, help='the JSON file written')
  ap.add_argument('--overwrite', action='store_true', help='replace an existing --out')
  ap.add_argument('--judge_cache', default='', help="the judges' cache ('' = no judge)")
  ap.add_argument('--judge_steps', type=int, default=ar_judge.JudgeConfig.steps)
  ap.add_argument('--gpt2_model', default=generative.DEFAULT_SCORER, help="'' = not tried")
  ap.add_argument('--params', default='ema', choices=trained.PARAMS)
  ap.add_argument('--entropies', type=_floats, default=[],
                  help='entropies (nats) at which each front is read (equal_entropy in FILE)')
  ap.add_argument('--groups', default='',
                  help='one group name per --workdirs entry (e.g. a model\'s training seeds): '
                       'mean ± s.e. over each group\'s runs (groups in FILE)')
  a = ap.parse_args(argv)
  try:
    run(a.workdirs.split(','), a.out, names=[n for n in a.names.split(',') if n],
        steps=a.steps, temperatures=a.temperatures, top_ps=a.top_p, seeds=a.seeds,
        num_samples=a.num_samples, judge_cache=a.judge_cache,
        judge_cfg=ar_judge.JudgeConfig(steps=a.judge_steps), gpt2_model=a.gpt2_model,
        params=a.params, entropies=a.entropies,
        groups=a.groups.split(',') if a.groups else [], overwrite=a.overwrite, log=print)
  except ValueError as e:
    sys.exit(f'hmdlm_jax: error: {" ".join(str(e).split())}')
  except OSError as e:  # a refused write of --out or its samples, an unreadable run
    sys.exit(f'hmdlm_jax: error: {e.filename or a.out}: {e.strerror or e}; free space or fix '
             'the permissions, then rerun the same command.')


if __name__ == '__main__':
  main()
