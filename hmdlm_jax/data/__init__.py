"""Input pipelines (docs/design.md, Data): one Grain pipeline per data kind.

pipeline.py holds the helpers and split semantics they share; sudoku_pipeline.py, text.py, lm1b.py
and wikihow.py build the batches; the task registry (hmdlm_jax/tasks) picks one by
`config.data.kind`.
"""
