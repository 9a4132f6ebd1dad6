"""Experiment scripts and the README tables they write, each run from the repository root as a module
(`python -m experiments.NAME.run`); `experiments.common` holds what they share."""
