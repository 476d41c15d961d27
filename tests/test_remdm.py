"""ReMDM's remasking sampler (`sample.ordering='remdm'`, docs/method.md §13.5) against exact laws.

* One step's probabilities equal the closed form, recomputed in numpy float64 (1e-6), and one
  step's draws from a mixed state (given, decoded, masked positions) follow that law (Pearson χ²
  over 20k draws, p > 1e-3) for each σ schedule at phase-1 / phase-2 / capped times.
* η = 0 draws MDLM's (and ADLM's) locked-in samples exactly: same key, same tokens, reveal steps
  and call count, with and without the cache, tempered and nucleus-truncated.
* The T-step law of an L = 2 toy with an imperfect, time-dependent denoiser is enumerated in numpy
  float64 and 20k draws match it (χ², p > 1e-3) for 'cap', 'rescale' and 'loop' (with the cache).
* The loop's middle phase holds the expected decoded fraction at α_on: exactly for the step
  probabilities, and for the sampler within 5 standard errors at every step (20 steps).
* Mutations (σ in place of 1 - σ in the fill probability, the 1/(1 - α_t) renormalisation
  dropped, decoded tokens kept w.p. σ) make the one-step χ² check, or the stationarity, fail.
* Configuration: one error line naming the field; K > 1 and other processes refused;
  configs/adlm_text.py samples with ordering='remdm' through `hmdlm_jax.main`.
"""

from __future__ import annotations

import json
import os

import hmdlm_jax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import processes
from hmdlm_jax.configs import adlm_text
from hmdlm_jax.configs import hdlm_text
from hmdlm_jax.configs import multimdm_text
from hmdlm_jax.configs import sudoku_mgdm
from hmdlm_jax.configs import text
from hmdlm_jax.processes import adlm
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import remdm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import sampler_helpers as sh
from tests.config_helpers import resolved
from tests.conftest import OPTIMISED
from tests.conftest import run_cmd

V = 3  # words 0..2
MASK = V
NUM = 20_000
P_MIN = 1e-3  # χ² p-value below which a law is rejected
EXACT = Schedule('loglinear', (0.0,), eps=0.0, eta=0.0)  # 1 - α(t) = t
LOOP = dict(remdm_schedule='loop', remdm_eta=0.3, remdm_t_on=0.7, remdm_t_off=0.2,
            remdm_alpha_on=0.6)
SCHEDULES = {'cap': dict(remdm_schedule='cap', remdm_eta=0.3),
             'rescale': dict(remdm_schedule='rescale', remdm_eta=0.6), 'loop': LOOP}


def _cfg(num_steps: int, **kw) -> config_lib.SampleConfig:
  kw.setdefault('use_cache', False)
  return sh.sample_cfg(num_steps=num_steps, num_levels=1, mask_id=MASK, ordering='remdm', **kw)


def _mdlm(schedule: Schedule = EXACT) -> hmdlm.HMDLM:
  return hmdlm.HMDLM(schedule, config_lib.LossConfig(mask_id=MASK, num_levels=1,
                                                     prior_corrected=False))


# ---------------------------------------------------------------------------------------------
# The numpy float64 reference: the closed form of docs/method.md §13.5, written independently.


def np_one_minus_alpha(t: float, kw: dict) -> float:
  if kw['remdm_schedule'] != 'loop':
    return t  # EXACT: α(t) = 1 - t
  a_on, t_on, t_off = kw['remdm_alpha_on'], kw['remdm_t_on'], kw['remdm_t_off']
  if t > t_on:
    return 1.0 - (1.0 - t) * a_on / (1.0 - t_on)
  if t > t_off:
    return 1.0 - a_on
  return t * (1.0 - a_on) / t_off


def np_probs(s: float, t: float, kw: dict) -> tuple[float, float]:
  """(σ_t, fill probability) of the step t -> s."""
  a_s, a_t = 1.0 - np_one_minus_alpha(s, kw), 1.0 - np_one_minus_alpha(t, kw)
  s_max = min(1.0, (1.0 - a_s) / a_t) if a_t > 0 else 1.0
  eta = kw['remdm_eta']
  if kw['remdm_schedule'] == 'rescale':
    sig = eta * s_max
  elif kw['remdm_schedule'] == 'cap' or kw['remdm_t_off'] < t <= kw['remdm_t_on']:
    sig = min(eta, s_max)
  else:
    sig = 0.0
  return sig, (a_s - (1.0 - sig) * a_t) / (1.0 - a_t)


