"""Forward processes behind one interface (processes/base.py); this registry is the only place that
branches on `config.process.kind` (docs/extending.md; tests/test_layout.py checks it).

  process = processes.build(config)
  loss, metrics = process.loss(apply_fn, batch, key)

'mdlm' is HMDLM with one level (docs/method.md §12), reachable by name; 'hmdlm' with
`model.num_levels=1` is the same process. 'hdlm' is the word -> cluster -> MASK process of
docs/method.md §13.1 (its one-cluster case is MDLM too). 'multimdm' is MultiMDM (§13.2); with
`process.multimdm.distill=True` its loss is consistency distillation (Algorithm 3) and
`process.uses_target` is True; `num_masks=1` is MDLM (with shared-Gumbel paths when distilled).
'adlm' is ADLM, MDLM on an anchor network + denoiser with the anchor term (docs/method.md §13.4);
`process.adlm.gamma=0` is MDLM's loss of that network. 'mgdm' is MDLM trained by MGDM's
token-reweighted loss, with its 'remask' decoding (§13.3).
"""

from __future__ import annotations

from typing import Callable


from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import adlm
from hmdlm_jax.processes import hdlm
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import mgdm
from hmdlm_jax.processes import multimdm_distill
from hmdlm_jax.processes import schedules
from hmdlm_jax.processes.base import Process


def _hmdlm(config: config_lib.Config) -> Process:
  schedule = schedules.schedule_from_config(config.schedule, config.model.num_levels)
  return hmdlm.HMDLM(schedule, config_lib.LossConfig.from_config(config),
                     check_ordering=config.schedule.check_ordering)


BUILDERS: dict[str, Callable[[config_lib.Config], Process]] = {
    'hmdlm': _hmdlm,
    'mdlm': _hmdlm,
    'hdlm': hdlm.from_config,
    'multimdm': multimdm_distill.build,
    'adlm': adlm.build,
    'mgdm': mgdm.from_config,
}


def build(config: config_lib.Config, *, check_sampling: bool = True) -> Process:
  """The process of a (resolved or not) experiment config, validated.

  With `check_sampling` the config's sampler settings are checked against the process too (e.g.
  Appendix D's ordering on the sampling grid; docs/method.md §2), so every train / eval / sample
  run validates them before it starts.
  """
  process = BUILDERS[config.process.kind](config)
  if check_sampling:
    process.check_sampling(config_lib.SampleConfig.from_config(config))
  return process


__all__ = ['BUILDERS', 'Process', 'build']
