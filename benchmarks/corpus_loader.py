r"""`prepare` tokens/s per core, the 'corpus' loader's packed rows/s, and the host cores a step needs.

  python -m benchmarks.corpus_loader                     # ~2 min on 2 cores
  python -m benchmarks.corpus_loader --tokens=4e6 --seconds=10 --workers=0,1,2,4

1. Two synthetic corpora of the Shakespeare fixture's lines, as JSON lines: LM1B-like (a line per
   document) and OWT-like (~40 shuffled lines, ~1,000 tokens, per document), prepared by
   `python -m hmdlm_jax.data.prepare` (offline bert-base-uncased) in a child with 1 and 2 workers
   (one tokenizer thread each): tokens per CPU-second of the child and its workers = per core.
2. The train loader (data/corpus.py, frequency levels) for --seconds: LM1B shape L = 128, one
   sentence per row ('truncate'); OWT shape L = 1024, 'wrap'; with 0/1/2... Grain worker
   processes: rows/s on this host and rows per CPU-second (this process and its workers, /proc).
3. Host cores so the loader is never the bottleneck on a host of 8 accelerators (global batch 512
   = one host's rows per step): 512 / step_s / (rows per CPU-second at the most workers),
   step_s = max(t_compute, t_comm) of benchmarks/results/aot.json (8 devices, data parallel: the
   fastest step it estimates); the OWT step scales t_compute by benchmarks/flops.py's L = 1024 : 128
   FLOP ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import common
from benchmarks import machine

REPO = common.REPO
FIXTURE = os.path.join(REPO, 'hmdlm_jax', 'assets', 'text',
                       'britannica_1911_shakespeare_sentences.txt')
TOKENIZER = 'offline:bert-base-uncased'
# name -> (L, packing, lines of the fixture per document); global batch 512 for both.
SHAPES = {'lm1b': (128, 'truncate', 1), 'owt': (1024, 'wrap', 40)}
GLOBAL_BATCH = 512
HARDWARE = ('8xH100-SXM', '8xA100-80GB')


def synthetic_corpus(path: str, tokens: float, lines_per_doc: int = 40) -> int:
  """JSON lines of documents (~27 bert tokens a line) until ~`tokens`; returns the documents."""
  lines = [x.strip() for x in open(FIXTURE, encoding='utf-8') if x.strip()]
  rng = random.Random(0)
  n_docs = max(4, int(tokens / (27 * lines_per_doc)))
  with open(path, 'w', encoding='utf-8') as f:
    for _ in range(n_docs):
      f.write(json.dumps({'text': ' '.join(rng.sample(lines, lines_per_doc))}) + '\n')
  return n_docs


def _tree_cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of a live process and its live descendants (Linux /proc)."""
  tick = os.sysconf('SC_CLK_TCK')
  total, todo = 0.0, [pid]
  while todo:
    p = todo.pop()
    try:
      with open(f'/proc/{p}/stat', encoding='utf-8') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
      for task in os.listdir(f'/proc/{p}/task'):
        with open(f'/proc/{p}/task/{task}/children', encoding='utf-8') as f:
          todo += [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
      pass
  return total


def measure_prepare(src: str, out: str, workers: int) -> dict[str, Any]:
  """One `prepare` child: wall seconds, CPU seconds (the child and its waited-for workers)."""
  env = dict(os.environ, TOKENIZERS_PARALLELISM='false', RAYON_NUM_THREADS='1',
             PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
  cmd = [sys.executable, '-m', 'hmdlm_jax.data.prepare', f'--input={src}', f'--output={out}',
         f'--tokenizer={TOKENIZER}', f'--workers={workers}', '--shard_mb=1']
  r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
  wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
  if proc.returncode:
    raise common.BenchmarkError(f'{" ".join(cmd)} failed: {proc.stderr[-2000:]}')
  cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
  with open(os.path.join(out, 'train', 'manifest.json'), encoding='utf-8') as f:
    m = json.load(f)
  return {'workers': workers, 'wall_s': wall, 'cpu_s': cpu, 'tokens': m['tokens'],
          'documents': m['documents'], 'tokens_per_s': m['tokens'] / wall,
          'tokens_per_cpu_s': m['tokens'] / max(cpu, 1e-9)}


def measure_loader(corpus_dir: str, shape: str, workers: int, seconds: float,
                   batch: int) -> dict[str, Any]:
  """Rows/s of the train pipeline (after its first batch) and rows per CPU-second."""
  seq_len, packing, _ = SHAPES[shape]
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.configs import text as text_cfg  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.data import corpus  # pylint: disable=g-import-not-at-top
  c = text_cfg.get_config()
  c.model.seq_len = c.data.seq_len = seq_len
  c.data.kind, c.data.corpus_dir, c.data.packing = 'corpus', corpus_dir, packing
  c.data.batch_size, c.data.num_workers = batch, workers
  config = config_lib.resolve(c)
  it = iter(corpus.make_corpus_dataset(config, 'train', seed=0, process_index=0, process_count=1))
  next(it)  # start-up (worker processes, first reads) is not timed
  me = os.getpid()
  cpu0, t0, rows = _tree_cpu_seconds(me), time.perf_counter(), 0
  while time.perf_counter() - t0 < seconds:
    rows += len(next(it)['tokens'])
  wall, cpu = time.perf_counter() - t0, _tree_cpu_seconds(me) - cpu0
  del it
  return {'shape': shape, 'seq_len': seq_len, 'packing': packing, 'workers': workers, 'rows': rows, 'wall_s': wall, 'cpu_s': cpu,
          'rows_per_s': rows / wall, 'rows_per_cpu_s': rows / max(cpu, 1e-9)}


def step_times() -> dict[str, dict[str, float]]:
  """'<shape>/<mode>/<hardware>' -> step_s: aot.json's max(t_compute, t_comm) at 8 devices, data
  parallel (LM1B: B = 512, L = 128); OWT: t_compute × the FLOP ratio of L = 1024 to L = 128."""
  from benchmarks import flops  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'benchmarks', 'results', 'aot.json'), encoding='utf-8') as f:
    recs = json.load(f)['records']
  out = {}
  for mode, name in (('mdlm', 'lm1b_mdlm.py'), ('hmdlm', 'lm1b.py')):
    model = config_lib.resolve(common.experiment(name)).model
    ratio = (flops.train_step_flops(model, GLOBAL_BATCH, SHAPES['owt'][0]).train_step
             / flops.train_step_flops(model, GLOBAL_BATCH, SHAPES['lm1b'][0]).train_step)
    rec = next(r for r in recs if r['devices'] == 8 and r['mesh'] == 'data' and r['mode'] == mode)
    for hw in HARDWARE:
      r = rec['roofline'][hw]
      out[f'lm1b/{mode}/{hw}'] = max(r['t_compute_s'], r['t_comm_s'])
      out[f'owt/{mode}/{hw}'] = max(r['t_compute_s'] * ratio, r['t_comm_s'])
  return out