def np_position_law(z: int, lg: np.ndarray, sig: float, fill: float, temp: float = 1.0
                    ) -> np.ndarray:
  """The law [V + 1] of one position's next state from its state z and logits lg [V + 1]."""
  p = np.exp((lg[:V] - lg[:V].max()) / temp)
  out = np.zeros(V + 1)
  if z < V:
    out[z], out[MASK] = 1.0 - sig, sig
  else:
    out[:V], out[MASK] = fill * p / p.sum(), 1.0 - fill
  return out


def np_kstep_law(reference, num_steps: int, kw: dict, seq_len: int = 2) -> np.ndarray:
  """Exact law [V^L] of the words after the T-step chain from all-MASK (float64)."""
  prob = {tuple([MASK] * seq_len): 1.0}
  for n in range(num_steps, 0, -1):
    t, s = n / num_steps, (n - 1) / num_steps
    sig, fill = np_probs(s, t, kw)
    nxt: dict = {}
    for z, pz in prob.items():
      zz = np.asarray(z)
      lg = reference(zz, (zz == MASK).astype(int), t)['token']
      laws = [np_position_law(z[i], lg[i], sig, fill) for i in range(seq_len)]
      joint = np.einsum('i,j->ij', *laws)
      for y in zip(*np.nonzero(joint)):
        nxt[y] = nxt.get(y, 0.0) + pz * joint[y]
    prob = nxt
  return sh.final_law(prob, V)


# ---------------------------------------------------------------------------------------------
# One step.


@pytest.mark.parametrize('name', list(SCHEDULES))
def test_step_probabilities_equal_the_closed_form(name):
  kw = SCHEDULES[name]
  for steps in (4, 5, 20):
    cfg = _cfg(steps, **kw)
    for n in range(steps, 0, -1):
      s, t = (n - 1) / steps, n / steps
      got = remdm_sampler.step_probs(jnp.float32(s), jnp.float32(t), EXACT, cfg)
      np.testing.assert_allclose([float(g) for g in got], np_probs(s, t, kw), atol=1e-6,
                                 err_msg=f'{name} T={steps} n={n}')
  assert float(remdm_sampler.step_probs(jnp.float32(0.0), jnp.float32(0.25), EXACT,
                                        _cfg(4, **kw))[1]) == 1.0  # the last step fills all


STEP_CASES = {'cap-T4-n3': ('cap', 4, 3), 'rescale-T4-n2': ('rescale', 4, 2),
              'loop-phase1-T5-n5': ('loop', 5, 5), 'loop-phase2-T5-n3': ('loop', 5, 3),
              'loop-T10-n8-into-phase2': ('loop', 10, 8)}


def one_step_pvalue(name: str, steps: int, n: int, seed: int = 0) -> tuple[float, float]:
  """χ² of one step's draws from x = [given 1, word 2, MASK, MASK] against the closed form."""
  kw = SCHEDULES[name]
  cfg = _cfg(steps, temperature=0.7, **kw)
  logits = np.random.default_rng(3).normal(0.0, 1.5, (1, 4, V + 1))
  model = sh.const_model(None, np.broadcast_to(logits, (NUM, 4, V + 1)))
  proc = _mdlm()
  init = proc.sampler_init(model, cfg, batch_size=NUM, seq_len=4,
                           given_tokens=np.ones((NUM, 4), np.int32),
                           given_mask=np.tile([True, False, False, False], (NUM, 1)))
  x = np.tile(np.int32([1, 2, MASK, MASK]), (NUM, 1))
  state = base.SamplerState(jnp.asarray(x), jnp.asarray((x == MASK).astype(np.int32)),
                            jnp.asarray(np.tile(np.int32([steps + 1, n + 1, 0, 0]), (NUM, 1))),
                            init.nfe, init.nan_calls, init.extra)
  step = jax.jit(lambda st, k: proc.reverse_step(model, cfg, k, st, jnp.int32(n)))
  out = np.asarray(step(state, jax.random.key(seed)).tokens)
  assert np.all(out[:, 0] == 1), 'a given position changed'
  sig, fill = np_probs((n - 1) / steps, n / steps, kw)
  laws = [np_position_law(int(x[0, i]), logits[0, i], sig, fill, 0.7) for i in (1, 2, 3)]
  law = np.einsum('i,j,k->ijk', *laws).ravel()
  return sh.chi2_pvalue(out[:, 1] * 16 + out[:, 2] * 4 + out[:, 3], law)


