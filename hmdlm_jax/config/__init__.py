"""The experiment config: loaded once, resolved once into a typed, frozen tree (docs/design.md).

`load(spec, overrides)` reads a configs/*.py file with `--config.a.b=value` overrides;
`resolve(config_dict)` derives and validates it into a `Config`, which every module below the
entry point reads. The schema, with the only defaults, is hmdlm_jax/config/schema.py.
"""

from hmdlm_jax.config.adlm import ADLMConfig
from hmdlm_jax.config.derive import resolve
from hmdlm_jax.config.hdlm import HDLMConfig
from hmdlm_jax.config.hdlm import hdlm_cluster_rows
from hmdlm_jax.config.kinds import appended_rows
from hmdlm_jax.config.kinds import noise_ids
from hmdlm_jax.config.kinds import num_noise_rows
from hmdlm_jax.config.kinds import steps_per_round
from hmdlm_jax.config.loading import load
from hmdlm_jax.config.mgdm import MGDMConfig
from hmdlm_jax.config.multimdm import MultiMDMConfig
from hmdlm_jax.config.schema import BACKBONES
from hmdlm_jax.config.schema import COMPUTE_DTYPES
from hmdlm_jax.config.schema import Config
from hmdlm_jax.config.schema import ModelConfig
from hmdlm_jax.config.schema import SUDOKU_CELLS
from hmdlm_jax.config.schema import VARIANTS
from hmdlm_jax.config.schema import defaults
from hmdlm_jax.config.schema import from_record
from hmdlm_jax.config.schema import to_dict
from hmdlm_jax.config.views import LossConfig
from hmdlm_jax.config.views import SampleConfig
from hmdlm_jax.config.views import hdlm_config
