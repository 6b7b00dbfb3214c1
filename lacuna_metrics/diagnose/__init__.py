"""Representation diagnostics: PCA, CKA and Fisher shifts between a model and its unlearned twin."""