@pytest.mark.parametrize('case', list(STEP_CASES))
def test_one_step_draws_follow_the_closed_form(case):
  pval, tv = one_step_pvalue(*STEP_CASES[case])
  assert pval > P_MIN, f'{case}: χ² p = {pval:.3g}, TV = {tv:.4f}'


def _mutant(kind: str):
  """step_probs with one factor of the closed form wrong."""

  def step_probs(s, t, schedule, cfg):
    om_s = remdm_sampler.one_minus_alpha(s, schedule, cfg)
    om_t = remdm_sampler.one_minus_alpha(t, schedule, cfg)
    sig = remdm_sampler.sigma(s, t, schedule, cfg)
    a_s, a_t = 1.0 - om_s, 1.0 - om_t
    fill = (a_s - (1.0 - sig) * a_t) / om_t
    if kind == 'sigma_for_one_minus_sigma':
      fill = (a_s - sig * a_t) / om_t
    elif kind == 'no_renormalisation':
      fill = a_s - (1.0 - sig) * a_t
    elif kind == 'keep_with_sigma':
      sig = 1.0 - sig
    return sig, jnp.clip(fill, 0.0, 1.0)

  return step_probs


MUTANTS = ('sigma_for_one_minus_sigma', 'no_renormalisation', 'keep_with_sigma')


@pytest.mark.parametrize('kind', MUTANTS)
def test_mutated_step_fails_the_one_step_check(kind, monkeypatch):
  # The unmutated step passes this check: STEP_CASES holds ('cap', 4, 3).
  monkeypatch.setattr(remdm_sampler, 'step_probs', _mutant(kind))
  pval, tv = one_step_pvalue('cap', 4, 3)
  assert pval < P_MIN, f'{kind}: χ² p = {pval:.3g}, TV = {tv:.4f}'


# ---------------------------------------------------------------------------------------------
# η = 0 is the locked-in sampler; the T-step law.


@pytest.mark.parametrize('which', ['mdlm', pytest.param('adlm', marks=pytest.mark.slow)])
def test_eta_zero_draws_the_locked_in_samples(which):
  schedule = Schedule('loglinear', (0.0,))  # ε = 1e-3 as the configs
  proc = _mdlm(schedule) if which == 'mdlm' else adlm.make(schedule, mask_id=MASK)
  apply_fn, _ = sh.table_model(2, V + 1, seq_len=3, num_levels=1)
  given = np.zeros((256, 3), bool)
  given[::3, 1] = True
  kw = dict(batch_size=256, seq_len=3, given_tokens=np.full((256, 3), 2, np.int32),
            given_mask=given)
  tempered = dict(temperature=0.8, top_p=0.9)
  for use_cache, name, extra in ((True, 'cap', {}), (False, 'rescale', tempered),
                                 (True, 'rescale', tempered)):
    mdlm_cfg = sh.sample_cfg(num_steps=7, num_levels=1, mask_id=MASK, use_cache=use_cache,
                             **extra)
    cfg = _cfg(7, use_cache=use_cache, remdm_schedule=name, remdm_eta=0.0, **extra)
    run = lambda c: jax.tree.map(np.asarray, jax.jit(
        lambda k: proc.sample(apply_fn, k, c, **kw))(jax.random.key(5)))
    ref, got = run(mdlm_cfg), run(cfg)
    for field in ('tokens', 'levels', 'reveal_step', 'nfe'):
      np.testing.assert_array_equal(getattr(got, field), getattr(ref, field),
                                    err_msg=f'{which} {name} cache={use_cache} {extra}: {field}')
    assert np.all(got.tokens < V)
    assert int(got.nfe) == (int(np.unique(ref.reveal_step[ref.reveal_step <= 7]).size)
                            if use_cache else 7)


def draw(proc, apply_fn, cfg, seed: int = 0) -> np.ndarray:
  """NUM sequences of L = 2 from the jitted sampler (a fresh trace: patched functions count), as
  indices into [V^L]."""
  run = jax.jit(lambda k: proc.sample(apply_fn, k, cfg, batch_size=NUM, seq_len=2),
                compiler_options=OPTIMISED)
  tokens = np.asarray(run(jax.random.key(seed)).tokens)
  assert tokens.max() < V, 'the sampler left MASK in its output'
  return tokens[:, 0] * V + tokens[:, 1]


