"""Evaluation machinery shared by every task (docs/design.md, Evaluation).

compiled.py (a network and its compiled programs), batches.py (fixed-shape batches and padding),
perplexity.py (the bound over a split), samples.py (rows from the reverse process), generative.py
(entropy, gen PPL, MAUVE), unigram.py (the unigram baseline), reports.py (seed statistics, flat
scalars, JSON files) and run.py (the entry points of main.py). The tasks (hmdlm_jax/tasks) use
the leaf modules; run.py uses the tasks.
"""
