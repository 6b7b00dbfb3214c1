"""Behaviour measured directly on a model and over persons: generation probes, forgetting regimes, intervals."""