KSTEP_CASES = {'cap-T4': ('cap', 4, False), 'rescale-T4': ('rescale', 4, False),
               'loop-T5': ('loop', 5, False), 'loop-T5-cache': ('loop', 5, True)}


@pytest.mark.parametrize('case', list(KSTEP_CASES))
def test_kstep_law_matches_the_enumeration(case):
  """The cached case too: a call skipped when nothing is filled never serves a changed state."""
  name, steps, cache = KSTEP_CASES[case]
  apply_fn, reference = sh.table_model(1, V + 1, seq_len=2, num_levels=1)
  law = np_kstep_law(reference, steps, SCHEDULES[name])
  cfg = _cfg(steps, use_cache=cache, **SCHEDULES[name])
  pval, tv = sh.chi2_pvalue(draw(_mdlm(), apply_fn, cfg), law)
  assert pval > P_MIN, f'{case}: χ² p = {pval:.3g}, TV = {tv:.4f}'
  # The check has power: the locked-in law of the same denoiser is another law.
  locked = np_kstep_law(reference, steps, dict(SCHEDULES[name], remdm_eta=0.0))
  assert 0.5 * np.abs(locked - law).sum() > 0.02


# ---------------------------------------------------------------------------------------------
# The loop's middle phase is stationary at α_on.


def _decoded_fractions(cfg, steps: int, seq_len: int = 8, batch: int = 4000) -> np.ndarray:
  """Mean decoded fraction after each step n = T..1 of the sampler (a fixed denoiser)."""
  logits = np.random.default_rng(0).normal(size=(batch, seq_len, V + 1))
  model = sh.const_model(None, logits)
  proc = _mdlm()
  state = proc.sampler_init(model, cfg, batch_size=batch, seq_len=seq_len)
  step = jax.jit(lambda st, n: proc.reverse_step(model, cfg, jax.random.key(7), st, n))
  out = []
  for n in range(steps, 0, -1):
    state = step(state, jnp.int32(n))
    out.append(float(np.mean(np.asarray(state.tokens) != MASK)))
  return np.asarray(out)


def test_loop_phase_keeps_the_decoded_fraction_at_alpha_on():
  kw, steps = dict(LOOP, remdm_eta=0.1, remdm_t_on=0.55, remdm_t_off=0.05), 20
  cfg = _cfg(steps, **kw)
  a_on, expect, p = kw['remdm_alpha_on'], [], 0.0
  for n in range(steps, 0, -1):
    s, t = (n - 1) / steps, n / steps
    sig, fill = (float(v) for v in remdm_sampler.step_probs(jnp.float32(s), jnp.float32(t),
                                                            EXACT, cfg))
    if kw['remdm_t_off'] < s and t <= kw['remdm_t_on']:  # inside the loop: exactly stationary
      assert abs(a_on * (1.0 - sig) + (1.0 - a_on) * fill - a_on) < 1e-6
    p = p * (1.0 - sig) + (1.0 - p) * fill  # exact expectation of the decoded fraction
    expect.append(p)
  expect = np.asarray(expect)
  inside = [i for i, n in enumerate(range(steps, 0, -1)) if 0.05 <= (n - 1) / steps <= 0.55]
  np.testing.assert_allclose(expect[inside], a_on, atol=1e-6)
  assert expect[-1] == pytest.approx(1.0)
  got = _decoded_fractions(cfg, steps)
  for i in range(steps):
    sh.assert_fraction(got[i], expect[i], 4000 * 8, f'decoded fraction after step {steps - i}')


def test_mutated_loop_is_not_stationary(monkeypatch):
  kw, steps = dict(LOOP, remdm_eta=0.1, remdm_t_on=0.55, remdm_t_off=0.05), 20
  monkeypatch.setattr(remdm_sampler, 'step_probs', _mutant('sigma_for_one_minus_sigma'))
  got = _decoded_fractions(_cfg(steps, **kw), steps)
  assert abs(got[12] - kw['remdm_alpha_on']) > 0.1  # n = 8: s = 0.35, inside the loop


