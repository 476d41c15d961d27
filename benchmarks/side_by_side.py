r"""Side by side: the project's training step and reference steps, timed in one process tree.

  python -m benchmarks.side_by_side --shape=tiny                      # ours (MDLM, HMDLM) + bare
  python -m benchmarks.side_by_side --shape=small --rounds=3 --steps=5 \
      --reference_tree=md4:/path/to/google-deepmind/md4 \
      --reference_tree=mdlm:/path/to/kuleshov-group/mdlm            # + their steps (torch for mdlm)
  python -m benchmarks.side_by_side --shape=small --runners=bare,bare:clip,bare:ema,bare:all \
      --baseline=bare                                                 # the bisection (item 2)
  python -m benchmarks.side_by_side --shape=tiny --runners=ours_mdlm,bare \
      --allocator=default,glibc,tcmalloc                              # allocator study (item 3)
  python -m benchmarks.side_by_side --shape=small --runners=ours_mdlm,ours_mdlm@tcmalloc,bare
  python -m benchmarks.side_by_side --shape=small --runners=ours_mdlm,before/ours_mdlm \
      --before_tree=/tmp/old                      # a change's before/after (old checkout)

Runners (`--runners`, comma-separated; a runner may carry options after ':' joined by '+'):
  ours_mdlm, ours_hmdlm   the project's real step (`hmdlm_jax.train.make_train_step`: diffusion
                          loss, grad, clipped AdamW, EMA, NaN guard, donation), K = 1 / K = 2;
                          options are config overrides `section.field=value`, applied as
                          `--config.section.field=value` (hmdlm_jax.config.load), e.g.
                          `ours_mdlm:model.dropout=0+optim.grad_clip=0`
  bare[:features]         benchmarks/bare_step.py: MDLM's step definition in plain JAX, written
                          here (the in-repo reference); features e.g. `bare:clip+ema`, `bare:all`
  md4                     google-deepmind/md4's own `train.train_step` under its own `jax.pmap`,
                          its transformer at the same width/depth (needs --reference_tree=md4:PATH
                          and md4's Python dependencies: clu, tensorflow-probability)
  before/NAME             NAME run from --before_tree (this project at another commit)
  mdlm_eager, mdlm_compile  kuleshov-group/mdlm's DiT + its `Diffusion._loss` (SUBS, log-linear),
                          AdamW, PyTorch eager / torch.compile of the loss (needs
                          --reference_tree=mdlm:PATH and torch; its hydra/lightning imports are
                          stubbed when absent)

Method: every (round, runner) is a fresh child process (`python -m benchmarks.side_by_side
--child=...`): JAX and PyTorch must not share a process (thread pools and allocators interfere),
every runner starts from the same allocator state, and the child's getrusage is its own. The
rounds are interleaved (A B C A B C ...), so drift of a shared machine hits every runner alike;
each child compiles, runs `--warmup` untimed steps, then `--steps` timed steps, and reports the
median wall time and, per step, the deltas of getrusage(RUSAGE_SELF): user and system CPU seconds,
minor and major page faults. The headline is a ratio: the runner's tokens/s over the best
reference's in the same round (median over rounds), never an absolute figure from another run;
beside it the same ratio in tokens per CPU second (user + system), which other load on a shared
machine disturbs far less than wall time (every runner uses the same two cores).
Persistent workers would save the compile per round, but at the small shape four resident JAX
processes need more memory than this 23 GB machine has.

`--allocator=default,glibc,tcmalloc,mallopt` (one or several: each runner is then run under
each): the allocator settings of hmdlm_jax/runtime.py given to the child (GLIBC_TUNABLES, LD_PRELOAD
of tcmalloc, or mallopt() in the child before JAX starts), or none.
Writes benchmarks/results/side_by_side_<shape>[_<tag>].json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from benchmarks import common

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (layers, hidden, heads, mlp, cond, vocab, CPU batch, length)
SHAPES: dict[str, tuple[int, ...]] = {
    'tiny': (4, 256, 4, 1024, 128, 30522, 32, 128),
    'small': (12, 768, 12, 3072, 128, 30522, 8, 128),
}
REFERENCES = ('bare', 'md4', 'mdlm_eager', 'mdlm_compile')
OURS = ('ours_mdlm', 'ours_hmdlm')


# ----------------------------------------------------------------------------- timing (child)


def _usage() -> tuple[float, float, int, int]:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_majflt


def time_steps(step: Callable[[], Any], sync: Callable[[Any], Any], warmup: int, steps: int
               ) -> dict[str, Any]:
  """Runs `step` warmup + steps times (sync(result) waits for it); per timed step: wall, user,
  system seconds and minor/major faults (getrusage deltas of this process, all threads)."""
  for _ in range(warmup):
    sync(step())
  rows = []
  for _ in range(steps):
    u0 = _usage()
    t0 = time.perf_counter()
    sync(step())
    wall = time.perf_counter() - t0
    u1 = _usage()
    rows.append({'wall_s': wall, 'user_s': u1[0] - u0[0], 'sys_s': u1[1] - u0[1],
                 'minflt': u1[2] - u0[2], 'majflt': u1[3] - u0[3]})
  med = lambda k: statistics.median(r[k] for r in rows)
  return {'steps': rows, 'median_step_s': med('wall_s'), 'user_s_per_step': med('user_s'),
          'sys_s_per_step': med('sys_s'), 'minflt_per_step': med('minflt'),
          'majflt_per_step': med('majflt'),
          'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ----------------------------------------------------------------------------- runners (child)


def _dims(shape: str) -> Any:
  from benchmarks import bare_step  # pylint: disable=g-import-not-at-top
  n, h, nh, m, c, v, b, l = SHAPES[shape]
  return bare_step.Dims(num_layers=n, hidden=h, heads=nh, mlp=m, cond=c, vocab=v, batch=b,
                        length=l)


def _run_bare(shape: str, opts: str, warmup: int, steps: int) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import bare_step  # pylint: disable=g-import-not-at-top
  d = _dims(shape)
  f = bare_step.Features.parse(opts.replace('+', ','))
  state, step, batch = bare_step.make(d, f)
  holder = {'state': state, 'i': 0}
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, jax.random.PRNGKey(0)).compile()
  compile_s = time.perf_counter() - t0

  def one() -> Any:
    holder['i'] += 1
    holder['state'], loss = compiled(holder['state'], batch, jax.random.PRNGKey(holder['i']))
    return loss

  rec = time_steps(one, jax.block_until_ready, warmup, steps)
  rec.update(compile_s=compile_s, features=str(f), flops_per_step=bare_step.step_flops(d),
             tokens_per_step=d.batch * d.length, final_loss=float(one()))
  return rec


def _ours_adapter(shape: str, mode: str, overrides: dict[str, str]) -> tuple[Any, Any, int]:
  """THE one place that touches the package's training API (re-point it after a refactor).

  Returns (compiled step (state, batch) -> (state, metrics), initial state, tokens per step);
  the step is the package's real jitted train step, compiled ahead of the loop.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import processes, tasks, train  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  config = ts.shape_config(shape, mode, 'float32', batch_size=SHAPES[shape][6],
                          overrides=[f'--config.{k}={v}' for k, v in overrides.items()])
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  process = processes.build(config)
  state, shardings = train.create_train_state(config, mesh, model)
  batch = shd.make_global_batch(ts.synthetic_batch(config), mesh)
  batch = {k: batch[k] for k in train.BATCH_KEYS}
  step = train.make_train_step(config, model, process, mesh, shardings)
  with shd.mesh_context(mesh):
    compiled = step.jitted.lower(state, batch).compile()
  return (lambda s: compiled(s, batch)), state, int(config.data.batch_size) * int(
      config.model.seq_len)