def _ints(parser: argparse.ArgumentParser, flag: str, value: str) -> list[int]:
  try:
    return [int(w) for w in value.split(',')]
  except ValueError:
    parser.error(f'{flag}={value}: expected comma-separated integers')
    raise


def main(argv: Sequence[str] | None = None) -> int:
  p = common.Parser(prog='python -m benchmarks.corpus_loader', description=__doc__.split('\n\n')[0])
  p.add_argument('--tokens', type=float, default=2e6, help='synthetic corpus size')
  p.add_argument('--workers', default='0,1,2', help='Grain worker counts of the loader')
  p.add_argument('--prepare_workers', default='1,2', help='worker counts of prepare')
  p.add_argument('--seconds', type=float, default=6.0, help='timed seconds per loader setting')
  p.add_argument('--batch', type=int, default=64, help='rows per loader batch')
  p.add_argument('--tag', default='')
  common.add_output_flags(p, os.path.join(common.RESULTS, 'corpus_loader[_<tag>].json'))
  a = p.parse_args(argv)
  loader_workers = _ints(p, '--workers', a.workers)
  prep_workers = _ints(p, '--prepare_workers', a.prepare_workers)
  common.check(p, a.tokens >= 1e4, '--tokens', a.tokens, 'must be >= 1e4')
  common.check(p, a.seconds > 0, '--seconds', a.seconds, 'must be > 0')
  common.check(p, a.batch >= 1, '--batch', a.batch, 'must be >= 1')
  common.check(p, min(loader_workers) >= 0, '--workers', a.workers, 'must be >= 0')
  common.check(p, min(prep_workers) >= 1, '--prepare_workers', a.prepare_workers, 'must be >= 1')
  path = common.output_path(p, a, os.path.join(
      common.RESULTS, f'corpus_loader{"_" + a.tag if a.tag else ""}.json'))
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.mark_as_parsed()  # Grain's worker processes read its absl flags
  t_start, load0 = time.time(), machine.load_average()
  with tempfile.TemporaryDirectory() as tmp:
    dirs, docs, prep = {}, {}, []
    for shape, (_, _, lines_per_doc) in SHAPES.items():
      src = os.path.join(tmp, f'{shape}.jsonl')
      docs[shape] = synthetic_corpus(src, a.tokens, lines_per_doc)
      runs = prep_workers if shape == 'owt' else prep_workers[:1]
      prep_runs = [measure_prepare(src, os.path.join(tmp, f'{shape}{w}'), w) for w in runs]
      for r in prep_runs:
        r['shape'] = shape
      prep += prep_runs
      dirs[shape] = os.path.join(tmp, f'{shape}{runs[0]}')
    loads = [measure_loader(dirs[shape], shape, w, a.seconds, a.batch)
             for shape in SHAPES for w in loader_workers]
  steps = step_times()
  lines = [common.table('prepare (offline bert-base-uncased; JSON lines)',
                        ['corpus', 'workers', 'tokens', 'wall s', 'tokens/s', 'CPU s',
                         'tokens/CPU-s'],
                        [[r['shape'], r['workers'], f'{r["tokens"]:,}', f'{r["wall_s"]:.1f}',
                          f'{r["tokens_per_s"]:,.0f}', f'{r["cpu_s"]:.1f}',
                          f'{r["tokens_per_cpu_s"]:,.0f}'] for r in prep]),
           common.table('loader (frequency levels)',
                        ['shape', 'L', 'packing', 'workers', 'rows/s (this host)', 'rows/CPU-s',
                         'tokens/s'],
                        [[r['shape'], r['seq_len'], r['packing'], r['workers'], f'{r["rows_per_s"]:,.0f}',
                          f'{r["rows_per_cpu_s"]:,.0f}', f'{r["rows_per_s"] * r["seq_len"]:,.0f}']
                         for r in loads])]
  need = []
  for key, step in steps.items():
    shape, mode, hw = key.split('/')
    mine = [r for r in loads if r['shape'] == shape]
    rate = min(r['rows_per_cpu_s'] for r in mine if r['workers'] == max(loader_workers))
    rows_s = GLOBAL_BATCH / step
    need.append([shape, mode, hw, f'{step * 1e3:.1f}', f'{rows_s:,.0f}', f'{rate:,.0f}',
                 f'{rows_s / rate:.2f}'])
  lines.append(common.table(
      f'host cores the loader needs (8 accelerators per host, B = {GLOBAL_BATCH})',
      ['shape', 'mode', 'hardware', 'step ms', 'rows/s needed', 'rows/CPU-s', 'cores'], need))
  report = '\n'.join(lines)
  print(report)
  result = {'prepare': prep, 'loader': loads, 'step_s': steps, 'documents': docs,
            'machine': machine.machine_info(REPO), 'load_average': [load0, machine.load_average()],
            'duration_s': time.time() - t_start, 'command': ' '.join(sys.argv), 'table': report}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
