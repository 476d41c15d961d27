"""`--config=DIR`: the experiment a run directory recorded (DIR/config.json), as an experiment file.

`config/loading.py` reads `--config=DIR` (or `--config=DIR/config.json`, local or gs://) as this
file with DIR's config.json as its argument, so overrides, `resolve` and every check apply as to
a configs/*.py file. The record is the resolved config training started with (hmdlm_jax/workdir.py);
resolving it again gives the same `Config` (tests/test_config_schema.py checks every shipped one).
"""

from __future__ import annotations

import json

import ml_collections

from hmdlm_jax import storage
from hmdlm_jax.config import schema


def get_config(path: str) -> ml_collections.ConfigDict:
  """The ConfigDict of the run config recorded at `path` (a config.json), fields under today's
  names (`schema.from_record`)."""
  return ml_collections.ConfigDict(schema.to_dict(schema.from_record(
      json.loads(storage.read_text(path)))))