def _run_ours(shape: str, mode: str, opts: str, warmup: int, steps: int) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import flops as flops_lib  # pylint: disable=g-import-not-at-top
  overrides = dict(kv.split('=', 1) for kv in opts.split('+') if kv)
  t0 = time.perf_counter()
  step, state, tokens = _ours_adapter(shape, mode, overrides)
  compile_s = time.perf_counter() - t0
  holder = {'state': state}

  def one() -> Any:
    holder['state'], m = step(holder['state'])
    return m['loss']

  rec = time_steps(one, jax.block_until_ready, warmup, steps)
  d = _dims(shape)
  from benchmarks import bare_step  # pylint: disable=g-import-not-at-top
  rec.update(compile_s=compile_s, overrides=overrides, tokens_per_step=tokens,
             flops_per_step=bare_step.step_flops(d) * (2 if mode == 'hmdlm' else 1),
             final_loss=float(one()))
  del flops_lib
  return rec


def _run_reference(name: str, shape: str, tree: str, warmup: int, steps: int) -> dict[str, Any]:
  from benchmarks import references  # pylint: disable=g-import-not-at-top
  return references.run(name, _dims(shape), tree, warmup, steps, time_steps)


def run_child(runner: str, shape: str, warmup: int, steps: int, trees: dict[str, str]
              ) -> dict[str, Any]:
  name, _, opts = runner.partition(':')
  t0 = time.perf_counter()
  if name == 'bare':
    rec = _run_bare(shape, opts, warmup, steps)
  elif name in OURS:
    rec = _run_ours(shape, 'mdlm' if name == 'ours_mdlm' else 'hmdlm', opts, warmup, steps)
  elif name in ('md4', 'mdlm_eager', 'mdlm_compile'):
    tree = trees.get(REFERENCE_TREES[name])
    if not tree:
      raise SystemExit(f'runner {name} needs --reference_tree={REFERENCE_TREES[name]}:PATH')
    rec = _run_reference(name, shape, tree, warmup, steps)
  else:
    raise SystemExit(f'unknown runner {runner!r}')
  rec.update(runner=runner, shape=shape, child_wall_s=time.perf_counter() - t0,
             tokens_per_s=rec['tokens_per_step'] / rec['median_step_s'])
  return rec


