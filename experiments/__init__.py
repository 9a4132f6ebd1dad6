"""Experiment scripts and the README tables they write; `experiments.common` holds their shared helpers."""
