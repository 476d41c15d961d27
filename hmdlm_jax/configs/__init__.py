"""Experiment configs: one file per experiment, every field listed in configs/base.py."""