# ---------------------------------------------------------------------------------------------
# Configuration and the entry point.


@pytest.mark.parametrize('field,value', [
    ('sample.remdm_schedule', 'step'), ('sample.remdm_eta', 1.5), ('sample.remdm_eta', 0.5),
    ('sample.remdm_t_off', 0.6), ('sample.remdm_t_on', 1.0), ('sample.remdm_alpha_on', 1.0)])
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    resolved(adlm_text.get_config(), **{'sample.ordering': 'remdm', field: value})


@pytest.mark.parametrize('module', [text, hdlm_text, multimdm_text, sudoku_mgdm])
def test_other_processes_and_levels_are_refused(module):
  config = resolved(module.get_config(), **{'sample.ordering': 'remdm'})
  match = 'model.num_levels=1' if config.process.kind == 'hmdlm' else "sample.ordering='remdm'"
  with pytest.raises(ValueError, match=match):
    processes.build(config)


def test_adlm_owt_remdm_option_is_the_papers_sampler():
  from hmdlm_jax.configs import adlm_owt  # pylint: disable=g-import-not-at-top
  sm = adlm_owt.get_config('remdm').sample
  assert (sm.ordering, sm.remdm_schedule, sm.remdm_eta, sm.remdm_t_on, sm.remdm_t_off,
          sm.remdm_alpha_on, sm.top_p) == ('remdm', 'loop', 0.02, 0.55, 0.05, 0.9, 0.9)
  assert adlm_owt.get_config().sample.ordering == 'ancestral'


@pytest.mark.slow  # two runs of the entry point (train, sample): about 45 s on 2 CPU cores
def test_adlm_text_samples_with_remdm_through_main(tmp_path, jax_cache):
  """configs/adlm_text.py, shrunk: 2 training steps, then --mode=sample with the loop sampler and
  `hmdlm_jax.load(DIR).with_sampling(ordering='remdm')`; a bad remdm field ends the run with one
  error line naming it."""
  from tests import test_trained  # pylint: disable=g-import-not-at-top
  with open(test_trained.ASSET, encoding='utf-8') as f:
    lines = [line.strip() for line in f if line.strip()]
  (tmp_path / 'train.txt').write_text('\n'.join(lines[160:200]) + '\n', encoding='utf-8')
  (tmp_path / 'test.txt').write_text('\n'.join(lines[:6]) + '\n', encoding='utf-8')
  workdir = str(tmp_path / 'run')
  common = ('--config=configs/adlm_text.py', f'--workdir={workdir}', *test_trained.TINY,
            '--config.train.num_steps=2', '--config.train.ckpt_every=2',
            f'--config.data.train_path={tmp_path / "train.txt"}',
            f'--config.data.test_path={tmp_path / "test.txt"}')
  for mode, ordering in (('train', 'ancestral'), ('sample', 'remdm')):
    proc = run_cmd(test_trained._main(  # pylint: disable=protected-access
        *common, f'--mode={mode}', f'--config.sample.ordering={ordering}',
        '--config.sample.num_samples=2'), jax_cache, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
  found = [os.path.join(r, f) for r, _, fs in os.walk(workdir) for f in fs
           if f.startswith('samples') and f.endswith('.jsonl')]
  assert found, sorted(os.listdir(workdir))
  with open(found[0], encoding='utf-8') as f:
    rows = [json.loads(line) for line in f if line.strip()]
  assert len(rows) == 2 and all(min(r['reveal_step']) >= 1 for r in rows)
  # From Python: the recorded run (sampled 'ancestral') drawn by the remasking sampler.
  model = hmdlm_jax.load(workdir).with_sampling(ordering='remdm', remdm_schedule='cap',
                                                 remdm_eta=0.2, num_steps=4)
  assert model.config.sample.ordering == 'remdm'
  got = model.sample(2, seed=1)
  assert len(got.texts) == 2 and np.all(got.reveal_step >= 1)
  proc = run_cmd(test_trained._main(  # pylint: disable=protected-access
      *common, '--mode=sample', '--config.sample.ordering=remdm',
      '--config.sample.remdm_eta=0.5'), jax_cache, timeout=120)
  lines = [line for line in proc.stderr.splitlines() if line.startswith('hmdlm_jax: error:')]
  assert proc.returncode != 0 and len(lines) == 1 and 'sample.remdm_eta' in lines[0], proc.stderr
