"""Input pipelines (docs/design.md, Data): `get_dataset` dispatches on `config.data.kind`.

'sudoku' is registered by `pipeline.py`; other kinds register from their own modules with
`@register(kind)` and are imported lazily (see `pipeline._LAZY_MODULES` / `register_lazy`).
"""

from __future__ import annotations

from hmdlm_jax.data.pipeline import (
    get_dataset,
    local_batch_size,
    register,
    register_lazy,
    registered_kinds,
)

__all__ = ['get_dataset', 'local_batch_size', 'register', 'register_lazy', 'registered_kinds']