# ----------------------------------------------------------------------------- parent


ALLOCATORS = ('default', 'glibc', 'tcmalloc', 'mallopt')
REFERENCE_TREES = {'md4': 'md4', 'mdlm_eager': 'mdlm', 'mdlm_compile': 'mdlm'}  # runner -> tree
BEFORE = 'before/'  # runner prefix: the same runner from --before_tree


def apply_requested_allocator() -> None:
  """In a child: applies the 'mallopt' setting when its parent asked for it (_child_env)."""
  from hmdlm_jax import runtime  # pylint: disable=g-import-not-at-top  (no JAX import)
  if os.environ.get(runtime.MARKER) == 'mallopt':
    runtime.configure_allocator()


def _child_env(allocator: str, root: str = _REPO, tree: str | None = None) -> dict[str, str]:
  """The child's environment: the allocator settings of hmdlm_jax.runtime, or none ('default').

  'glibc': GLIBC_TUNABLES; 'tcmalloc': LD_PRELOAD (error if not installed); 'mallopt': the child
  calls runtime.configure_allocator() before importing JAX. PYTHONPATH: `root` (this project, or
  the before tree), then the reference checkout `tree` of a reference runner
  (benchmarks/references.py imports the reference's modules from it).
  """
  from hmdlm_jax import runtime  # pylint: disable=g-import-not-at-top  (no JAX import)
  env = dict(os.environ)
  env.setdefault('JAX_PLATFORMS', 'cpu')
  env['PYTHONPATH'] = os.pathsep.join([root] + ([tree] if tree else [])
                                      + [env.get('PYTHONPATH', '')])
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  for k in ('GLIBC_TUNABLES', 'LD_PRELOAD', 'MALLOC_CONF', runtime.MARKER):
    env.pop(k, None)
  if allocator in ('glibc', 'tcmalloc'):
    extra = runtime.allocator_env(allocator)
    if not extra:
      raise SystemExit(f'--allocator={allocator}: not available on this system')
    env.update(extra)
  env[runtime.MARKER] = allocator  # children never re-exec or re-tune themselves
  return env


