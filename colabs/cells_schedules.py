"""Cells of schedules_explorer.ipynb (colabs/make_notebooks.py writes the notebook)."""

from __future__ import annotations

from cells_shared import IMPORTS, INSTALL, PARAMETERS, SETUP  # colabs/ is on sys.path

SCHEDULES = [
    ('md', '''\
# Per-level schedules and the reveal order they induce

α_k(t) is the probability that a level-k position is still revealed at time t (docs/method.md §2). Higher
levels are masked more slowly. Two families: log-linear with offsets δ_k (LM1B, Sudoku) and power
with exponents ω_k (WikiHow). This notebook builds schedules from config values, plots α_k and the
hazards λ'_k = −α'_k / (1 − α_k) (the loss weights), and checks Appendix D's ordering condition
λ_k ≤ λ_k' (k < k') on the sampling grid. No training: it runs in seconds anywhere.'''),
    ('parameters', PARAMETERS + '''
NUM_STEPS = 256  # T of the sampling grid t_n = n / T (LM1B / WikiHow use 256)'''),
    ('code', SETUP + '\n' + INSTALL),
    ('code', IMPORTS),
    ('code', '''\
import warnings

from hmdlm_jax.configs import base
from hmdlm_jax.processes import schedules


def schedule_of(kind: str, values, eps: float = 1e-3):
  """A schedule from config values, exactly as training builds it (schedule_from_config)."""
  cfg = base.get_base_config()
  cfg.schedule.kind = kind
  if kind == 'loglinear':
    cfg.schedule.offsets = tuple(values)
  else:
    cfg.schedule.exponents = tuple(values)
  cfg.schedule.eps = eps
  return schedules.schedule_from_config(cfg.schedule, len(values))


lm1b = schedule_of('loglinear', (0.0, 0.25))
wikihow = schedule_of('power', (1.0, 2.0))
mdlm = schedule_of('loglinear', (0.0,))
sudoku = schedule_of('loglinear', (0.0, 0.1, 0.2, 0.3, 0.4, 0.5))
for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('mdlm', mdlm), ('sudoku (tiny)', sudoku)]:
  print(f'{name:14s}', s)'''),
    ('md', '''\
## α_k(t) and the hazards

K = 1 with δ = 0 is MDLM's log-linear schedule: α(t) = 1 − (1 − ε) t and weight λ'(t) = 1/t.
The offset level is untouched until t = δ_1; its hazard 1/(t − δ_1) blows up just after δ_1.'''),
    ('code', '''\
t = np.linspace(0.0, 1.0, 11, dtype=np.float32)
np.testing.assert_allclose(np.asarray(mdlm.alpha(t))[:, 0], 1 - (1 - mdlm.eps) * t, rtol=1e-6)
np.testing.assert_allclose(np.asarray(mdlm.hazard(t[1:]))[:, 0], 1 / t[1:], rtol=1e-5)
np.testing.assert_allclose(np.asarray(lm1b.hazard(t[4:]))[:, 1], 1 / (t[4:] - 0.25), rtol=1e-4)
print('MDLM limit and offset hazard: closed forms match')

for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('sudoku', sudoku)]:
  png = PICTURES / f'schedules_{name}.png'
  visualize.plot_schedules(s, num_points=501, path=png)
  show(png)'''),
    ('md', '''\
How much of each level is masked during training? Averaged over t ~ U(0, 1), level k is masked
with probability (1 − ε)(1 − δ_k)/2 for the log-linear schedule (Appendix B): the offset level
sees 25% fewer masked positions.'''),
    ('code', '''\
grid = np.linspace(0.0, 1.0, 200_001)
mask_frac = np.mean(1.0 - np.asarray(lm1b.alpha(grid, np)), axis=0)  # numpy float64 path
closed = [(1 - lm1b.eps) * (1 - d) / 2 for d in lm1b.params]
print('mean mask fraction per level:', mask_frac.round(5), ' closed form:', np.round(closed, 5))
np.testing.assert_allclose(mask_frac, closed, atol=1e-5)'''),
    ('md', '''\
## Appendix D: the reveal order on the sampling grid

At step n the sampler reveals a masked level-k position with probability
λ_k(t_{n−1}, t_n) = (α_k(t_{n−1}) − α_k(t_n)) / (1 − α_k(t_n)). Appendix D asks λ_k ≤ λ_k' for
k < k' wherever level k' is still active. For the LM1B schedule with T = 256 the paper notes that
λ_0 > λ_1 only on the 64 steps with t ≤ δ_1, where level 1 is inactive (λ_1 = 0): not violations.'''),
    ('code', '''\
n = np.arange(1, NUM_STEPS + 1)
lam = np.asarray(lm1b.reveal_prob((n - 1) / NUM_STEPS, n / NUM_STEPS, np))
inactive = int(np.sum(lam[:, 0] > lam[:, 1]))
print(f'steps with λ_0 > λ_1: {inactive} (all with t_n <= δ_1: {bool(np.all(n[lam[:, 0] > lam[:, 1]] <= NUM_STEPS // 4))})')
for name, s in [('lm1b', lm1b), ('wikihow', wikihow), ('sudoku', sudoku)]:
  viol = schedules.check_ordering(s, NUM_STEPS, 'error')  # raises on a violation
  print(f'{name}: {len(viol)} violations')
png = PICTURES / 'ordering_lm1b.png'
visualize.plot_reveal_ordering(lm1b, NUM_STEPS, path=png)
show(png)'''),
    ('md', '''\
## A violating schedule

Exponents decreasing in the level (ω = (2, 1)) mask the *higher* level faster: the ordering fails at
every step but the last. `schedule_from_config` warns; the training and sampling entry points
refuse it unless `schedule.check_ordering` is 'warn' or 'off'.'''),
    ('code', '''\
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter('always')
  bad = schedule_of('power', (2.0, 1.0))
print('warning:', caught[0].message if caught else None)
try:
  schedules.check_ordering(bad, 16, 'error')
except ValueError as e:
  print('ValueError:', str(e)[:300], '...')
viol = schedules.ordering_violations(bad, 16)
print(len(viol), 'violating steps, e.g.', viol[0])
png = PICTURES / 'ordering_violation.png'
visualize.plot_reveal_ordering(bad, 16, path=png)
show(png)'''),
]