def spawn(runner: str, shape: str, warmup: int, steps: int, trees: dict[str, str],
          allocator: str, timeout_s: float, before_tree: str | None = None) -> dict[str, Any]:
  """One child process; returns its record plus the whole child's rusage (compile included).

  A runner `before/NAME` runs NAME from `before_tree` (this project at another commit: its
  package and its own side_by_side child), for a before/after of a change within one run.
  """
  root = _REPO
  if runner.startswith(BEFORE):
    runner, root = runner[len(BEFORE):], before_tree or ''
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'rec.json')
    cmd = [sys.executable, '-m', 'benchmarks.side_by_side', f'--child={runner}',
           f'--shape={shape}', f'--warmup={warmup}', f'--steps={steps}', f'--json={out}']
    cmd += [f'--reference_tree={k}:{v}' for k, v in trees.items()]
    t0 = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree = trees.get(REFERENCE_TREES.get(runner.partition(':')[0], ''))
    proc = subprocess.Popen(cmd, cwd=root, env=_child_env(allocator, root, tree),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
      text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      text, _ = proc.communicate()
      return {'runner': runner, 'allocator': allocator, 'error': f'timeout {timeout_s}s',
              'log_tail': text[-2000:]}
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # children run one at a time
    if proc.returncode != 0 or not os.path.exists(out):
      return {'runner': runner, 'allocator': allocator, 'error': f'exit {proc.returncode}',
              'log_tail': text[-3000:]}
    with open(out, encoding='utf-8') as f:
      rec = json.load(f)
  rec['allocator'] = allocator
  rec['process_wall_s'] = time.perf_counter() - t0
  rec['process_user_s'] = ru1.ru_utime - ru0.ru_utime
  rec['process_sys_s'] = ru1.ru_stime - ru0.ru_stime
  rec['process_minflt'] = ru1.ru_minflt - ru0.ru_minflt
  return rec


def _label(runner: str, allocator: str, both: bool) -> str:
  return f'{runner}@{allocator}' if both else runner


def _tokens_per_s(r: dict[str, Any]) -> float:
  return r['tokens_per_s']


def _tokens_per_cpu_s(r: dict[str, Any]) -> float:
  return r['tokens_per_step'] / max(r['user_s_per_step'] + r['sys_s_per_step'], 1e-9)


def summarise(records: list[dict[str, Any]], labels: list[str], baseline: str | None
              ) -> dict[str, Any]:
  """Per label: median over rounds; ratios per round (same round = same machine state)."""
  by: dict[str, list[dict[str, Any]]] = {lb: [] for lb in labels}
  for r in records:
    by[r['label']].append(r)
  refs = [lb for lb in labels if lb.split(':')[0].split('@')[0] in REFERENCES
          and ':' not in lb]  # plain references only (not bisection variants)
  rounds = sorted({r['round'] for r in records})
  out: dict[str, Any] = {}
  for lb in labels:
    ok = [r for r in by[lb] if 'error' not in r]
    if not ok:
      out[lb] = {'error': by[lb][0].get('error') if by[lb] else 'not run'}
      continue
    med = lambda k: statistics.median(r[k] for r in ok)
    s = {'tokens_per_s': med('tokens_per_s'), 'median_step_s': med('median_step_s'),
         'user_s_per_step': med('user_s_per_step'), 'sys_s_per_step': med('sys_s_per_step'),
         'minflt_per_step': med('minflt_per_step'), 'majflt_per_step': med('majflt_per_step'),
         'peak_rss_mb': med('peak_rss_bytes') / 2**20, 'compile_s': med('compile_s'),
         'per_round_tokens_per_s': [r['tokens_per_s'] for r in ok]}
    s['sys_share'] = s['sys_s_per_step'] / max(s['user_s_per_step'] + s['sys_s_per_step'], 1e-9)
    s['cpu_s_per_step'] = statistics.median(r['user_s_per_step'] + r['sys_s_per_step'] for r in ok)
    # Two ratios: tokens per wall second (the headline) and tokens per CPU second (user + system
    # of the child; much less sensitive to other load on a shared machine).
    for metric, suffix in ((_tokens_per_s, ''), (_tokens_per_cpu_s, '_cpu')):
      for name, pool in (('ratio_to_best_reference', [x for x in refs if x != lb]),
                         ('ratio_to_baseline', [baseline] if baseline and baseline != lb else [])):
        ratios = []
        for rd in rounds:
          mine = [r for r in ok if r['round'] == rd]
          theirs = [metric(r) for r in records
                    if r['round'] == rd and r['label'] in pool and 'error' not in r]
          if mine and theirs:
            ratios.append(metric(mine[0]) / max(theirs))
        if ratios:
          s[name + suffix] = statistics.median(ratios)
          s[name + suffix + '_rounds'] = ratios
    out[lb] = s
  return out


def print_table(shape: str, summary: dict[str, Any], baseline: str | None) -> str:
  hdr = ['runner', 'tokens/s', 's/step', 'ratio to best ref', f'ratio to {baseline or "-"}',
         'CPU ratio to best ref', f'CPU ratio to {baseline or "-"}', 'user s/step',
         'sys s/step', 'sys share', 'minflt/step', 'RSS MB', 'compile s']
  rows = []
  for lb, s in summary.items():
    if 'error' in s:
      rows.append([lb, s['error']] + [None] * (len(hdr) - 2))
      continue
    rows.append([lb, s['tokens_per_s'], s['median_step_s'], s.get('ratio_to_best_reference'),
                 s.get('ratio_to_baseline'), s.get('ratio_to_best_reference_cpu'),
                 s.get('ratio_to_baseline_cpu'), s['user_s_per_step'], s['sys_s_per_step'],
                 s['sys_share'], float(s['minflt_per_step']), s['peak_rss_mb'], s['compile_s']])
  text = common.table(f'Side by side, {shape} (medians over rounds; ratios per round)', hdr, rows)
  print(text, flush=True)
  return text


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = common.Parser(prog='python -m benchmarks.side_by_side',
                    description=__doc__.split('\n\n')[0])
  p.add_argument('--shape', default='tiny', choices=sorted(SHAPES))
  p.add_argument('--runners', default=None,
                 help='comma-separated; default ours_mdlm,ours_hmdlm,bare + the given trees')
  p.add_argument('--reference_tree', action='append', default=[],
                 help='md4:PATH or mdlm:PATH (repeatable)')
  p.add_argument('--before_tree', default=None,
                 help='a checkout of this project at another commit; runners before/NAME use it')
  p.add_argument('--rounds', type=int, default=2)
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--warmup', type=int, default=1)
  p.add_argument('--allocator', default='default',
                 help=f'comma-separated subset of {ALLOCATORS}')
  p.add_argument('--baseline', default='bare', help="label for 'ratio to' ('' = none)")
  p.add_argument('--timeout_s', type=float, default=1800)
  p.add_argument('--tag', default='')
  common.add_output_flags(p, os.path.join(common.RESULTS, 'side_by_side_<shape>[_<tag>].json'))
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  trees = {}
  for spec in a.reference_tree:
    k, _, v = spec.partition(':')
    if k not in ('md4', 'mdlm') or not v:
      p.error(f'--reference_tree={spec!r}: expected md4:PATH or mdlm:PATH')
    trees[k] = os.path.abspath(os.path.expanduser(v))

  if a.child:
    apply_requested_allocator()  # before JAX starts its threads
    rec = run_child(a.child, a.shape, a.warmup, a.steps, trees)
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(rec, f)
    return rec

  common.check(p, a.rounds > 0, '--rounds', a.rounds, 'must be > 0')
  common.check(p, a.steps > 0, '--steps', a.steps, 'must be > 0')
  common.check(p, a.warmup >= 0, '--warmup', a.warmup, 'must be >= 0')
  common.check(p, a.timeout_s > 0, '--timeout_s', a.timeout_s, 'must be > 0')
  runners = a.runners.split(',') if a.runners is not None else (
      ['ours_mdlm', 'ours_hmdlm', 'bare'] + (['md4'] if 'md4' in trees else [])
      + (['mdlm_eager', 'mdlm_compile'] if 'mdlm' in trees else []))
  allocs = a.allocator.split(',')
  if any(al not in ALLOCATORS for al in allocs):
    p.error(f'--allocator={a.allocator}: allowed {",".join(ALLOCATORS)}')
  both = len(allocs) > 1
  plan, labels = [], []
  known = ('bare', *OURS, *REFERENCE_TREES)
  for r in runners:  # 'runner@allocator' pins one runner's allocator
    r, _, pinned = r.partition('@')
    name = r.removeprefix(BEFORE).partition(':')[0]
    common.check(p, name in known, '--runners', a.runners,
                 f'unknown runner {name!r}; allowed {",".join(known)} (before/NAME, NAME:options, '
                 'NAME@allocator)')
    if name in REFERENCE_TREES and REFERENCE_TREES[name] not in trees:
      p.error(f'--runners={a.runners}: runner {name} needs '
              f'--reference_tree={REFERENCE_TREES[name]}:PATH')
    for al in ([pinned] if pinned else allocs):
      if al not in ALLOCATORS:
        p.error(f'--runners={a.runners}: allocator {al!r}: allowed {",".join(ALLOCATORS)}')
      plan.append((r, al))
      labels.append(_label(r, al, both or bool(pinned)))
  before = os.path.abspath(os.path.expanduser(a.before_tree)) if a.before_tree else None
  if any(r.startswith(BEFORE) for r, _ in plan) and not (
      before and os.path.isfile(os.path.join(before, 'benchmarks', 'side_by_side.py'))):
    p.error(f'runners {BEFORE}NAME need --before_tree=PATH, a checkout of this project '
            f'(got {a.before_tree!r})')
  path = common.output_path(p, a, os.path.join(
      common.RESULTS, f'side_by_side_{a.shape}{"_" + a.tag if a.tag else ""}.json'))
  baseline = a.baseline or None
  if baseline and baseline not in labels:
    baseline = None
  from benchmarks import machine  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  info = {'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'commit': machine.git_commit(_REPO),
          'cpu': machine.cpu_model(), 'cpu_count': os.cpu_count(),
          'load_average_start': os.getloadavg()}
  if before:
    info['before_tree'] = {'path': before, 'commit': machine.git_commit(before)}
  records = []
  for rd in range(a.rounds):
    for (runner, al), lb in zip(plan, labels):
      rec = spawn(runner, a.shape, a.warmup, a.steps, trees, al, a.timeout_s, before)
      rec.update(round=rd, label=lb)
      records.append(rec)
      brief = {k: rec.get(k) for k in ('label', 'round', 'tokens_per_s', 'median_step_s',
                                        'sys_s_per_step', 'minflt_per_step', 'error')}
      print(json.dumps(brief), flush=True)
      if 'error' in rec:
        print(rec.get('log_tail', ''), file=sys.stderr, flush=True)
  info['load_average_end'] = os.getloadavg()
  summary = summarise(records, labels, baseline)
  text = print_table(a.shape, summary, baseline)
  result = {'shape': a.shape, 'dims': SHAPES[a.shape], 'rounds': a.rounds, 'steps': a.steps,
            'warmup': a.warmup, 'runners': labels, 'baseline': baseline, 'machine': info,
            'summary': summary, 'records': records, 'table': text,
            'duration_s': time.perf_counter() - t0,
            'command': ' '.join(['python -m benchmarks.side_by_side'] + (argv or sys.argv[1:]))}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=1, default=str)
  print(f'wrote {path} ({result["duration_s"]:.0f}s)', flush=True)
  return result


if __name__ == '__main__':
  main()
